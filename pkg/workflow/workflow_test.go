package workflow_test

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/workflow"
)

const validYAML = `# a deploy pipeline
name: deploy
description: build, announce and call home
steps:
  - id: build
    kind: exec
    queue: builders
    command: make
    args: [build, -j2]
    env:
      GOFLAGS: -mod=mod
    dir: /src
  - id: announce
    kind: log
    message: built
    level: info
  - id: wait
    kind: noop
  - id: notify
    kind: http
    method: post
    url: https://example.com/hook
    headers:
      Content-Type: application/json
    body:
      text: done
      count: 3
`

const validJSON = `{
  "name": "deploy",
  "description": "build, announce and call home",
  "steps": [
    {"id": "build", "kind": "exec", "queue": "builders", "command": "make",
     "args": ["build", "-j2"], "env": {"GOFLAGS": "-mod=mod"}, "dir": "/src"},
    {"id": "announce", "kind": "log", "message": "built", "level": "info"},
    {"id": "wait", "kind": "noop"},
    {"id": "notify", "kind": "http", "method": "post", "url": "https://example.com/hook",
     "headers": {"Content-Type": "application/json"}, "body": {"text": "done", "count": 3}}
  ]
}`

func TestParseValid(t *testing.T) {
	t.Parallel()

	fromYAML, err := workflow.Parse([]byte(validYAML))
	require.NoError(t, err)
	fromJSON, err := workflow.Parse([]byte(validJSON))
	require.NoError(t, err)
	require.Equal(t, fromYAML, fromJSON)

	require.Equal(t, "deploy", fromYAML.Name)
	require.Len(t, fromYAML.Steps, 4)
	require.Equal(t, []string{"build", "-j2"}, fromYAML.Steps[0].Args)
	require.Equal(t, "builders", fromYAML.Steps[0].QueueName())
	require.Equal(t, workflow.DefaultQueue, fromYAML.Steps[1].QueueName())
	require.Equal(t, "POST", fromYAML.Steps[3].HTTPMethod())

	refs := fromYAML.StepRefs()
	require.Len(t, refs, 4)
	require.Equal(t, "notify", refs[3].ID)
	require.Equal(t, workflow.KindHTTP, refs[3].Kind)

	st, ok := fromYAML.Step("announce")
	require.True(t, ok)
	require.Equal(t, "built", st.Message)
	_, ok = fromYAML.Step("missing")
	require.False(t, ok)

	require.NoError(t, fromYAML.Validate())

	dy, err := fromYAML.Digest()
	require.NoError(t, err)
	dj, err := fromJSON.Digest()
	require.NoError(t, err)
	require.Equal(t, dy, dj)
}

