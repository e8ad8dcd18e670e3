package projector_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/projector"
	"jetflow.dev/services/internal/svcruntest"
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
	if len(ps) > pipelineFrom {
		return appendPipelined(t, js, wf, id, last, ps...)
	}
	var out []events.Event
	at := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	for i, p := range ps {
		ev := events.New("test", id, wf, at.Add(time.Duration(i)*time.Millisecond), p)
		ev.PrevSeq = last
		seq, err := history.Append(t.Context(), js, bus.ExecutionSubject(wf, id), last, ev)
		require.NoError(t, err)
		ev.Seq, last = seq, seq
		out = append(out, ev)
	}
	return out
}

// pipelineFrom is the history that appendFrom appends in a pipeline: one
// append after another, a few thousand events took minutes on a loaded
// machine.
const pipelineFrom = 100

// appendPipelined is appendFrom with the appends sent without waiting for
// each other's acknowledgement: each expects the stream's last sequence
// to be the one before it, so that the history is what history.Append
// would have stored, and fails the test if anything else wrote to the
// stream meanwhile.
func appendPipelined(t testing.TB, js jetstream.JetStream, wf, id string, last uint64, ps ...events.Payload) []events.Event {
	t.Helper()
	stream, err := js.Stream(t.Context(), bus.StreamEvents)
	require.NoError(t, err)
	info, err := stream.Info(t.Context())
	require.NoError(t, err)
	next := info.State.LastSeq
	require.GreaterOrEqual(t, next, last, "the history's last event is in the stream")
	out := make([]events.Event, 0, len(ps))
	acks := make([]jetstream.PubAckFuture, 0, len(ps))
	at := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	for i, p := range ps {
		ev := events.New("test", id, wf, at.Add(time.Duration(i)*time.Millisecond), p)
		ev.PrevSeq = last
		msg, err := bus.Encode(bus.ExecutionSubject(wf, id), ev)
		require.NoError(t, err)
		f, err := js.PublishMsgAsync(msg, jetstream.WithMsgID(ev.ID), jetstream.WithExpectLastSequence(next))
		require.NoError(t, err)
		next++
		ev.Seq, last = next, next
		out, acks = append(out, ev), append(acks, f)
	}
	for i, f := range acks {
		select {
		case ack := <-f.Ok():
			require.Equal(t, out[i].Seq, ack.Sequence)
		case err := <-f.Err():
			t.Fatalf("append %d of %s: %v", i, id, err)
		case <-time.After(2 * time.Minute):
			t.Fatalf("append %d of %s not acknowledged", i, id)
		}
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
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
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
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	evs := twoStepHistory(t, js, "x1")
	truth, err := projections.Fold(evs)
	require.NoError(t, err)

	lag, err := projections.Fold(evs[:4]) // the projector had stopped at s1 sent
	require.NoError(t, err)
	b, _ := json.Marshal(lag)
	_, err = kv.Put(t.Context(), "x1", b)
	require.NoError(t, err)
	res, err := projector.Rebuild(t.Context(), js, evs[5].Seq, 0) // from s1 succeeded, past s1 started
	require.NoError(t, err)
	require.Equal(t, 1, res.Written)
	got, _ := storedModel(t, kv, "x1")
	requireSameModel(t, truth, got)

	wrong := truth
	wrong.Events = 3
	b, _ = json.Marshal(wrong)
	_, err = kv.Put(t.Context(), "x1", b)
	require.NoError(t, err)
	res, err = projector.Rebuild(t.Context(), js, 0, 0)
	require.NoError(t, err)
	require.Equal(t, 1, res.Written)
	got, _ = storedModel(t, kv, "x1")
	requireSameModel(t, truth, got)

	res, err = projector.Rebuild(t.Context(), js, 0, 0)
	require.NoError(t, err)
	require.Equal(t, rebuildCounts{Written: 0, Unchanged: 1}, rebuildCounts{res.Written, res.Unchanged}, "a model already right is left alone")
	right, err := kv.Get(t.Context(), "x1")
	require.NoError(t, err)

	// The same state stored with wrong step counts (what the list shows),
	// or as models were stored before the counts: both written again.
	wrongCounts := bytes.Replace(right.Value(), []byte(`"step_counts":{"steps":2,"done":2}`), []byte(`"step_counts":{"steps":2,"done":0}`), 1)
	require.NotEqual(t, right.Value(), wrongCounts)
	oldLayout, err := json.Marshal(truth)
	require.NoError(t, err)
	for name, doc := range map[string][]byte{"wrong counts": wrongCounts, "stored before the counts": oldLayout} {
		_, err = kv.Put(t.Context(), "x1", doc)
		require.NoError(t, err)
		res, err = projector.Rebuild(t.Context(), js, 0, 0)
		require.NoError(t, err)
		require.Equal(t, rebuildCounts{Written: 1}, rebuildCounts{res.Written, res.Unchanged}, name)
		now, err := kv.Get(t.Context(), "x1")
		require.NoError(t, err)
		require.Equal(t, string(right.Value()), string(now.Value()), name)
	}
}

type rebuildCounts struct{ Written, Unchanged int }

// TestRebuildQuarantinesHistoriesThatDoNotFold: one broken history does
// not stop the others from being rebuilt; its read model is written
// marked damaged, with where and why, and the rebuild reports it.
func TestRebuildQuarantinesHistoriesThatDoNotFold(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	twoStepHistory(t, js, "good")
	broken := appendHistory(t, js, "wf", "broken",
		&events.ExecutionStarted{Workflow: "wf", Version: 1, Steps: []events.StepRef{{ID: "s1", Kind: "noop"}}, Token: "t"},
		&events.StepSucceeded{StepID: "s1", Attempt: 1}) // succeeded before it was ever scheduled
	res, err := projector.Rebuild(t.Context(), js, 0, 0)
	require.NoError(t, err)
	require.Equal(t, 2, res.Written)
	require.Contains(t, res.Damaged, "broken")
	require.Equal(t, broken[1].Seq, res.Damaged["broken"].Seq)
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	x, ok := storedModel(t, kv, "good")
	require.True(t, ok)
	require.Equal(t, projections.StatusSucceeded, x.Status)
	require.Nil(t, x.Damaged)
	b, ok := storedModel(t, kv, "broken")
	require.True(t, ok)
	require.NotNil(t, b.Damaged)
	require.Equal(t, broken[1].Seq, b.Damaged.Seq)
	require.Equal(t, projections.StatusStarted, b.Status, "folded as far as it goes")
}

// TestProjectorQuarantinesDamagedHistories: a message that is no event,
// and a valid event naming another execution, each land in a running
// execution's history. The live projector marks that execution's read
// model damaged at the message (never applying it, never touching the
// execution it names), goes on projecting the others, and once a repair
// is recorded folds the history again, passing over the damaged event.
func TestProjectorQuarantinesDamagedHistories(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	p, err := projector.New(t.Context(), js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, p.Run)
	model := func(id string, ok func(projections.Execution) bool) projections.Execution {
		t.Helper()
		var x projections.Execution
		require.Eventually(t, func() bool {
			var found bool
			x, found = storedModel(t, kv, id)
			return found && ok(x)
		}, 20*time.Second, 20*time.Millisecond, "read model of %s", id)
		return x
	}

	steps := []events.StepRef{{ID: "s1", Kind: "noop"}}
	start := &events.ExecutionStarted{Workflow: "wf", Version: 1, Steps: steps, Token: "t"}
	for _, tc := range []struct {
		name  string
		write func(id string, last uint64) uint64 // writes the bad message, returns its sequence
	}{
		{"NotAnEvent", func(id string, last uint64) uint64 {
			ack, err := js.Publish(t.Context(), bus.ExecutionSubject("wf", id), []byte(`{"oops":true}`),
				jetstream.WithExpectLastSequencePerSubject(last))
			require.NoError(t, err)
			return ack.Sequence
		}},
		{"AnotherExecutionsEvent", func(id string, last uint64) uint64 {
			ev := events.New("by-hand", "victim", "wf", time.Now(), &events.ExecutionSucceeded{})
			seq, err := history.Append(t.Context(), js, bus.ExecutionSubject("wf", id), last, ev)
			require.NoError(t, err)
			return seq
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "x-" + strings.ToLower(tc.name)
			evs := appendHistory(t, js, "wf", id, start, &events.StepScheduled{StepID: "s1", Attempt: 1})
			model(id, func(x projections.Execution) bool { return x.LastSeq == evs[1].Seq })
			bad := tc.write(id, evs[1].Seq)

			x := model(id, func(x projections.Execution) bool { return x.Damaged != nil })
			require.Equal(t, bad, x.Damaged.Seq)
			require.NotEmpty(t, x.Damaged.Reason)
			require.Equal(t, projections.StatusStarted, x.Status, "the bad message is not applied")
			_, victim := storedModel(t, kv, "victim")
			require.False(t, victim, "an event naming another execution changes nothing of it")

			// The others go on.
			other := twoStepHistory(t, js, id+"-other")
			model(id+"-other", func(x projections.Execution) bool { return x.LastSeq == other[len(other)-1].Seq })

			// A repair: the fold passes over the bad message, and what
			// follows applies.
			rest := appendFrom(t, js, "wf", id, bad,
				&events.ExecutionRepaired{IgnoreSeq: bad, ActionRecord: events.ActionRecord{Action: events.ActionRepair, Command: "test#" + id}},
				&events.StepSending{StepID: "s1", Attempt: 1, TaskID: id + ".s1.1", Queue: "default"},
				&events.StepSent{StepID: "s1", Attempt: 1, TaskID: id + ".s1.1"}, &events.StepStarted{StepID: "s1", Attempt: 1, Agent: "ag"},
				&events.StepSucceeded{StepID: "s1", Attempt: 1, Agent: "ag"}, &events.ExecutionSucceeded{})
			x = model(id, func(x projections.Execution) bool { return x.LastSeq == rest[len(rest)-1].Seq })
			require.Nil(t, x.Damaged)
			require.Equal(t, projections.StatusSucceeded, x.Status)
			require.Equal(t, []uint64{bad}, x.Repairs)
		})
	}
}

// TestProjectorKeepsToTheExecutionsHistory: a message on another
// workflow's subject that carries the same execution id (written by hand)
// is not the execution's history: neither the live projector nor a
// rebuild lets it replace or damage the execution's read model.
func TestProjectorKeepsToTheExecutionsHistory(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	p, err := projector.New(t.Context(), js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, p.Run)

	evs := twoStepHistory(t, js, "v1")
	truth, err := projections.Fold(evs)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		x, ok := storedModel(t, kv, "v1")
		return ok && x.LastSeq == truth.LastSeq
	}, 20*time.Second, 20*time.Millisecond)

	_, err = js.Publish(t.Context(), bus.ExecutionSubject("other", "v1"), []byte(`{"x":1}`))
	require.NoError(t, err)
	forged := events.New("by-hand", "v1", "other", time.Now(), &events.ExecutionFailed{Error: "forged"})
	_, err = js.PublishMsg(t.Context(), mustEncode(t, bus.ExecutionSubject("other", "v1"), forged))
	require.NoError(t, err)
	// A later execution's events show when the projector got past them.
	later := twoStepHistory(t, js, "v2")
	require.Eventually(t, func() bool {
		x, ok := storedModel(t, kv, "v2")
		return ok && x.LastSeq == later[len(later)-1].Seq
	}, 20*time.Second, 20*time.Millisecond)
	got, _ := storedModel(t, kv, "v1")
	requireSameModel(t, truth, got)

	res, err := projector.Rebuild(t.Context(), js, 0, 0)
	require.NoError(t, err)
	require.Empty(t, res.Damaged)
	got, _ = storedModel(t, kv, "v1")
	requireSameModel(t, truth, got)
}

