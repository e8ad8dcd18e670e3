package startcheck_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/startcheck"
	"jetflow.dev/pkg/workflow"
)

var now = time.Date(2026, 3, 14, 10, 0, 0, 0, time.UTC)

// command is a start command as the dispatcher decodes one from NATS (and
// the api from a CloudEvent): the data as received, and the payload read
// from it without refusing unknown members.
func command(t testing.TB, data string) events.Event {
	t.Helper()
	var cmd events.StartExecution
	if err := json.Unmarshal([]byte(data), &cmd); err != nil {
		t.Fatalf("decode %s: %v", data, err)
	}
	return events.Event{ID: "c1", Source: "urn:test", Type: events.TypeStartExecution, Time: now, Data: &cmd, Raw: json.RawMessage(data)}
}

// definition parses a definition registered as version 3.
func definition(t testing.TB, yaml string) *startcheck.Definition {
	t.Helper()
	d, err := workflow.Parse([]byte(yaml))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return &startcheck.Definition{Name: d.Name, Version: 3, Spec: d}
}

const typed = `name: typed
input:
  type: object
  required: [count]
  properties:
    count: {type: integer, minimum: 1}
    name: {type: string, maxLength: 3}
steps:
  - {id: a, kind: noop}
  - {id: b, kind: log, message: hi}
`

func options() startcheck.Options { return startcheck.Options{MaxPayload: 1 << 20, Now: now} }

// problem is what a case expects Check to refuse a start with.
type problem struct {
	code, field, message string
}

// TestCheckProblems: every rule, with the exact field and message the api
// answers with and the dispatcher rejects with.
func TestCheckProblems(t *testing.T) {
	t.Parallel()
	def := definition(t, typed)
	derived := events.DerivedExecutionID("urn:test#c1")
	for _, c := range []struct {
		name string
		data string
		def  *startcheck.Definition // nil: not registered
		want problem
	}{
		{"UnknownMember", `{"workflow":"typed","inptu":{}}`, def,
			problem{events.CodeInvalid, "inptu", `data: unknown member "inptu"`}},
		{"IDInsteadOfExecutionID", `{"workflow":"typed","id":"x-1"}`, def,
			problem{events.CodeInvalid, "id", `data: unknown member "id"; in a CloudEvent's data the execution id is "execution_id"`}},
		{"UnknownMemberBeforeAnythingElse", `{"workflow":"","extra":1}`, nil,
			problem{events.CodeInvalid, "extra", `data: unknown member "extra"`}},
		{"NoWorkflow", `{"input":{"count":1}}`, nil,
			problem{events.CodeInvalid, "workflow", "workflow is required"}},
		{"EmptyWorkflow", `{"workflow":""}`, def,
			problem{events.CodeInvalid, "workflow", "workflow is required"}},
		{"BadWorkflowName", `{"workflow":"no spaces"}`, nil,
			problem{events.CodeInvalid, "workflow", `workflow "no spaces" is not a valid workflow name: ` + events.WorkflowNameRule}},
		{"NegativeVersion", `{"workflow":"typed","version":-1}`, def,
			problem{events.CodeInvalid, "version", "version must be 0 (latest) or a positive version"}},
		{"BadExecutionID", `{"workflow":"typed","execution_id":"no spaces allowed"}`, def,
			problem{events.CodeInvalid, "execution_id", `execution_id "no spaces allowed" is not a valid execution id: ` + events.ExecutionIDRule}},
		{"ExecutionIDWithDot", `{"workflow":"typed","execution_id":"a.b"}`, def,
			problem{events.CodeInvalid, "execution_id", `execution_id "a.b" is not a valid execution id: ` + events.ExecutionIDRule}},
		{"ExecutionIDTooLong", `{"workflow":"typed","execution_id":"` + strings.Repeat("x", 129) + `"}`, def,
			problem{events.CodeInvalid, "execution_id", `execution_id "` + strings.Repeat("x", 129) + `" is not a valid execution id: ` + events.ExecutionIDRule}},
		{"InputArray", `{"workflow":"typed","input":[1,2]}`, def,
			problem{events.CodeInvalid, "input", "input must be a JSON object"}},
		{"InputString", `{"workflow":"typed","input":"count"}`, def,
			problem{events.CodeInvalid, "input", "input must be a JSON object"}},
		{"InputNumber", `{"workflow":"typed","input":3}`, def,
			problem{events.CodeInvalid, "input", "input must be a JSON object"}},
		{"InvalidBeforeUnregistered", `{"workflow":"typed","execution_id":"-x"}`, nil,
			problem{events.CodeInvalid, "execution_id", `execution_id "-x" is not a valid execution id: ` + events.ExecutionIDRule}},
		{"NotRegistered", `{"workflow":"typed","input":{"count":1}}`, nil,
			problem{events.CodeNotFound, "workflow", `workflow "typed" is not registered`}},
		{"NoSuchVersion", `{"workflow":"typed","version":7}`, nil,
			problem{events.CodeNotFound, "version", `workflow "typed" has no version 7`}},
		{"SchemaMismatch", `{"workflow":"typed","input":{"count":"three"}}`, def,
			problem{events.CodeInvalid, "input.count", "the input does not match workflow typed's input schema: input.count got string, want integer"}},
		{"SchemaTwoProblems", `{"workflow":"typed","input":{"count":0,"name":"long"}}`, def,
			problem{events.CodeInvalid, "input.count", "the input does not match workflow typed's input schema: " +
				"input.count minimum: got 0, want 1; input.name maxLength: got 4, want 3"}},
		{"SchemaRequiredAbsentInput", `{"workflow":"typed"}`, def,
			problem{events.CodeInvalid, "input.count", "the input does not match workflow typed's input schema: input.count is required"}},
		{"SchemaRequiredNullInput", `{"workflow":"typed","input":null}`, def,
			problem{events.CodeInvalid, "input.count", "the input does not match workflow typed's input schema: input.count is required"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ev := command(t, c.data)
			st, err := startcheck.Check(ev, c.def, options())
			var p *startcheck.Problem
			require.ErrorAs(t, err, &p)
			require.Equal(t, c.want, problem{p.Code, p.Field, p.Message})
			require.Equal(t, p.Message, err.Error())
			require.Equal(t, startcheck.Start{}, st)
			_, id := startcheck.Identify(ev)
			if !strings.Contains(c.data, `"execution_id"`) {
				require.Equal(t, derived, id)
			}
		})
	}
}

