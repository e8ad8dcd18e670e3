package dispatch_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history/historytest"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/dispatcher/dispatch"
)

const keeperYAML = `name: keeper
retention: max(context, 6h) hash ${input.who}-runs
steps:
  - id: first
    kind: let
    vars: {x: 1}
  - id: keep-failures
    kind: workflow
    retention: forever hash ${workflow.name} failed
  - id: later
    kind: let
    vars: {y: 2}
    retention: min(context, 3)
  - id: empty-key
    kind: workflow
    condition: ${input.who == ""}
    retention: hash ${input.who}
`

// startInput publishes a start command with the given input and returns
// its command key.
func (b *testBundle) startInput(t *testing.T, wf, execID, input string) string {
	t.Helper()
	ev := events.New("test-client", "", "", time.Now(), &events.StartExecution{Workflow: wf, ExecutionID: execID, Input: json.RawMessage(input)})
	msg, err := bus.Encode(bus.SubjectStart, ev)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(ev.ID))
	require.NoError(t, err)
	return events.CommandKey(ev.Source, ev.ID)
}

// TestRetentionRecorded: the workflow's rule is recorded when the
// execution starts (context meaning parent, the hash rendered over the
// input), and each step with retention: changes rule and group when it is
// scheduled, in the history, so the fold (and the read model) has them.
func TestRetentionRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	def, err := workflow.Parse([]byte(keeperYAML))
	require.NoError(t, err)
	_, _, err = b.defs.Apply(t.Context(), def)
	require.NoError(t, err)
	runDispatcher(t, b.js, dispatch.Config{})

	b.startInput(t, "keeper", "k1", `{"who":"ops"}`)
	x, evs := waitStatus(t, b.js, "keeper", "k1", projections.StatusSucceeded)
	historytest.RequireLinear(t, evs)

	started := evs[0].Data.(*events.ExecutionStarted)
	require.Equal(t, &events.Retention{Rule: "max(parent, 6h)", Key: "ops-runs"}, started.Retention)
	var changes []events.Retention
	for _, ev := range evs {
		if s, ok := ev.Data.(*events.StepScheduled); ok && s.Retention != nil {
			changes = append(changes, *s.Retention)
		}
	}
	require.Equal(t, []events.Retention{
		{Rule: "forever", Key: "keeper failed"},
		{Rule: "min(forever, 3)", Key: "keeper failed"}, // context is the rule before; no hash keeps the group
	}, changes)
	require.Equal(t, "min(forever, 3)", x.Retention)
	require.Equal(t, "keeper failed", x.RetentionKey)
	require.Equal(t, projections.OpSkipped, x.Steps[x.StepIndex("empty-key")].Status)

	// A hash key that renders empty fails its step, like any expression
	// of the step that cannot be evaluated.
	b.startInput(t, "keeper", "k2", `{"who":""}`)
	x, _ = waitStatus(t, b.js, "keeper", "k2", projections.StatusFailed)
	st := x.Steps[x.StepIndex("empty-key")]
	require.Equal(t, projections.OpFailed, st.Status)
	require.Contains(t, st.Error, `retention hash "${input.who}" gives an empty key`)
	require.Equal(t, "min(forever, 3)", x.Retention, "the failed step changed nothing")
}

// TestRetentionStartHashRejected: a workflow whose hash cannot be
// rendered at start is refused with the reason, and nothing is stored.
func TestRetentionStartHashRejected(t *testing.T) {
	t.Parallel()
	b := setup(t)
	def, err := workflow.Parse([]byte("name: grouped\nretention: 2 hash ${input.team}\nsteps:\n  - id: a\n    kind: let\n    vars: {x: 1}\n"))
	require.NoError(t, err)
	_, _, err = b.defs.Apply(t.Context(), def)
	require.NoError(t, err)
	runDispatcher(t, b.js, dispatch.Config{})

	key := b.startInput(t, "grouped", "g1", `{"team":""}`)
	rej := readRejection(t, b.js, key)
	require.Equal(t, events.CodeInvalid, rej.Code)
	require.Equal(t, "input", rej.Field, "the hash is rendered from the input")
	require.Equal(t, `retention hash "${input.team}" gives an empty key`, rej.Reason)
	require.Empty(t, readHistory(t, b.js, "grouped", "g1"))
}