func mustEncode(t *testing.T, subject string, ev events.Event) *nats.Msg {
	t.Helper()
	msg, err := bus.Encode(subject, ev)
	require.NoError(t, err)
	return msg
}

// TestRedeliveredEventsOutOfOrderProjectToTheEnd: a projector that dies
// with events in hand has them redelivered to the next one, and
// JetStream may hand them back in another order than the stream's (here
// the last first). The read model must still be the fold up to the
// history's last event, not up to the event that happened to come last
// (found by the chaos suite: a read model left one event behind its
// history for good).
func TestRedeliveredEventsOutOfOrderProjectToTheEnd(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	evs := twoStepHistory(t, js, "x1")
	spec := bus.ProjectorConsumerSpec()
	cons, err := js.CreateOrUpdateConsumer(ctx, spec.Stream, spec.Config)
	require.NoError(t, err)
	// The projector that dies: it takes every event, has acknowledged all
	// but the last two, and those come back the last first.
	batch, err := cons.Fetch(len(evs), jetstream.FetchPriorityGroup(bus.ProjectorGroup), jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	require.NoError(t, batch.Error())
	require.Len(t, msgs, len(evs))
	for _, m := range msgs[:len(msgs)-2] {
		require.NoError(t, m.DoubleAck(ctx))
	}
	require.NoError(t, msgs[len(msgs)-1].Nak())
	require.NoError(t, msgs[len(msgs)-2].Nak())
	stream, err := js.Stream(ctx, bus.StreamEvents)
	require.NoError(t, err)
	require.NoError(t, stream.UnpinConsumer(ctx, bus.ConsumerProjector, bus.ProjectorGroup))

	natstest.Serve(t, newProjector(t, js, 0).Run)
	kv, err := js.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
	last := evs[len(evs)-1].Seq
	var stored uint64
	natstest.Eventually(t, 10*time.Second, func() bool {
		e, err := kv.Get(ctx, "x1")
		if err != nil {
			return false
		}
		var x projections.Execution
		if json.Unmarshal(e.Value(), &x) != nil {
			return false
		}
		stored = x.LastSeq
		return stored == last
	}, "read model at seq %d, the history ends at %d", stored, last)
}

// TestABatchOfManyExecutionsProjectsEach: events of many executions
// waiting when the projector starts come in batches of many executions,
// which it projects at once; each read model must still be exactly its
// history's fold, and an execution whose id also has events on another
// workflow's subject (written by hand) is projected from its own
// history alone, the two groups of one batch one after the other.
func TestABatchOfManyExecutionsProjectsEach(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	const n = 150
	truths := map[string]projections.Execution{}
	for i := range n {
		id := "many-" + strconv.Itoa(i)
		x, err := projections.Fold(twoStepHistory(t, js, id))
		require.NoError(t, err)
		truths[id] = x
		if i%50 == 7 { // a forged event for this id on another workflow's subject, in the same batch
			forged := events.New("by-hand", id, "other", time.Now(), &events.ExecutionFailed{Error: "forged"})
			_, err = js.PublishMsg(ctx, mustEncode(t, bus.ExecutionSubject("other", id), forged))
			require.NoError(t, err)
		}
	}
	logs := &svcruntest.Log{}
	p, err := projector.New(ctx, js, zerolog.New(io.MultiWriter(logs, zerolog.NewTestWriter(t))).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	natstest.Serve(t, p.Run)
	kv, err := js.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
	natstest.Eventually(t, 60*time.Second, func() bool {
		for id, truth := range truths {
			if x, ok := storedModel(t, kv, id); !ok || x.LastSeq != truth.LastSeq {
				return false
			}
		}
		return true
	}, "every read model at its history's last event")
	for id, truth := range truths {
		got, ok := storedModel(t, kv, id)
		require.True(t, ok, id)
		requireSameModel(t, truth, got)
	}
	// Projected at once, the forged group could have been taken for the
	// execution's own events (damaging its model) or raced its write
	// (a conflict, the events delivered again): it was not.
	out := logs.String()
	require.Equal(t, 3, strings.Count(out, "is not the execution's history"), "each forged event skipped once:\n%s", out)
	require.NotContains(t, out, "execution damaged")
	require.NotContains(t, out, "will be redelivered")
}

// stepsPayloads is the history of an execution of k noop steps, in order.
func stepsPayloads(id string, k int) []events.Payload {
	var steps []events.StepRef
	for i := range k {
		steps = append(steps, events.StepRef{ID: "s" + strconv.Itoa(i), Kind: "noop"})
	}
	ps := []events.Payload{&events.ExecutionStarted{Workflow: "wf", Version: 1, Input: json.RawMessage(`{}`), Steps: steps, Token: "t"}}
	for _, s := range steps {
		task := id + "." + s.ID + ".1"
		ps = append(ps, &events.StepScheduled{StepID: s.ID, Attempt: 1}, &events.StepSending{StepID: s.ID, Attempt: 1, TaskID: task, Queue: "default"},
			&events.StepSent{StepID: s.ID, Attempt: 1, TaskID: task}, &events.StepStarted{StepID: s.ID, Attempt: 1, Agent: "ag"},
			&events.StepSucceeded{StepID: s.ID, Attempt: 1, Agent: "ag"})
	}
	return append(ps, &events.ExecutionSucceeded{})
}

// TestUnderLoadReadModelsAreWrittenOnceForSeveralEvents: while events
// keep coming faster than one batch at a time (after a batch of many),
// the projector gathers them for its Coalesce, and writes each
// execution's read model once for several of its events; every read
// model still ends at its history's fold.
func TestUnderLoadReadModelsAreWrittenOnceForSeveralEvents(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	kv, err := js.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
	// A backlog, so that the projector's first batches are big ones
	// (of 64 events or more: then it gathers).
	for i := range 10 {
		appendHistory(t, js, "wf", "backlog-"+strconv.Itoa(i), stepsPayloads("backlog-"+strconv.Itoa(i), 10)...)
	}
	const n, k = 20, 10
	histories := map[string][]events.Payload{}
	for i := range n {
		id := "busy-" + strconv.Itoa(i)
		histories[id] = stepsPayloads(id, k)
	}
	writes := map[string]int{}
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()
	p := newProjector(t, js, 0)
	p.Coalesce = 2 * time.Second // long: a slow machine appends slowly
	natstest.Serve(t, p.Run)
	// The events of n executions, one of each in turn, as fast as they
	// can be appended.
	last := map[string]uint64{}
	total := 0
	began := time.Now()
	for j := range 2 + 5*k {
		for i := range n {
			id := "busy-" + strconv.Itoa(i)
			evs := appendFrom(t, js, "wf", id, last[id], histories[id][j])
			last[id] = evs[0].Seq
			total++
		}
	}
	appending := time.Since(began)
	seen := 0
	deadline := time.After(60 * time.Second)
	for seen < n {
		select {
		case e := <-w.Updates():
			if e == nil || !strings.HasPrefix(e.Key(), "busy-") {
				continue
			}
			writes[e.Key()]++
			var x projections.Execution
			require.NoError(t, json.Unmarshal(e.Value(), &x))
			if x.LastSeq == last[e.Key()] {
				seen++
			}
		case <-deadline:
			t.Fatalf("only %d of %d read models reached their last event in 60 s", seen, n)
		}
	}
	sum := 0
	for _, c := range writes {
		sum += c
	}
	t.Logf("%d events of %d executions, appended in %s, written as %d read models", total, n, appending, sum)
	require.LessOrEqual(t, 2*sum, total, "each read model written once for two events or more")
	// At most once per execution in each gathering while the events came
	// (and a few batches before the first big one, and after the last).
	windows := int(appending/p.Coalesce) + 5
	require.LessOrEqual(t, sum, n*windows, "each read model written about once per %s", p.Coalesce)
	for id := range histories {
		got, ok := storedModel(t, kv, id)
		require.True(t, ok, id)
		require.Equal(t, last[id], got.LastSeq, id)
		require.Equal(t, projections.StatusSucceeded, got.Status, id)
	}
}

// TestGatheringFollowsThePace: events that come fast (here of new
// executions, one each, as fast as they are appended) make the projector
// gather a Coalesce at a time, with no backlog to begin it, and events
// that come slowly afterwards make it stop: the mode follows the pace,
// not what came before. Before, only a backlog began gathering.
func TestGatheringFollowsThePace(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	p := newProjector(t, js, 0)
	p.Coalesce = time.Second
	natstest.Serve(t, p.Run)
	appended := atomic.Int64{}
	// trickle appends events of new executions, every apart (0: as fast
	// as they are appended), until stopped.
	trickle := func(prefix string, every time.Duration) (stop func()) {
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; ctx.Err() == nil; i++ {
				id := prefix + strconv.Itoa(i)
				ev := events.New("test", id, "wf", time.Now(), &events.ExecutionStarted{Workflow: "wf", Version: 1, Input: json.RawMessage(`{}`), Token: "t"})
				if _, err := history.Append(ctx, js, bus.ExecutionSubject("wf", id), 0, ev); err != nil {
					if ctx.Err() == nil {
						t.Errorf("append: %v", err)
					}
					return
				}
				appended.Add(1)
				select {
				case <-time.After(every):
				case <-ctx.Done():
				}
			}
		}()
		return func() { cancel(); <-done }
	}

	stop := trickle("fast-", 0)
	natstest.Eventually(t, 60*time.Second, func() bool { return p.Stats().Gathering },
		"gathering did not begin; %s events appended", natstest.Later(func() any { return appended.Load() }))
	stop()
	t.Logf("gathering began after %d events", appended.Load())

	// 20 a second, 20 a Coalesce: not enough to gather.
	defer trickle("slow-", 50*time.Millisecond)()
	natstest.Eventually(t, 60*time.Second, func() bool { return !p.Stats().Gathering }, "gathering did not end")
	from := appended.Load()
	for began := time.Now(); time.Since(began) < 3*p.Coalesce; time.Sleep(20 * time.Millisecond) {
		require.False(t, p.Stats().Gathering, "slow events do not make it gather")
	}
	require.Greater(t, appended.Load(), from, "the slow events came")
}

// TestALargeReadModelIsWrittenOnceForSeveralEvents: a batch whose read
// models took busyBytes or more makes the projector gather too, however
// few its events. One execution of 2 KB step outputs, whose events come
// one at a time, 20 ms apart (fewer than busyBatch in a Coalesce), once
// its model is some 300 KB, is written about once per Coalesce, not at
// every batch of a few events; its read model still ends at its last
// event. So is one of 70-190 KB, under three quarters of busyBytes: its
// events are weighed, each as its model's size, not the bytes written,
// or gathering (one write a Coalesce) would be judged slow and end, and
// begin again, a Coalesce in two.
func TestALargeReadModelIsWrittenOnceForSeveralEvents(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		k, first    int // steps in all, and before the projector starts
		least, most int // the model's size from the first
	}{
		{"OverBusyBytes", 300, 150, projector.BusyBytes, 1 << 30},
		{"WeighedByItsEvents", 100, 30, 64 << 10, projector.BusyBytes * 3 / 4},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			writtenOncePerCoalesce(t, c.k, c.first, c.least, c.most)
		})
	}
}