// TestCheckSchemaProblemsListed: an input the schema refuses names every
// problem, the first as the field.
func TestCheckSchemaProblemsListed(t *testing.T) {
	t.Parallel()
	_, err := startcheck.Check(command(t, `{"workflow":"typed","input":{"count":0,"name":"long"}}`), definition(t, typed), options())
	var p *startcheck.Problem
	require.ErrorAs(t, err, &p)
	require.Equal(t, []workflow.FieldError{
		{Field: "input.count", Message: "minimum: got 0, want 1"},
		{Field: "input.name", Message: "maxLength: got 4, want 3"},
	}, p.Input)

	_, err = startcheck.Check(command(t, `{"workflow":"typed","version":-1}`), definition(t, typed), options())
	require.ErrorAs(t, err, &p)
	require.Nil(t, p.Input, "only schema problems list the input's problems")
}

// TestCheckNormalizes: a start that passes comes back with its id, key
// and digest, and the execution's first event but for the token and api
// url.
func TestCheckNormalizes(t *testing.T) {
	t.Parallel()
	def := definition(t, typed)
	canonical, err := def.Spec.Canonical()
	require.NoError(t, err)

	ev := command(t, `{"workflow":"typed","input":{"count":2},"wait_after_fail":true,"dry_run":true}`)
	st, err := startcheck.Check(ev, def, options())
	require.NoError(t, err)
	id := events.DerivedExecutionID("urn:test#c1")
	asked := *ev.Data.(*events.StartExecution)
	asked.ExecutionID = id
	require.Equal(t, startcheck.Start{ExecutionID: id, CommandKey: "urn:test#c1", Digest: asked.Digest(), Started: &events.ExecutionStarted{
		Workflow: "typed", Version: 3, Input: json.RawMessage(`{"count":2}`),
		Steps:      []events.StepRef{{ID: "a", Kind: workflow.KindNoop}, {ID: "b", Kind: workflow.KindLog}},
		Definition: canonical, CommandKey: "urn:test#c1", CommandDigest: asked.Digest(), StartedBy: "urn:test",
		WaitAfterFail: true, DryRun: true,
	}}, st)
	require.Equal(t, ev.Data, &events.StartExecution{Workflow: "typed", Input: json.RawMessage(`{"count":2}`), WaitAfterFail: true, DryRun: true},
		"the command is not changed")

	again, err := startcheck.Check(ev, def, options())
	require.NoError(t, err)
	require.Equal(t, st, again, "the same start, the same answer")

	t.Run("GivenIDAndVersion", func(t *testing.T) {
		st, err := startcheck.Check(command(t, `{"workflow":"typed","version":3,"execution_id":"x-1","input":{"count":1}}`), def, options())
		require.NoError(t, err)
		require.Equal(t, "x-1", st.ExecutionID)
		require.Equal(t, 3, st.Started.Version)
	})
	t.Run("NoInputIsEmptyObject", func(t *testing.T) {
		free := definition(t, "name: free\nsteps:\n  - {id: a, kind: noop}\n")
		for _, data := range []string{`{"workflow":"free"}`, `{"workflow":"free","input":null}`, `{"workflow":"free","input":{}}`, `{"workflow":"free","input": { } }`} {
			st, err := startcheck.Check(command(t, data), free, options())
			require.NoError(t, err, data)
			if data == `{"workflow":"free","input": { } }` {
				require.JSONEq(t, `{}`, string(st.Started.Input))
			} else {
				require.Equal(t, json.RawMessage(`{}`), st.Started.Input, data)
			}
			require.Equal(t, (&events.StartExecution{Workflow: "free", ExecutionID: st.ExecutionID}).Digest(), st.Digest, "no input and {} are the same request: %s", data)
		}
	})
	t.Run("ActorIsWhoStarted", func(t *testing.T) {
		ev := command(t, `{"workflow":"typed","input":{"count":1}}`)
		actor := &events.Actor{Subject: "ci-bot", Method: events.ActorAPIKey, KeyID: "k1"}
		ev.Data.(*events.StartExecution).Actor = actor // as the api sets it; not in the data as received
		st, err := startcheck.Check(ev, def, options())
		require.NoError(t, err)
		require.Equal(t, "ci-bot", st.Started.StartedBy)
		require.Equal(t, actor, st.Started.Actor)
		require.Equal(t, "urn:test#c1", st.Started.CommandKey, "the key keeps the source")
	})
	t.Run("NotAStart", func(t *testing.T) {
		_, err := startcheck.Check(events.Event{Type: events.TypeSignalExecution, Data: &events.SignalExecution{}}, def, options())
		require.Error(t, err)
		var p *startcheck.Problem
		require.False(t, errors.As(err, &p), "not the command's problem: %v", err)
	})
}

