package projector_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/projector"
)

// appendHistory appends payloads as the dispatcher would (expected last
// sequence, prevseq) and returns the stored events.
func appendHistory(t *testing.T, js jetstream.JetStream, wf, id string, ps ...events.Payload) []events.Event {
	t.Helper()
	return appendFrom(t, js, wf, id, 0, ps...)
}

// appendFrom is appendHistory after the event at stream sequence last.
func appendFrom(t *testing.T, js jetstream.JetStream, wf, id string, last uint64, ps ...events.Payload) []events.Event {
	t.Helper()
	var out []events.Event
	at := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	for i, p := range ps {
		ev := events.New("test", id, wf, at.Add(time.Duration(i)*time.Millisecond), p)
		ev.PrevSeq = last
		seq, err := history.Append(t.Context(), js, events.ExecutionSubject(wf, id), last, ev)
		require.NoError(t, err)
		ev.Seq, last = seq, seq
		out = append(out, ev)
	}
	return out
}

func twoStepHistory(t *testing.T, js jetstream.JetStream, id string) []events.Event {
	t.Helper()
	steps := []events.StepRef{{ID: "s1", Kind: "noop"}, {ID: "s2", Kind: "noop"}}
	ps := []events.Payload{&events.ExecutionStarted{Workflow: "wf", Version: 1, Input: json.RawMessage(`{}`), Steps: steps, Token: "t"}}
	for _, s := range []string{"s1", "s2"} {
		ps = append(ps, &events.StepScheduled{StepID: s, Attempt: 1}, &events.StepSending{StepID: s, Attempt: 1, TaskID: id + "." + s + ".1", Queue: "default"},
			&events.StepSent{StepID: s, Attempt: 1, TaskID: id + "." + s + ".1"}, &events.StepStarted{StepID: s, Attempt: 1, Agent: "ag"},
			&events.StepSucceeded{StepID: s, Attempt: 1, Agent: "ag"})
	}
	ps = append(ps, &events.ExecutionSucceeded{})
	return appendHistory(t, js, "wf", id, ps...)
}

func storedModel(t *testing.T, kv jetstream.KeyValue, id string) (projections.Execution, bool) {
	t.Helper()
	e, err := kv.Get(t.Context(), id)
	if err != nil {
		return projections.Execution{}, false
	}
	var x projections.Execution
	return x, json.Unmarshal(e.Value(), &x) == nil
}

func requireSameModel(t *testing.T, want, got projections.Execution) {
	t.Helper()
	wb, err := json.Marshal(want)
	require.NoError(t, err)
	gb, err := json.Marshal(got)
	require.NoError(t, err)
	require.JSONEq(t, string(wb), string(gb))
}

// TestUnreadableReadModelIsRepaired: a read model that is not JSON (written
// by something else, or damaged) is overwritten with the fold of the
// history instead of blocking its execution's events forever.
func TestUnreadableReadModelIsRepaired(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), events.BucketExecutions)
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), "x1", []byte("not json"))
	require.NoError(t, err)
	evs := twoStepHistory(t, js, "x1")
	truth, err := projections.Fold(evs)
	require.NoError(t, err)

	p, err := projector.New(t.Context(), js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, p.Run)
	require.Eventually(t, func() bool {
		x, ok := storedModel(t, kv, "x1")
		return ok && x.LastSeq == truth.LastSeq
	}, 10*time.Second, 20*time.Millisecond)
	got, _ := storedModel(t, kv, "x1")
	requireSameModel(t, truth, got)
}

// TestRebuildFromSequenceOntoLaggingModel: the stored model stops before
// the rebuild's start sequence; the rebuild must notice the gap and fold
// the execution from its own history, and a full rebuild must correct a
// model with the right last sequence but wrong content.
func TestRebuildFromSequenceOntoLaggingModel(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), events.BucketExecutions)
	require.NoError(t, err)
	evs := twoStepHistory(t, js, "x1")
	truth, err := projections.Fold(evs)
	require.NoError(t, err)

	lag, err := projections.Fold(evs[:4]) // the projector had stopped at s1 sent
	require.NoError(t, err)
	b, _ := json.Marshal(lag)
	_, err = kv.Put(t.Context(), "x1", b)
	require.NoError(t, err)
	res, err := projector.Rebuild(t.Context(), js, evs[5].Seq) // from s1 succeeded, past s1 started
	require.NoError(t, err)
	require.Equal(t, 1, res.Written)
	got, _ := storedModel(t, kv, "x1")
	requireSameModel(t, truth, got)

	wrong := truth
	wrong.Events = 3
	b, _ = json.Marshal(wrong)
	_, err = kv.Put(t.Context(), "x1", b)
	require.NoError(t, err)
	res, err = projector.Rebuild(t.Context(), js, 0)
	require.NoError(t, err)
	require.Equal(t, 1, res.Written)
	got, _ = storedModel(t, kv, "x1")
	requireSameModel(t, truth, got)

	res, err = projector.Rebuild(t.Context(), js, 0)
	require.NoError(t, err)
	require.Equal(t, rebuildCounts{Written: 0, Unchanged: 1}, rebuildCounts{res.Written, res.Unchanged}, "a model already right is left alone")
}

type rebuildCounts struct{ Written, Unchanged int }

// TestRebuildSkipsHistoriesThatDoNotFold: one broken history does not stop
// the others from being rebuilt; it is reported.
func TestRebuildSkipsHistoriesThatDoNotFold(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	twoStepHistory(t, js, "good")
	appendHistory(t, js, "wf", "broken",
		&events.ExecutionStarted{Workflow: "wf", Version: 1, Steps: []events.StepRef{{ID: "s1", Kind: "noop"}}, Token: "t"},
		&events.StepSucceeded{StepID: "s1", Attempt: 1}) // succeeded before it was ever scheduled
	res, err := projector.Rebuild(t.Context(), js, 0)
	require.NoError(t, err)
	require.Equal(t, 1, res.Written)
	require.Contains(t, res.Failed, "broken")
	kv, err := js.KeyValue(t.Context(), events.BucketExecutions)
	require.NoError(t, err)
	x, ok := storedModel(t, kv, "good")
	require.True(t, ok)
	require.Equal(t, projections.StatusSucceeded, x.Status)
}