// writtenOncePerCoalesce appends the events of the first first of k
// steps of an execution, starts a projector, checks its model's size is
// within [least, most), then appends the next steps' events 20 ms apart,
// warm events and then the then events counted, and checks the model was
// written about once per Coalesce while the counted ones came.
func writtenOncePerCoalesce(t *testing.T, k, first, least, most int) {
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	kv, err := js.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
	const warm, then = 50, 200 // events: two Coalesces' at first, then those counted
	require.LessOrEqual(t, first+(warm+then)/5, k)
	ps := stepsPayloads("big", k)
	out := json.RawMessage(`{"blob":"` + strings.Repeat("x", 2000) + `"}`)
	for _, p := range ps {
		if s, ok := p.(*events.StepSucceeded); ok {
			s.Output = out
		}
	}
	head := 1 + 5*first // the start and the first steps' events
	evs := appendHistory(t, js, "wf", "big", ps[:head]...)
	last := evs[len(evs)-1].Seq
	p := newProjector(t, js, 0)
	p.Coalesce = 500 * time.Millisecond
	natstest.Serve(t, p.Run)
	w, err := kv.Watch(ctx, "big")
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()
	// until returns the last event of each write of the model until it
	// reached the event at seq.
	until := func(seq uint64) (written []uint64) {
		t.Helper()
		deadline := time.After(60 * time.Second)
		for {
			select {
			case e := <-w.Updates():
				if e == nil {
					continue // the end of the values stored before the watch
				}
				var x projections.Execution
				require.NoError(t, json.Unmarshal(e.Value(), &x))
				written = append(written, x.LastSeq)
				if x.LastSeq == seq {
					return written
				}
			case <-deadline:
				t.Fatalf("the read model did not reach sequence %d in 60 s", seq)
			}
		}
	}
	until(last)
	got, ok := storedModel(t, kv, "big")
	require.True(t, ok)
	b, err := json.Marshal(got)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(b), least, "the model's size from here on")
	require.Less(t, len(b), most, "the model's size from here on")

	// Two Coalesces' events before those counted, appended in one go
	// with them, so that the count begins with the pace judged: the
	// backlog's batch began gathering only if its pulls found busyBatch
	// events waiting, and otherwise the events of the next Coalesce are
	// written one by one before the pace is judged.
	const apart = 20 * time.Millisecond
	var began time.Time
	var warmed uint64 // the last event before those counted
	for i, p := range ps[head : head+warm+then] {
		if i == warm {
			began, warmed = time.Now(), last
		}
		evs := appendFrom(t, js, "wf", "big", last, p)
		last = evs[0].Seq
		time.Sleep(apart)
	}
	appending := time.Since(began)
	writes := 0
	for _, seq := range until(last) {
		if seq > warmed {
			writes++
		}
	}
	t.Logf("%d events appended one at a time in %s, written as %d read models", then, appending, writes)
	// A write a Coalesce, a few more, and a Coalesce's events written one
	// by one: on a loaded machine a stall of a Coalesce ends the gathering
	// (idle), and the pace is judged again a Coalesce later. Not
	// gathering, or gathering a Coalesce in two, writes several times as
	// many.
	windows := int(appending/p.Coalesce) + 5 + int(p.Coalesce/apart)
	require.LessOrEqual(t, writes, windows, "written about once per %s, not at every batch of a few events", p.Coalesce)
	got, ok = storedModel(t, kv, "big")
	require.True(t, ok)
	require.Equal(t, last, got.LastSeq)
	require.Len(t, got.Steps, k)
	b, err = json.Marshal(got)
	require.NoError(t, err)
	require.Less(t, len(b), most, "the model's size at its end")
}