func TestParseErrors(t *testing.T) {
	t.Parallel()

	const head = "name: wf\nsteps:\n"
	tests := []struct {
		name  string
		input string
		field string // "" means the problem names no field
		line  int    // 0 means no position
		msg   string // substring of the problem's message
	}{
		{
			name:  "UnknownKind",
			input: head + "  - id: a\n    kind: noop\n  - id: b\n    kind: teleport\n",
			field: "steps[1].kind", line: 6, msg: `unknown step kind "teleport"`,
		},
		{
			name:  "MisspeltKind",
			input: head + "  - id: a\n    kind: htpp\n    url: http://x\n",
			field: "steps[0].kind", line: 4, msg: `unknown step kind "htpp" (did you mean "http"?) (known kinds: noop,`,
		},
		{
			name:  "KindWithUnderscore",
			input: head + "  - id: a\n    kind: clear_lock\n",
			field: "steps[0].kind", line: 4, msg: `unknown step kind "clear_lock" (did you mean "clear-lock"?)`,
		},
		{
			name:  "BadIdempotent",
			input: head + "  - id: a\n    kind: exec\n    command: x\n    idempotent: maybe\n",
			field: "steps[0].idempotent", line: 6, msg: "is not one of yes, no, default",
		},
		{
			name:  "IdempotentAllOnAStep",
			input: head + "  - id: a\n    kind: exec\n    command: x\n    idempotent: all\n",
			field: "steps[0].idempotent", line: 6, msg: "all applies to a workflow block",
		},
		{
			name:  "BadReplayable",
			input: head + "  - id: a\n    kind: noop\n    replayable: from there\n",
			field: "steps[0].replayable", line: 5, msg: "is not one of from here, from here only, reset",
		},
		{
			name:  "FromStartOnAStep",
			input: head + "  - id: a\n    kind: noop\n    replayable: from start\n",
			field: "steps[0].replayable", line: 5, msg: "is not one of from here",
		},
		{
			name:  "ReplayableStepWithoutValue",
			input: head + "  - id: a\n    kind: replayable\n",
			field: "steps[0].replayable", line: 3, msg: "is required for a replayable step",
		},
		{
			name:  "BadWorkflowReplayable",
			input: "name: wf\nreplayable: sometimes\nsteps:\n  - {id: a, kind: noop}\n",
			field: "replayable", line: 2, msg: "is not one of enabled, disabled, from start, automatically",
		},
		{
			name:  "BadWorkflowIdempotent",
			input: "name: wf\nidempotent: yes\nsteps:\n  - {id: a, kind: noop}\n",
			field: "idempotent", line: 2, msg: "a workflow says all",
		},
		{
			name:  "RetryNextUnknown",
			input: head + "  - id: a\n    kind: noop\n    on-error:\n      - {id: r, kind: retry, replay: true, next: nowhere, retry: {limit: 2}}\n",
			field: "steps[0].on-error[0].next", line: 6, msg: `"nowhere" is not last, end or the id of a step`,
		},
		{
			name:  "RetryNextLastWithoutReplay",
			input: head + "  - id: a\n    kind: noop\n    on-error:\n      - {id: r, kind: retry, next: last, retry: {limit: 2}}\n",
			field: "steps[0].on-error[0].next", line: 6, msg: "add replay: true",
		},
		{
			name:  "RetryReplayInMainSteps",
			input: head + "  - {id: a, kind: noop}\n  - {id: r, kind: retry, replay: true, retry: {limit: 2}}\n",
			field: "steps[1].kind", line: 4, msg: "with replay: true, in any on-error steps",
		},
		{
			name:  "RetentionDisabledWithLock",
			input: "name: wf\nlock: db\nretention: disabled\nsteps:\n  - {id: a, kind: noop}\n",
			field: "retention", line: 3, msg: "disabled cannot go with lock",
		},
		{
			name:  "ReplayOnANoop",
			input: head + "  - id: a\n    kind: noop\n    replay: true\n",
			field: "steps[0].replay", line: 5, msg: "does not apply to a noop step (only to retry)",
		},
		{
			name:  "TwoDocuments",
			input: head + "  - id: a\n    kind: noop\n---\nname: other\nsteps: []\n",
			field: "", line: 6, msg: "a file holds one workflow",
		},
		{
			name:  "MissingKind",
			input: head + "  - id: a\n",
			field: "steps[0].kind", line: 3, msg: "is required",
		},
		{
			name:  "MissingID",
			input: head + "  - id: a\n    kind: noop\n  - kind: noop\n",
			field: "steps[1].id", line: 5, msg: "is required",
		},
		{
			name:  "InvalidID",
			input: head + "  - id: 9lives\n    kind: noop\n",
			field: "steps[0].id", line: 3, msg: events.StepIDRule,
		},
		{
			name:  "DuplicateID",
			input: head + "  - id: a\n    kind: noop\n  - id: a\n    kind: noop\n",
			field: "steps[1].id", line: 5, msg: "already the id of steps[0]",
		},
		{
			name:  "UnknownStepField",
			input: head + "  - id: a\n    kind: noop\n    colour: red\n",
			field: "steps[0].colour", line: 5, msg: `unknown field "colour"`,
		},
		{
			name:  "UnknownFieldInLaterStep",
			input: head + "  - id: a\n    kind: noop\n  - id: b\n    kind: noop\n    to: x\n",
			field: "steps[1].to", line: 7, msg: `unknown field "to"`,
		},
		{
			name:  "UnknownTopLevelField",
			input: "name: wf\ncolor: 2\nsteps:\n  - id: a\n    kind: noop\n",
			field: "color", line: 2, msg: `unknown field "color"`,
		},
		{
			name:  "ExecWithoutCommand",
			input: head + "  - id: a\n    kind: noop\n  - id: run\n    kind: exec\n    args: [x]\n",
			field: "steps[1].command", line: 5, msg: "is required for an exec step",
		},
		{
			name:  "HTTPWithoutURL",
			input: head + "  - id: a\n    kind: http\n",
			field: "steps[0].url", line: 3, msg: "is required for an http step",
		},
		{
			name:  "HTTPWithBadScheme",
			input: head + "  - id: a\n    kind: http\n    url: ftp://example.com/x\n",
			field: "steps[0].url", line: 5, msg: "absolute http or https URL",
		},
		{
			name:  "HTTPWithRelativeURL",
			input: head + "  - id: a\n    kind: http\n    url: /hook\n",
			field: "steps[0].url", line: 5, msg: "absolute http or https URL",
		},
		{
			name:  "HTTPWithUnparsableURL",
			input: head + "  - id: a\n    kind: http\n    url: \"http://[::1\"\n",
			field: "steps[0].url", line: 5, msg: "absolute http or https URL",
		},
		{
			name:  "HTTPWithBadMethod",
			input: head + "  - id: a\n    kind: http\n    method: \"GE T\"\n    url: https://x.test\n",
			field: "steps[0].method", line: 5, msg: "is not an HTTP method",
		},
		{
			name:  "HTTPWithBadHeaderName",
			input: head + "  - id: a\n    kind: http\n    url: https://x.test\n    headers:\n      \"bad name\": v\n",
			field: "steps[0].headers", line: 7, msg: "is not a valid header name",
		},
		{
			name:  "HTTPBodyNotJSON", // Canonical (and so Digest) cannot encode NaN
			input: head + "  - id: a\n    kind: http\n    url: https://x.test\n    body: {ratio: .nan}\n",
			field: "steps[0].body", line: 6, msg: "cannot be encoded as JSON",
		},
		{
			name:  "CommandOnNoop",
			input: head + "  - id: a\n    kind: noop\n    command: ls\n",
			field: "steps[0].command", line: 5, msg: "does not apply to a noop step (only to exec)",
		},
		{
			name:  "URLOnExec",
			input: head + "  - id: a\n    kind: exec\n    command: ls\n    url: https://x.test\n",
			field: "steps[0].url", line: 6, msg: "does not apply to an exec step (only to http)",
		},
		{
			name:  "MessageOnHTTP",
			input: head + "  - id: a\n    kind: http\n    url: https://x.test\n    message: hi\n",
			field: "steps[0].message", line: 6, msg: "does not apply to an http step (only to log, fail)",
		},
		{
			name:  "LogWithoutMessage",
			input: head + "  - id: a\n    kind: log\n",
			field: "steps[0].message", line: 3, msg: "is required for a log step",
		},
		{
			name:  "LogWithBadLevel",
			input: head + "  - id: a\n    kind: log\n    message: hi\n    level: loud\n",
			field: "steps[0].level", line: 6, msg: `"loud" is not one of`,
		},
		{
			name:  "BadQueue",
			input: head + "  - id: a\n    kind: noop\n    queue: a.b\n",
			field: "steps[0].queue", line: 5, msg: events.QueueNameRule,
		},
		{
			name:  "MissingName",
			input: "steps:\n  - id: a\n    kind: noop\n",
			field: "name", line: 0, msg: "is required",
		},
		{
			name:  "InvalidName",
			input: "name: my.flow\nsteps:\n  - id: a\n    kind: noop\n",
			field: "name", line: 1, msg: events.WorkflowNameRule,
		},
		{
			name:  "NoSteps",
			input: "name: wf\nsteps: []\n",
			field: "steps", line: 2, msg: "at least one step",
		},
		{
			name:  "StepsNotASequence",
			input: "name: wf\nsteps: {}\n",
			line:  2, field: "steps", msg: "must be a list, not a mapping (key: value lines)",
		},
		{
			name:  "DocumentNotAMapping",
			input: "- a\n- b\n",
			line:  1, msg: "the definition must be a mapping (key: value lines), not a list",
		},
		{
			name:  "DuplicateKey",
			input: "name: a\nsteps:\n  - id: x\n    kind: noop\nname: b\n",
			line:  5, msg: `mapping key "name" already defined`,
		},
		{
			name:  "InvalidYAMLSyntax",
			input: "name: wf\nsteps: [a\n",
			line:  2, msg: "']' not found",
		},
		{
			name:  "TagWithoutValue", // go-yaml v1.19.2 panics while decoding this
			input: "name: wf\nsteps: !t\n",
			msg:   "cannot decode definition",
		},
		{
			name:  "Empty",
			input: "",
			msg:   "definition is empty",
		},
		{
			name:  "Whitespace",
			input: " \n\t\n",
			msg:   "definition is empty",
		},
		{
			name:  "OnlyComments",
			input: "# nothing here\n# yet\n",
			msg:   "definition is empty",
		},
		{
			name:  "OnlyDocumentMarker",
			input: "---\n",
			msg:   "definition is empty",
		},
		{
			name:  "Oversize",
			input: "name: wf\n#" + strings.Repeat("x", workflow.MaxSize),
			msg:   "the limit is 262144",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			_, err := workflow.Parse([]byte(tt.input))
			require.Error(t, err)
			require.ErrorIs(t, err, workflow.ErrInvalid)
			var ve *workflow.ValidationError
			require.ErrorAs(t, err, &ve)
			require.NotEmpty(t, ve.Problems)

			var found *workflow.FieldError
			for i, p := range ve.Problems {
				if p.Field == tt.field && strings.Contains(p.Message, tt.msg) {
					found = &ve.Problems[i]
					break
				}
			}
			require.NotNil(t, found, "no problem with field %q and message %q in %v", tt.field, tt.msg, ve.Problems)
			require.Equal(t, tt.line, found.Line, "line of %v", *found)
			if tt.line > 0 {
				require.Positive(t, found.Column)
				require.Contains(t, err.Error(), "line ")
			}
			if tt.field != "" {
				require.Contains(t, err.Error(), "field "+tt.field)
			}
		})
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	t.Parallel()

	input := "name: wf\nsteps:\n  - id: a\n    kind: exec\n  - id: a\n    kind: warp\n  - kind: http\n    url: nope\n"
	_, err := workflow.Parse([]byte(input))
	var ve *workflow.ValidationError
	require.ErrorAs(t, err, &ve)

	got := map[string]int{}
	for _, p := range ve.Problems {
		got[p.Field] = p.Line
	}
	require.Equal(t, map[string]int{
		"steps[0].command": 3,
		"steps[1].id":      5,
		"steps[1].kind":    6,
		"steps[2].id":      7,
		"steps[2].url":     8,
	}, got)
}

