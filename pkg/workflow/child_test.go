package workflow_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/workflow"
)

func TestParseChildSteps(t *testing.T) {
	t.Parallel()

	d, err := workflow.Parse([]byte("name: wf\nsteps:\n  - id: s\n    kind: workflow\n    workflow: shipping\n    child: true\n    on_parent_end: abandon\n"))
	require.NoError(t, err)
	require.True(t, d.Steps[0].Child)
	require.Equal(t, workflow.OnParentEndAbandon, d.Steps[0].OnParentEnd)

	call := "name: wf\nsteps:\n  - id: s\n    kind: workflow\n"
	tests := []struct {
		name, input, field, msg string
	}{
		{"ChildOfABlock", call + "    child: true\n    steps:\n      - {id: a, kind: noop}\n", "steps[0].child", "a block of steps runs inline: child applies to a workflow called by name"},
		{"PolicyOfABlock", call + "    on_parent_end: cancel\n    steps:\n      - {id: a, kind: noop}\n", "steps[0].on_parent_end", "a block of steps runs inline: on_parent_end applies"},
		{"PolicyWithoutChild", call + "    workflow: shipping\n    on_parent_end: cancel\n", "steps[0].on_parent_end", "give child: true too"},
		{"UnknownPolicy", call + "    workflow: shipping\n    child: true\n    on_parent_end: detach\n", "steps[0].on_parent_end", `"detach" is not a policy: use cancel (the default) or abandon`},
		{"ChildWithoutWorkflow", call + "    child: true\n", "steps[0].workflow", "is required with child: the name of the workflow to run as a child execution"},
		{"ChildWithRetention", call + "    workflow: shipping\n    child: true\n    retention: 7d\n", "steps[0].retention", "a child execution keeps the retention of the workflow it runs"},
		{"ChildOnAnOperation", "name: wf\nsteps:\n  - id: a\n    kind: noop\n    child: true\n", "steps[0].child", "does not apply to a noop step (only to workflow)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			requireProblem(t, tc.input, tc.field, tc.msg)
		})
	}
}

// requireProblem parses input and requires a problem naming field, on
// its line, whose message holds msg.
func requireProblem(t *testing.T, input, field, msg string) {
	t.Helper()
	_, err := workflow.Parse([]byte(input))
	var ve *workflow.ValidationError
	require.True(t, errors.As(err, &ve), "%v", err)
	found := false
	for _, p := range ve.Problems {
		if p.Field == field {
			require.Contains(t, p.Message, msg)
			require.NotZero(t, p.Line, "the problem names its line")
			found = true
		}
	}
	require.True(t, found, "no problem names %s: %v", field, ve.Problems)
}

// TestUnknownFieldsHintAtTheSpelling: a field spelled with '-' for '_'
// (or the other way round), or one letter off a known field's spelling,
// names the field it was meant to be, among the fields of what holds it
// (a step, the definition); one near no field, or in a mapping of other
// fields (a switch case, a retry), names none.
func TestUnknownFieldsHintAtTheSpelling(t *testing.T) {
	t.Parallel()
	for input, want := range map[string]string{
		"name: wf\nsteps:\n  - id: s\n    kind: workflow\n    workflow: x\n    child: true\n    on-parent-end: abandon\n":    `unknown field "on-parent-end" (did you mean "on_parent_end"?)`,
		"name: wf\nsteps:\n  - id: s\n    kind: noop\n    on_error:\n      - {id: a, kind: noop}\n":                          `unknown field "on_error" (did you mean "on-error"?)`,
		"name: wf\nsteps:\n  - {id: s, kind: log, mesage: hi}\n":                                                             `unknown field "mesage" (did you mean "message"?)`,
		"name: wf\nsteps:\n  - {id: s, kind: exec, comand: ls}\n":                                                            `unknown field "comand" (did you mean "command"?)`,
		"name: wf\nsteps:\n  - {id: s, kind: noop, timout: 1s}\n":                                                            `unknown field "timout" (did you mean "timeout"?)`,
		"name: wf\nsteps:\n  - {id: s, kind: noop, colour: red}\n":                                                           `unknown field "colour"`,
		"namme: wf\nsteps:\n  - {id: s, kind: noop}\n":                                                                       `unknown field "namme" (did you mean "name"?)`,
		"name: wf\nsteps:\n  - {id: b, kind: workflow, steps: [{id: a, kind: log, mesage: hi}]}\n":                           `unknown field "mesage" (did you mean "message"?)`,
		"name: wf\nsteps:\n  - {id: a, kind: exec, command: x, on-error: [{id: n, kind: log, mesage: hi}]}\n":                `unknown field "mesage" (did you mean "message"?)`,
		"name: wf\nsteps:\n  - id: s\n    kind: switch\n    cases:\n      - case: x\n        steps: [{id: a, kind: noop}]\n": `unknown field "case"`,
		"name: wf\nsteps:\n  - {id: s, kind: noop, retry: {limt: 3}}\n":                                                      `unknown field "limt"`,
		"name: wf\nsteps:\n  - id: s\n    kind: noop\n    colour: red\n":                                                     `unknown field "colour"`,
	} {
		_, err := workflow.Parse([]byte(input))
		var ve *workflow.ValidationError
		require.True(t, errors.As(err, &ve), "%v", err)
		require.Equal(t, want, ve.Problems[0].Message)
	}
}