// TestAfterALargeModelSmallOnesAreWrittenAtOnce: the gathering a large
// model's write began ends with it: once the projector has had nothing
// to do for a Coalesce, a small execution's events are each projected
// as they come, not held for a Coalesce (busy is the last batch's, not
// all the bytes ever written).
func TestAfterALargeModelSmallOnesAreWrittenAtOnce(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	kv, err := js.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
	ps := stepsPayloads("large", 300)
	out := json.RawMessage(`{"blob":"` + strings.Repeat("x", 2000) + `"}`)
	for _, p := range ps {
		if s, ok := p.(*events.StepSucceeded); ok {
			s.Output = out
		}
	}
	evs := appendHistory(t, js, "wf", "large", ps...)
	p := newProjector(t, js, 0)
	p.Coalesce = 4 * time.Second
	natstest.Serve(t, p.Run)
	natstest.Eventually(t, 60*time.Second, func() bool {
		x, ok := storedModel(t, kv, "large")
		return ok && x.LastSeq == evs[len(evs)-1].Seq
	}, "the large model is written")
	time.Sleep(p.Coalesce + 500*time.Millisecond) // any gathering it began is over

	small := stepsPayloads("small", 2)
	last := appendHistory(t, js, "wf", "small", small[0])[0].Seq
	natstest.Eventually(t, 60*time.Second, func() bool {
		x, ok := storedModel(t, kv, "small")
		return ok && x.LastSeq == last
	}, "the small model is written")
	// The next event, alone: written at once, not after a gathering.
	began := time.Now()
	last = appendFrom(t, js, "wf", "small", last, small[1])[0].Seq
	natstest.Eventually(t, 60*time.Second, func() bool {
		x, ok := storedModel(t, kv, "small")
		return ok && x.LastSeq == last
	}, "the small model is written again")
	require.Less(t, time.Since(began), p.Coalesce/2, "not held for a gathering of %s", p.Coalesce)
}