func TestValidateWithoutText(t *testing.T) {
	t.Parallel()

	err := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "a", Kind: workflow.KindExec}}}.Validate()
	var ve *workflow.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Len(t, ve.Problems, 1)
	require.Equal(t, "steps[0].command", ve.Problems[0].Field)
	require.Zero(t, ve.Problems[0].Line)
	require.Equal(t, "invalid workflow: field steps[0].command: is required for an exec step", err.Error())

	err = workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "a", Kind: workflow.KindHTTP,
		URL: "https://x.test", Body: map[string]any{"ratio": math.Inf(1)}}}}.Validate()
	require.ErrorAs(t, err, &ve)
	require.Equal(t, "steps[0].body", ve.Problems[0].Field)
}

func TestDigest(t *testing.T) {
	t.Parallel()

	base, err := workflow.Parse([]byte(validYAML))
	require.NoError(t, err)
	d0, err := base.Digest()
	require.NoError(t, err)
	require.Len(t, d0, 64)

	t.Run("SameContentDifferentFormatting", func(t *testing.T) {
		t.Parallel()

		reformatted := strings.ReplaceAll(validYAML, "# a deploy pipeline\n", "") + "\n# trailing comment\n"
		other, err := workflow.Parse([]byte(reformatted))
		require.NoError(t, err)
		d, err := other.Digest()
		require.NoError(t, err)
		require.Equal(t, d0, d)
	})

	t.Run("ChangedContent", func(t *testing.T) {
		t.Parallel()

		for _, change := range []struct{ from, to string }{
			{"message: built", "message: built!"},
			{"args: [build, -j2]", "args: [-j2, build]"},
			{"count: 3", "count: 4"},
			{"description: build, announce and call home", "description: other"},
		} {
			changed := strings.Replace(validYAML, change.from, change.to, 1)
			require.NotEqual(t, validYAML, changed)
			def, err := workflow.Parse([]byte(changed))
			require.NoError(t, err)
			d, err := def.Digest()
			require.NoError(t, err)
			require.NotEqual(t, d0, d, "change %q -> %q kept the digest", change.from, change.to)
		}
	})

	t.Run("Deterministic", func(t *testing.T) {
		t.Parallel()

		for range 20 {
			d, err := base.Digest()
			require.NoError(t, err)
			require.Equal(t, d0, d)
		}
	})
}