// TestAPreparedDefinitionStartsAsTheDefinition: a start checked against
// a definition prepared once (as the dispatcher keeps one per version)
// is the start checked against the definition, and each start has steps
// of its own.
func TestAPreparedDefinitionStartsAsTheDefinition(t *testing.T) {
	t.Parallel()
	def := definition(t, typed)
	prepared, err := startcheck.Prepare(def.Name, def.Version, def.Spec)
	require.NoError(t, err)
	for _, data := range []string{
		`{"workflow":"typed","input":{"count":2},"wait_after_fail":true}`,
		`{"workflow":"typed","version":3,"execution_id":"x-1","input":{"count":1,"name":"abc"}}`,
	} {
		want, err := startcheck.Check(command(t, data), def, options())
		require.NoError(t, err, data)
		got, err := startcheck.Check(command(t, data), prepared, options())
		require.NoError(t, err, data)
		require.Equal(t, want, got, data)
	}
	_, err = startcheck.Check(command(t, `{"workflow":"typed","input":{"count":0}}`), prepared, options())
	var p *startcheck.Problem
	require.ErrorAs(t, err, &p, "its input schema still checks the input")
	require.Equal(t, "input.count", p.Field)

	one, err := startcheck.Check(command(t, `{"workflow":"typed","input":{"count":1}}`), prepared, options())
	require.NoError(t, err)
	one.Started.Steps[0].ID = "changed"
	two, err := startcheck.Check(command(t, `{"workflow":"typed","input":{"count":1}}`), prepared, options())
	require.NoError(t, err)
	require.Equal(t, "a", two.Started.Steps[0].ID, "a start's steps are its own")
}

