package projector_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/redact"
	"jetflow.dev/services/api/projector"
)

// loginDefinition's input schema marks password writeOnly.
const loginDefinition = `{"name":"wf","input":{"type":"object","properties":{"user":{"type":"string"},` +
	`"password":{"type":"string","writeOnly":true}}},"steps":[{"id":"s1","kind":"exec"},{"id":"s2","kind":"noop"}]}`

// TestWriteOnlyInputIsRedacted: the stored read model never holds a
// writeOnly input value: not in the input, not in a step's input or
// output, not in a variable; also when a projector that never saw the
// execution's start (its cache is empty) projects later events, and after
// a rebuild, which stores the same model.
func TestWriteOnlyInputIsRedacted(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	const pw = "hunter2-e9f1"
	steps := []events.StepRef{{ID: "s1", Kind: "exec"}, {ID: "s2", Kind: "noop"}}
	first := appendHistory(t, js, "wf", "x1",
		&events.ExecutionStarted{Workflow: "wf", Version: 1, Input: json.RawMessage(`{"user":"bob","password":"` + pw + `"}`),
			Definition: json.RawMessage(loginDefinition), Steps: steps, Token: "t"},
		&events.StepScheduled{StepID: "s1", Attempt: 1, Input: json.RawMessage(`{"args":["--password","` + pw + `"]}`)})

	requireRedacted := func(lastSeq uint64) projections.Execution {
		t.Helper()
		var x projections.Execution
		require.Eventually(t, func() bool {
			var ok bool
			x, ok = storedModel(t, kv, "x1")
			return ok && x.LastSeq == lastSeq
		}, 10*time.Second, 20*time.Millisecond)
		e, err := kv.Get(t.Context(), "x1")
		require.NoError(t, err)
		require.NotContains(t, string(e.Value()), pw)
		require.JSONEq(t, `{"user":"bob","password":"`+redact.Mask+`"}`, string(x.Input))
		require.True(t, x.Redacted)
		return x
	}
	run := func() context.CancelFunc {
		ctx, cancel := context.WithCancel(t.Context())
		p, err := projector.New(ctx, js, zerolog.New(zerolog.NewTestWriter(t)))
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- p.Run(ctx) }()
		return func() { cancel(); require.NoError(t, <-done) }
	}

	stop := run()
	x := requireRedacted(first[len(first)-1].Seq)
	require.Contains(t, string(x.Steps[0].Input), redact.Mask)
	stop()

	// A new projector (an api restarted) starts from the stored model,
	// which is redacted: it reads the start again to know what to hide.
	later := appendFrom(t, js, "wf", "x1", first[len(first)-1].Seq,
		&events.StepSending{StepID: "s1", Attempt: 1, TaskID: "x1.s1.1", Queue: "default"},
		&events.StepSent{StepID: "s1", Attempt: 1, TaskID: "x1.s1.1"},
		&events.StepSucceeded{StepID: "s1", Attempt: 1, Output: json.RawMessage(`{"stdout":"logged in with ` + pw + `\n"}`),
			Vars: map[string]json.RawMessage{"pw": json.RawMessage(`"` + pw + `"`)}})
	last := later[len(later)-1].Seq
	stop = run()
	x = requireRedacted(last)
	require.JSONEq(t, `{"stdout":"logged in with `+redact.Mask+`\n"}`, string(x.Steps[0].Output))
	require.JSONEq(t, `"`+redact.Mask+`"`, string(x.Vars["pw"]))
	stop()

	live, err := kv.Get(t.Context(), "x1")
	require.NoError(t, err)
	res, err := projector.Rebuild(t.Context(), js, 0, 0)
	require.NoError(t, err)
	require.Equal(t, 1, res.Unchanged, "a rebuild stores the same redacted model: %+v", res)
	again, err := kv.Get(t.Context(), "x1")
	require.NoError(t, err)
	require.Equal(t, string(live.Value()), string(again.Value()))
}
