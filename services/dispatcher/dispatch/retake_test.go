package dispatch

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/internal/metrics/metricstest"
)

// TestExecutionGoesOnAcrossARetake: the lease of the partition of a
// waiting execution expires under the dispatcher (as when its process is
// starved past the TTL: the server writes a marker) and nobody holds it;
// the dispatcher takes it back at once as a new holding of the same
// consuming (nothing released, no consumer reset), its cached state is
// not taken as current (another dispatcher may have held the partition in
// the stall) but checked against the history's last sequence: used if the
// history has not moved, read again if it has. The execution goes on to
// its end. Told afterwards that another did hold the partition meanwhile,
// it resets the partition's consumers.
func TestExecutionGoesOnAcrossARetake(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	defs, err := catalog.Open(ctx, js)
	require.NoError(t, err)
	def, err := workflow.Parse([]byte("name: twice\nsteps:\n  - {id: w1, kind: wait, signal: one}\n  - {id: w2, kind: wait, signal: two}\n"))
	require.NoError(t, err)
	_, _, err = defs.Apply(ctx, def)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	d, err := New(ctx, Config{Workers: 2, Metrics: m}, js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	natstest.Serve(t, d.Run)

	publish := func(subject string, p events.Payload) {
		ev := events.New("test", "", "", time.Now(), p)
		msg, err := bus.Encode(subject, ev)
		require.NoError(t, err)
		_, err = js.PublishMsg(ctx, msg, jetstream.WithMsgID(ev.ID))
		require.NoError(t, err)
	}
	history := func() []events.Type {
		evs, err := d.hist.Read(ctx, bus.ExecutionSubject("twice", "r1"), 0)
		if err != nil {
			return nil
		}
		var types []events.Type
		for _, ev := range evs {
			types = append(types, ev.Type)
		}
		return types
	}
	waiting := func(n int) func() bool {
		return func() bool {
			types := history()
			count := 0
			for _, ty := range types {
				if ty == events.TypeStepWaiting {
					count++
				}
			}
			return count == n && len(types) > 0 && types[len(types)-1] == events.TypeStepWaiting
		}
	}
	cachedState := func() *execState {
		d.mu.Lock()
		defer d.mu.Unlock()
		x, _ := d.cache.get("r1")
		return x
	}
	cachedEpoch := func() (uint64, bool) {
		x := cachedState()
		if x == nil {
			return 0, false
		}
		d.handling.lock("r1")() // x.epoch is the execution's handler's
		return x.epoch, true
	}
	p := d.partitionOf("r1")
	running := func() *consuming {
		d.parts.mu.Lock()
		defer d.parts.mu.Unlock()
		return d.parts.running[p]
	}

	publish(bus.SubjectStart, &events.StartExecution{Workflow: "twice", ExecutionID: "r1", Input: json.RawMessage(`{}`)})
	natstest.Eventually(t, 30*time.Second, waiting(1), "r1 waits for its first signal")
	// A state read while the lease had lapsed (a starved machine: the
	// renewal late) is cached with no holding; the test needs one read
	// in a holding: a reconcile has it read again.
	var nudged time.Time
	natstest.Eventually(t, 30*time.Second, func() bool {
		cached, ok := cachedEpoch()
		if ok && cached == 0 && time.Since(nudged) > 500*time.Millisecond {
			d.nudge("r1", "twice")
			nudged = time.Now()
		}
		return ok && cached > 0
	}, "r1's state is cached as read in a holding")
	var before uint64
	natstest.Eventually(t, 10*time.Second, func() bool {
		var ok bool
		before, ok = d.parts.table.Holds(p)
		return ok && running() != nil && running().epoch.Load() == before
	}, "the partition is held and consumed")
	// (A loaded machine may starve the dispatcher into retakes of its own:
	// epochs are compared by order, not equality.)
	cached, ok := cachedEpoch()
	require.True(t, ok, "the waiting execution is cached")
	require.Positive(t, cached, "read while the partition was held")
	require.LessOrEqual(t, cached, before)
	r := running()

	// The lease expires under the dispatcher: the server's marker.
	kv, err := js.KeyValue(ctx, bus.BucketDispatchers)
	require.NoError(t, err)
	require.NoError(t, kv.Purge(ctx, partition.LeaseKey(p)))
	var after uint64
	natstest.Eventually(t, 30*time.Second, func() bool {
		var ok bool
		after, ok = d.parts.table.Holds(p)
		return ok && after > before && r.epoch.Load() == after
	}, "the lease is taken back as a new holding, which the consuming follows")
	require.Same(t, r, running(), "the same consuming: nothing released, nothing reset")
	require.GreaterOrEqual(t, d.parts.table.Retaken(), int64(1))
	require.EqualValues(t, d.parts.table.Retaken(), metricstest.Value(t, reg, "jetflow_dispatcher_partition_retakes_total"), "every retake counted")
	cached, _ = cachedEpoch()
	require.Less(t, cached, after, "nothing read yet")
	// The lease is renewed every 250 ms of its 1 s: a loaded machine may
	// find it lapsed for a moment, so both are waited for.
	var from *consuming
	natstest.Eventually(t, 30*time.Second, func() bool { from = d.holding(p); return from != nil }, "the partition is held here")
	require.Same(t, r, from, "commands for the partition are handled here at once")
	from.done()
	require.True(t, d.parts.table.Await(ctx, p, before, 10*time.Second), "a job in hand from before the retake is handled, not handed back")

	kept := cachedState()
	publish(bus.SubjectSignal, &events.SignalExecution{ExecutionID: "r1", Name: "one"})
	natstest.Eventually(t, 30*time.Second, waiting(2), "r1 goes on to its second wait")
	cached, ok = cachedEpoch()
	require.True(t, ok)
	require.GreaterOrEqual(t, cached, after, "the state was found current in the new holding")
	require.Same(t, kept, cachedState(), "the history had not moved: the state cached before the retake was used, not read again")

	// Another retake, and another writer in the stall: the state cached
	// before it is behind the history, and is read again.
	before, _ = d.parts.table.Holds(p)
	require.NoError(t, kv.Purge(ctx, partition.LeaseKey(p)))
	natstest.Eventually(t, 30*time.Second, func() bool {
		var ok bool
		after, ok = d.parts.table.Holds(p)
		return ok && after > before && r.epoch.Load() == after
	}, "the lease is taken back again")
	behind := cachedState()
	last, err := d.hist.LastSeq(ctx, bus.ExecutionSubject("twice", "r1"))
	require.NoError(t, err)
	other := events.Event{ID: "other-1", Type: "io.jetflow.step.paused", Source: "another", Subject: "r1", Time: time.Now(),
		Ignorable: true, Raw: json.RawMessage(`{"step_id":"w2"}`)}
	msg, err := bus.Encode(bus.ExecutionSubject("twice", "r1"), other)
	require.NoError(t, err)
	ack, err := js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(last))
	require.NoError(t, err)
	conflicts := metricstest.Value(t, reg, "jetflow_dispatcher_conflicts_total")
	d.nudge("r1", "twice")
	natstest.Eventually(t, 30*time.Second, func() bool {
		x := cachedState()
		return x != nil && x != behind
	}, "the history had moved: the state is read again")
	x := cachedState()
	d.handling.lock("r1")()
	require.Equal(t, ack.Sequence, x.state.LastSeq, "the state read again has the other writer's event")
	require.Equal(t, conflicts, metricstest.Value(t, reg, "jetflow_dispatcher_conflicts_total"),
		"read again before the decision, not after one made on the state behind it")

	publish(bus.SubjectSignal, &events.SignalExecution{ExecutionID: "r1", Name: "two"})
	natstest.Eventually(t, 30*time.Second, func() bool {
		types := history()
		return len(types) > 0 && types[len(types)-1] == events.TypeExecutionSucceeded
	}, "r1 ends")

	require.Same(t, r, running(), "still the same consuming")

	// Told that another dispatcher held the partition in the stall, the
	// dispatcher resets the partition's consumers (what that one pulled
	// and did not hand back comes again now); told of a holding that is
	// not current, it leaves them. Stale messages, handled, show which: a
	// report, a firing and a notice of a timer r1 does not have.
	ref := events.TaskRef{TaskID: "t1", ExecutionID: "r1", Workflow: "twice", StepID: "w1", Attempt: 1, Token: "stale", Queue: "default"}
	publish(bus.ResultSubject(ref.Queue, ref.ExecutionID), &events.OperationStarted{TaskRef: ref})
	publish(bus.PartitionTimerSubject(p, "r1"), &events.FireTimer{ExecutionID: "r1", Workflow: "twice", TimerID: "nope"})
	publish(bus.PartitionNoticeSubject(p, "r1"), &events.TimerNotice{ExecutionID: "r1", Workflow: "twice", TimerID: "nope", Due: time.Now()})
	var stale []bus.Consumer
	for _, c := range bus.PartitionConsumers(d.durables(), p) {
		if c.Stream == bus.StreamResults || c.Stream == bus.StreamTimers {
			stale = append(stale, c)
		}
	}
	require.Len(t, stale, 3, "the reports', the timers' and the notices' consumers")
	delivered := func(c bus.Consumer) (n uint64, settled bool) {
		cons, err := js.Consumer(ctx, c.Stream, c.Config.Durable)
		if err != nil {
			return 0, false
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return 0, false
		}
		return info.Delivered.Consumer, info.NumAckPending == 0 && info.AckFloor.Consumer == info.Delivered.Consumer
	}
	for _, c := range stale {
		natstest.Eventually(t, 30*time.Second, func() bool { n, settled := delivered(c); return n > 0 && settled },
			"the stale message of %s is handled", c.Config.Durable)
	}
	d.heldMeanwhile(ctx, p, 0) // no holding of this dispatcher's
	for _, c := range stale {
		n, _ := delivered(c)
		require.Positive(t, n, "%s not reset for a holding that is not current", c.Config.Durable)
	}
	now, ok := d.parts.table.Current(p, after)
	require.True(t, ok)
	d.heldMeanwhile(ctx, p, now)
	for _, c := range stale {
		n, _ := delivered(c)
		require.Zero(t, n, "%s reset to the ack floor: nothing left to deliver, the count starts again", c.Config.Durable)
	}
}