// BenchmarkCheck: a start checked against a definition, and against the
// same prepared once.
func BenchmarkCheck(b *testing.B) {
	def := definition(b, typed)
	prepared, err := startcheck.Prepare(def.Name, def.Version, def.Spec)
	require.NoError(b, err)
	ev := command(b, `{"workflow":"typed","input":{"count":2}}`)
	for _, c := range []struct {
		name string
		def  *startcheck.Definition
	}{{"definition", def}, {"prepared", prepared}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := startcheck.Check(ev, c.def, options()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestCheckRetention: the workflow's rule is recorded with context meaning
// parent, its hash rendered over the start; a hash that renders to no
// usable key refuses the start, naming the input.
func TestCheckRetention(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, retention, input string
		want                   *events.Retention
		problem                string
	}{
		{"None", "", `{}`, nil, ""},
		{"Count", "5", `{}`, &events.Retention{Rule: "5"}, ""},
		{"Context", "max(context, 6h)", `{}`, &events.Retention{Rule: "max(parent, 6h)"}, ""},
		{"HashOverInput", "2 hash ${input.team}-runs", `{"team":"ops"}`, &events.Retention{Rule: "2", Key: "ops-runs"}, ""},
		{"HashOverMetadata", "hash ${workflow.name}/${workflow.id}/${workflow.version}/${workflow.attempt}", `{}`,
			&events.Retention{Rule: "parent", Key: "grouped/x-1/3/1"}, ""},
		{"HashOverStartTime", "hash ${workflow.started_at}", `{}`, &events.Retention{Rule: "parent", Key: "2026-03-14T10:00:00Z"}, ""},
		{"HashTrimmed", "hash ${input.team}", `{"team":"  ops "}`, &events.Retention{Rule: "parent", Key: "ops"}, ""},
		{"HashEmpty", "2 hash ${input.team}", `{"team":" "}`, nil, `retention hash "${input.team}" gives an empty key`},
		{"HashTooLong", "2 hash ${input.team}", `{"team":"` + strings.Repeat("t", 257) + `"}`, nil,
			`retention hash "${input.team}" gives a key of 257 bytes, at most 256`},
		{"HashMissingMember", "2 hash ${input.team.name}", `{}`, nil, "retention hash: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			yaml := "name: grouped\nsteps:\n  - {id: a, kind: noop}\n"
			if c.retention != "" {
				yaml = "name: grouped\nretention: " + c.retention + "\nsteps:\n  - {id: a, kind: noop}\n"
			}
			st, err := startcheck.Check(command(t, `{"workflow":"grouped","execution_id":"x-1","input":`+c.input+`}`), definition(t, yaml), options())
			if c.problem == "" {
				require.NoError(t, err)
				require.Equal(t, c.want, st.Started.Retention)
				return
			}
			var p *startcheck.Problem
			require.ErrorAs(t, err, &p)
			require.Equal(t, events.CodeInvalid, p.Code)
			require.Equal(t, "input", p.Field)
			require.Contains(t, p.Message, c.problem)
		})
	}
}

// TestCheckChildRetention: a child execution's parent is its parent's
// rule when it started (its default too); without a parent rule (the
// system default) nothing changes.
func TestCheckChildRetention(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, retention, parent string
		want                    *events.Retention
	}{
		{"NoneInheritsTheParents", "", "7d", &events.Retention{Rule: "7d"}},
		{"ParentInAMax", "max(parent, 2)", "1h", &events.Retention{Rule: "max(1h, 2)"}},
		{"ContextIsParent", "context hash k", "3", &events.Retention{Rule: "3", Key: "k"}},
		{"OwnRuleKept", "5", "7d", &events.Retention{Rule: "5"}},
		{"ParentOnTheDefault", "max(parent, 2)", "", &events.Retention{Rule: "max(parent, 2)"}},
		{"NoneOnTheDefault", "", "", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			yaml := "name: grouped\nsteps:\n  - {id: a, kind: noop}\n"
			if c.retention != "" {
				yaml = "name: grouped\nretention: " + c.retention + "\nsteps:\n  - {id: a, kind: noop}\n"
			}
			data := `{"workflow":"grouped","execution_id":"x-1","parent":{"execution_id":"p","workflow":"w","step_id":"s","attempt":1,"retention":"` + c.parent + `"}}`
			st, err := startcheck.Check(command(t, data), definition(t, yaml), options())
			require.NoError(t, err)
			require.Equal(t, c.want, st.Started.Retention)
		})
	}
}