func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		validYAML, validJSON, "", "---\n", "# c\n", "null", "- a\n", "name: [a\n", "*a", "&a [*a]",
		"name: wf\nsteps:\n  - id: a\n    kind: http\n    url: \"http://[::1\"\n",
		"name: wf\nsteps:\n  - id: a\n    kind: noop\n    colour: red\n",
		"name: wf\nsteps:\n  - id: a\n    kind: noop\n---\nname: b\n",
		"steps: !t\n", "steps:\n  - args: !0\n0:\n",
		"name: wf\nsteps:\n  - id: a\n    kind: http\n    url: http://x\n    body: [.inf, !!binary aGk=, 2026-01-01]\n",
	} {
		f.Add([]byte(seed))
	}
	for _, tc := range validationCases {
		f.Add([]byte(tc.input))
	}
	for _, tc := range schemaErrorCases {
		f.Add([]byte(schemaDefinition(tc.schema)))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		def, err := workflow.Parse(data)
		if err == nil {
			require.NoError(t, def.Validate())
			_, err := def.Digest()
			require.NoError(t, err)
			return
		}
		var ve *workflow.ValidationError
		require.True(t, errors.As(err, &ve), "error %T is not a *workflow.ValidationError: %v", err, err)
		require.NotEmpty(t, ve.Problems)
		for _, p := range ve.Problems {
			require.NotEmpty(t, p.Message, "problem %+v has no message", p)
		}
		require.NotEmpty(t, err.Error())
	})
}