// TestProjectorBindsAgainWhenItsConsumerIsDeleted: a projector whose
// consumer is deleted under it (by hand, or by a tool) binds it again,
// here making it again as at start, and goes on projecting; it neither
// stops nor waits for ever for events its dead consumer will not bring.
func TestProjectorBindsAgainWhenItsConsumerIsDeleted(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	p, err := projector.New(t.Context(), js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, p.Run)
	projected := func(id string, evs []events.Event) func() bool {
		return func() bool {
			x, ok := storedModel(t, kv, id)
			return ok && x.LastSeq == evs[len(evs)-1].Seq
		}
	}
	before := twoStepHistory(t, js, "x1")
	natstest.Eventually(t, 30*time.Second, projected("x1", before), "x1 projected")
	natstest.Eventually(t, 30*time.Second, p.Bound, "the projector bound its consumer")

	require.NoError(t, js.DeleteConsumer(t.Context(), bus.StreamEvents, bus.ConsumerProjector))
	after := twoStepHistory(t, js, "x2")
	natstest.Eventually(t, 30*time.Second, projected("x2", after), "x2 projected once the consumer is bound again")
	natstest.Eventually(t, 30*time.Second, p.Bound, "the projector is bound again")
	_, err = js.Consumer(t.Context(), bus.StreamEvents, bus.ConsumerProjector)
	require.NoError(t, err, "the consumer was made again")
}