// TestCheckSize: the first history event must fit in a message; the
// message gives the sizes of what the start asks for, the same whoever
// asks; without a limit nothing is counted.
func TestCheckSize(t *testing.T) {
	t.Parallel()
	def := definition(t, "name: big\ndescription: "+strings.Repeat("d", 2000)+"\nsteps:\n  - {id: a, kind: noop}\n")
	canonical, err := def.Spec.Canonical()
	require.NoError(t, err)
	input := `{"blob":"` + strings.Repeat("b", 5000) + `"}`
	ev := command(t, `{"workflow":"big","execution_id":"x-1","input":`+input+`}`)
	fits := func(limit int64) bool {
		_, err := startcheck.Check(ev, def, startcheck.Options{MaxPayload: limit, Now: now})
		var p *startcheck.Problem
		if err != nil {
			require.ErrorAs(t, err, &p)
			require.Equal(t, events.CodeInvalid, p.Code)
			require.Equal(t, "input", p.Field)
			require.Equal(t, fmt.Sprintf("the input (%d bytes) and the pinned definition (%d bytes) make the execution's first event "+
				"larger than the %d bytes a message may hold; make the input smaller", len(input), len(canonical), limit), p.Message)
		}
		return err == nil
	}
	// The smallest limit it fits in: the event with room for what the
	// dispatcher adds, counted once.
	least := sort.Search(1<<20, func(i int) bool { return fits(int64(i)) })
	require.True(t, fits(int64(least)))
	require.False(t, fits(int64(least-1)))
	base := len(input) + len(canonical)
	require.Greater(t, least, base+1024, "the input, the definition and the reserve")
	require.Less(t, least, base+1024+1000, "nothing counted twice")

	// Who asks is in the event, and counts.
	withActor := command(t, `{"workflow":"big","execution_id":"x-1","input":`+input+`}`)
	withActor.Data.(*events.StartExecution).Actor = &events.Actor{Subject: strings.Repeat("s", 100), Method: events.ActorOIDC}
	_, err = startcheck.Check(withActor, def, startcheck.Options{MaxPayload: int64(least), Now: now})
	require.Error(t, err)
	// When it is checked does not.
	_, err = startcheck.Check(ev, def, startcheck.Options{MaxPayload: int64(least), Now: now.Add(123456789 * time.Nanosecond)})
	require.NoError(t, err)

	_, err = startcheck.Check(ev, def, startcheck.Options{Now: now})
	require.NoError(t, err, "no limit")
}

// TestIdentify: the execution id a start names, given or derived from its
// key.
func TestIdentify(t *testing.T) {
	t.Parallel()
	key, id := startcheck.Identify(command(t, `{"workflow":"w","execution_id":"x-1"}`))
	require.Equal(t, "urn:test#c1", key)
	require.Equal(t, "x-1", id)
	key, id = startcheck.Identify(command(t, `{"workflow":"w"}`))
	require.Equal(t, "urn:test#c1", key)
	require.Equal(t, events.DerivedExecutionID("urn:test#c1"), id)
	require.True(t, events.ValidExecutionID(id))
	_, id = startcheck.Identify(events.Event{ID: "s", Source: "x", Data: &events.SignalExecution{}})
	require.Empty(t, id)
}

// TestEnv: what expressions see at the start.
func TestEnv(t *testing.T) {
	t.Parallel()
	require.Equal(t, map[string]any{
		"input": map[string]any{"n": float64(1)},
		"vars":  map[string]any{},
		"steps": map[string]any{},
		"workflow": map[string]any{"id": "x-1", "name": "w", "version": float64(2), "attempt": float64(1),
			"started_at": "2026-03-14T10:00:00Z", "api_url": "", "chain": "x-1", "run": float64(1)},
	}, startcheck.Env("x-1", "w", 2, json.RawMessage(`{"n":1}`), now.In(time.FixedZone("CET", 3600))))
	require.Equal(t, map[string]any{}, startcheck.Env("x-1", "w", 2, nil, now)["input"])
	wf := startcheck.ChainEnv("x-1-run3", "w", 2, nil, now, "x-1", 3)["workflow"].(map[string]any)
	require.Equal(t, "x-1", wf["chain"], "a continued run sees its chain")
	require.Equal(t, float64(3), wf["run"])
}

// FuzzCheck: whatever the data, Check answers with a start or a problem
// that says something, and never panics.
func FuzzCheck(f *testing.F) {
	for _, seed := range []string{`{"workflow":"typed","input":{"count":1}}`, `{"workflow":"typed","input":{"count":"x"}}`,
		`{"workflow":"","execution_id":"a.b"}`, `{"workflow":"typed","inptu":1}`, `{"input":[1]}`, `{"workflow":"typed","version":-3}`} {
		f.Add(seed)
	}
	def := definition(f, typed)
	f.Fuzz(func(t *testing.T, data string) {
		var cmd events.StartExecution
		if json.Unmarshal([]byte(data), &cmd) != nil {
			return
		}
		ev := events.Event{ID: "c1", Source: "urn:test", Type: events.TypeStartExecution, Data: &cmd, Raw: json.RawMessage(data)}
		st, err := startcheck.Check(ev, def, options())
		if err != nil {
			var p *startcheck.Problem
			require.ErrorAs(t, err, &p)
			require.NotEmpty(t, p.Message)
			require.Contains(t, []string{events.CodeInvalid, events.CodeNotFound}, p.Code)
			return
		}
		require.True(t, events.ValidExecutionID(st.ExecutionID))
		require.NotNil(t, st.Started)
	})
}