// TestStartOfExpiredExecutionRefused: a start command whose execution ran
// and has since expired (its claim marked so by the janitor, its history
// purged) is refused, never run a second time.
func TestStartOfExpiredExecutionRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.register(t, "once", "a")
	ev := events.New("test-client", "", "", time.Now(), &events.StartExecution{Workflow: "once", ExecutionID: "gone-1"})
	ids, err := claim.Open(t.Context(), b.js)
	require.NoError(t, err)
	_, err = ids.Claim(t.Context(), "gone-1", claim.Record{CommandKey: events.CommandKey(ev.Source, ev.ID), Workflow: "once",
		ClaimedAt: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	require.NoError(t, ids.MarkExpired(t.Context(), "gone-1", time.Now()))
	runDispatcher(t, b.js, dispatch.Config{})

	msg, err := bus.Encode(bus.SubjectStart, ev)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
	rej := readRejection(t, b.js, events.CommandKey(ev.Source, ev.ID))
	require.Equal(t, events.CodeConflict, rej.Code)
	require.Equal(t, "execution_id", rej.Field)
	require.Contains(t, rej.Reason, `execution "gone-1" expired under its retention rule`)
	require.Empty(t, readHistory(t, b.js, "once", "gone-1"))
}

// expireCommand publishes the janitor's expire command for execution id of
// wf, as the janitor saw its history end at lastSeq.
func (b *testBundle) expireCommand(t *testing.T, wf, id string, lastSeq uint64) {
	t.Helper()
	ev := events.New("jetflow/janitor", id, wf, time.Now(), &events.ExpireExecution{ExecutionID: id, Workflow: wf, LastSeq: lastSeq, Rule: "1", Group: wf})
	msg, err := bus.Encode(bus.SubjectExpire, ev)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(ev.ID))
	require.NoError(t, err)
}

// TestExpireOnlyWhatTheJanitorSaw: the dispatcher records an expiry only
// if the history still ends where the janitor saw it, so an operator's
// resume that comes first keeps the execution; once the expiry is
// recorded, nothing can be added: a resume, a replay or a signal is
// refused with code expired, and the history stays a valid fold.
func TestExpireOnlyWhatTheJanitorSaw(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, "name: flaky\nsteps:\n  - id: boom\n    kind: fail\n    message: not yet\n")
	b.start(t, "flaky", "f1")
	s, _ := waitStatus(t, b.js, "flaky", "f1", projections.StatusFailed)
	first := s.LastSeq

	// The janitor decided on the failed execution, but an operator resumed
	// it before the dispatcher got the expire command.
	b.act(t, "f1", events.ActionResume, "fixed it")
	natstest.Eventually(t, waitFor, func() bool {
		return countType(readHistory(t, b.js, "flaky", "f1"), events.TypeExecutionFailed) == 2
	}, "resumed and failed again")
	b.expireCommand(t, "flaky", "f1", first)
	waitCommandsHandled(t, b.js)
	evs := readHistory(t, b.js, "flaky", "f1")
	require.Zero(t, countType(evs, events.TypeExecutionExpired), "the resume came first: kept")

	s, _ = waitStatus(t, b.js, "flaky", "f1", projections.StatusFailed)
	b.expireCommand(t, "flaky", "f1", s.LastSeq)
	evs = waitHistory(t, b.js, "flaky", "f1", "expired", func(evs []events.Event) bool {
		return countType(evs, events.TypeExecutionExpired) == 1
	})
	exp := evs[len(evs)-1].Data.(*events.ExecutionExpired)
	require.Equal(t, &events.ExecutionExpired{Rule: "1", Group: "flaky", RequestedBy: "jetflow/janitor"}, exp)

	for _, action := range []string{events.ActionResume, events.ActionReplay, events.ActionCancel} {
		rej := readRejection(t, b.js, b.act(t, "f1", action, "too late"))
		require.Equal(t, events.CodeExpired, rej.Code, action)
		require.Contains(t, rej.Reason, "expired under its retention rule")
	}
	sig := events.New("test-client", "", "", time.Now(), &events.SignalExecution{ExecutionID: "f1", Name: "go"})
	msg, err := bus.Encode(bus.SubjectSignal, sig)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
	require.Equal(t, events.CodeExpired, readRejection(t, b.js, events.CommandKey(sig.Source, sig.ID)).Code)

	b.expireCommand(t, "flaky", "f1", s.LastSeq+1) // asked again: nothing more
	waitCommandsHandled(t, b.js)
	evs = readHistory(t, b.js, "flaky", "f1")
	require.Equal(t, 1, countType(evs, events.TypeExecutionExpired))
	require.Equal(t, events.TypeExecutionExpired, evs[len(evs)-1].Type, "nothing follows the expiry")
	x, err := projections.Fold(evs)
	require.NoError(t, err)
	require.False(t, x.ExpiredAt.IsZero())
}