// TestWhenIdleAnExecutionsEventsAMomentApartAreWrittenOnce: not under
// load (batches of a few events), the projector waits its Gather after
// an event for the next ones, so one execution's events a moment apart
// (one execution at a time) are written in one read model, not one
// each, and the model ends at its history's fold.
func TestWhenIdleAnExecutionsEventsAMomentApartAreWrittenOnce(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	kv, err := js.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
	p := newProjector(t, js, 0)
	p.Gather = 500 * time.Millisecond // long: a slow machine appends slowly
	natstest.Serve(t, p.Run)
	ps := stepsPayloads("one", 5) // 27 events
	last := appendHistory(t, js, "wf", "one", ps[0])[0].Seq
	natstest.Eventually(t, 60*time.Second, func() bool {
		x, ok := storedModel(t, kv, "one")
		return ok && x.LastSeq == last
	}, "the first event is projected")

	w, err := kv.Watch(ctx, "one", jetstream.UpdatesOnly())
	require.NoError(t, err)
	defer func() { _ = w.Stop() }()
	began := time.Now()
	for _, e := range ps[1:] { // one by one, as a dispatcher records them
		last = appendFrom(t, js, "wf", "one", last, e)[0].Seq
	}
	appending := time.Since(began)
	writes := 0
	deadline := time.After(60 * time.Second)
	for done := false; !done; {
		select {
		case e := <-w.Updates():
			if e == nil {
				continue
			}
			writes++
			var x projections.Execution
			require.NoError(t, json.Unmarshal(e.Value(), &x))
			done = x.LastSeq == last
		case <-deadline:
			t.Fatalf("the read model did not reach its last event in 60 s (%d writes)", writes)
		}
	}
	t.Logf("%d events appended one by one in %s, written as %d read models", len(ps)-1, appending, writes)
	// At most once per gathering while the events came, and the last.
	require.LessOrEqual(t, writes, int(appending/p.Gather)+2, "written once for the events of each %s", p.Gather)
	require.Less(t, writes, len(ps)-1)
}
