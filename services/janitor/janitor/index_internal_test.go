package janitor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
)

// TestWakeSaysWhatWaitingOnTimeSays: the index keeps wakeOf(x) instead
// of x; at any time, it must give the answer waitingOnTime(x, now)
// gives, for every kind of wait the sweep tells apart.
func TestWakeSaysWhatWaitingOnTimeSays(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC)
	base := func() projections.Execution {
		return projections.Execution{ID: "x", Workflow: "wf", Status: projections.StatusStarted, Steps: []projections.Step{
			{ID: "build", Kind: "exec", Status: projections.OpSucceeded, Attempt: 1},
			{ID: "nap", Kind: "sleep", Status: projections.OpWaiting, Attempt: 1},
		}}
	}
	timer := func(purpose string, step string, due time.Time, fired bool) projections.Timer {
		return projections.Timer{Purpose: purpose, StepID: step, Attempt: 1, Due: due, Fired: fired}
	}
	cases := map[string]func(*projections.Execution){
		"a signal, no timer": func(*projections.Execution) {},
		"a sleep": func(x *projections.Execution) {
			x.Timers = map[string]projections.Timer{"t1": timer(events.TimerSleep, "nap", t0, false)}
		},
		"two timers, the earlier rules": func(x *projections.Execution) {
			x.Timers = map[string]projections.Timer{"t1": timer(events.TimerSleep, "nap", t0.Add(time.Hour), false),
				"t2": timer(events.TimerStepTimeout, "nap", t0, false)}
		},
		"a timer fired, not acted on": func(x *projections.Execution) {
			x.Timers = map[string]projections.Timer{"t1": timer(events.TimerSleep, "nap", t0, true)}
		},
		"the workflow timed out": func(x *projections.Execution) {
			x.Timers = map[string]projections.Timer{"t1": timer(events.TimerSleep, "nap", t0.Add(time.Hour), false),
				"t2": timer(events.TimerWorkflowTimeout, "", t0, true)}
		},
		"nothing waits": func(x *projections.Execution) {
			x.Steps[1].Status = projections.OpSucceeded
			x.Timers = map[string]projections.Timer{"t1": timer(events.TimerSleep, "nap", t0, false)}
		},
		"a child to come": func(x *projections.Execution) {
			x.Steps = append(x.Steps, projections.Step{ID: "call", Kind: "workflow", Status: projections.OpPending, Child: "x-call"})
		},
		"a timer with no due time": func(x *projections.Execution) {
			x.Timers = map[string]projections.Timer{"t1": timer(events.TimerSleep, "nap", time.Time{}, false)}
		},
	}
	times := []time.Time{t0.Add(-time.Hour), t0, t0.Add(time.Minute - time.Nanosecond), t0.Add(time.Minute),
		t0.Add(time.Minute + time.Nanosecond), t0.Add(time.Hour + time.Minute), t0.Add(time.Hour + time.Minute + 1), t0.Add(24 * time.Hour)}
	for name, change := range cases {
		x := base()
		change(&x)
		wake := wakeOf(x)
		for _, now := range times {
			require.Equal(t, waitingOnTime(x, now), wake != 0 && nanos(now) <= wake, "%s, at %s (wake %d)", name, now, wake)
		}
	}
}

// TestPurgeMarkersKeepsAModelWrittenAgain: a marker is removed no
// further than its own revision, so a read model written under its key
// after the sweep read the marker stays.
func TestPurgeMarkersKeepsAModelWrittenAgain(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), "gone", []byte(`{}`))
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), "back", []byte(`{}`))
	require.NoError(t, err)
	require.NoError(t, kv.Delete(t.Context(), "gone"))
	require.NoError(t, kv.Delete(t.Context(), "back"))

	var ix modelIndex
	require.NoError(t, ix.refresh(t.Context(), kv, time.Now()))
	var markers []marker
	for key, x := range ix.entries {
		require.Equal(t, kindMarker, x.kind, key)
		markers = append(markers, marker{key: key, rev: x.rev})
	}
	require.Len(t, markers, 2)
	rev, err := kv.Put(t.Context(), "back", []byte(`{"id":"back"}`))
	require.NoError(t, err)

	require.NoError(t, ix.purgeMarkers(t.Context(), js, markers))
	_, err = kv.Get(t.Context(), "gone")
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
	e, err := kv.Get(t.Context(), "back")
	require.NoError(t, err)
	require.Equal(t, rev, e.Revision())
	status, err := kv.Status(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, 1, status.Values(), "gone's marker removed")
	require.NotContains(t, ix.entries, "gone")
}

// TestFlightsGoWithTheirModels: an execution's tasks in flight are kept
// only while its read model is the one they were read from: finished,
// deleted, written again with nothing in flight, or unreadable whole, it
// has none after the next sweep, and the map goes once empty.
func TestFlightsGoWithTheirModels(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	tasks, err := js.Stream(t.Context(), bus.StreamTasks)
	require.NoError(t, err)
	now := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	const idleAfter = 2 * time.Minute
	put := func(id string, v []byte) {
		t.Helper()
		_, err := kv.Put(t.Context(), id, v)
		require.NoError(t, err)
	}
	model := func(id string, status projections.Status, step projections.OpStatus) []byte {
		t.Helper()
		b, err := json.Marshal(projections.Execution{ID: id, Workflow: "wf", Version: 1, Status: status,
			Steps:     []projections.Step{{ID: "ship", Kind: "noop", Status: step, Attempt: 1, TaskSeq: 1000, Queue: "default"}},
			StartedAt: now.Add(-time.Hour), UpdatedAt: now.Add(-time.Hour), LastSeq: 9})
		require.NoError(t, err)
		return b
	}
	var ix modelIndex
	sweep := func() {
		t.Helper()
		require.NoError(t, ix.refresh(t.Context(), kv, now))
		out, look, check := ix.swept(now, idleAfter)
		again, err := ix.checkFlights(t.Context(), tasks, check, &out, zerolog.Nop())
		require.NoError(t, err)
		require.NoError(t, ix.lookAgain(t.Context(), kv, append(look, again...), now, idleAfter, &out, zerolog.Nop()))
	}
	ids := []string{"finishes", "deleted", "settles", "garbled"}
	for _, id := range ids {
		put(id, model(id, projections.StatusStarted, projections.OpStarted))
	}
	sweep()
	require.Len(t, ix.flights, len(ids), "each idle with a task in flight")

	put("finishes", model("finishes", projections.StatusSucceeded, projections.OpSucceeded))
	require.NoError(t, kv.Delete(t.Context(), "deleted"))
	put("settles", model("settles", projections.StatusStarted, projections.OpSucceeded))
	put("garbled", []byte(`{"id":"garbled","workflow":"wf","status":"started","updated_at":"2026-12-04T09:00:00Z","steps":"no table"}`))
	sweep()
	require.Nil(t, ix.flights, "none left, and the map let go")
}

// failingGets fails every get of a message, as a tasks stream away would.
type failingGets struct{}

func (failingGets) GetMsg(context.Context, uint64, ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	return nil, errors.New("nats: timeout")
}

// TestCheckFlightsTakesATaskItCannotReadToBeThere: a task whose get
// fails other than "not found" is taken to be in its queue, as sweepIdle
// takes it, and counted as an error; a sweep stopped stops the checks.
func TestCheckFlightsTakesATaskItCannotReadToBeThere(t *testing.T) {
	t.Parallel()
	ix := modelIndex{flights: map[string]flight{"x": {rev: 3, seqs: []uint64{7, 8}}, "y": {rev: 4}}}
	var out swept
	look, err := ix.checkFlights(t.Context(), failingGets{}, []string{"x", "y"}, &out, zerolog.Nop())
	require.NoError(t, err)
	require.Empty(t, look)
	require.Equal(t, 2, out.flying)
	require.Equal(t, 2, out.errors, "one a get")

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err = ix.checkFlights(ctx, failingGets{}, []string{"x"}, &out, zerolog.Nop())
	require.ErrorIs(t, err, context.Canceled)
}

// overlapGets answers a get only once another is in flight beside it (or
// after a minute: then the gets came one after another), and says a task
// is gone when its sequence is in gone.
type overlapGets struct {
	gone    map[uint64]bool
	mu      sync.Mutex
	waiting chan struct{} // closed by the first second get in flight at once
	met     bool          // waiting is closed
	flying  int           // gets in flight now
	most    int           // the most in flight at once
	alone   bool          // a get waited the whole minute
}

func (g *overlapGets) GetMsg(ctx context.Context, seq uint64, _ ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	g.mu.Lock()
	if g.flying++; g.flying == 2 && !g.met {
		g.met = true
		close(g.waiting)
	}
	g.most = max(g.most, g.flying)
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.flying--
		g.mu.Unlock()
	}()
	select {
	case <-g.waiting:
	case <-time.After(time.Minute):
		g.mu.Lock()
		g.alone = true
		g.mu.Unlock()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// A round trip's time, for the gets to overlap as far as the sweep
	// lets them (most).
	time.Sleep(5 * time.Millisecond)
	if g.gone[seq] {
		return nil, jetstream.ErrMsgNotFound
	}
	return &jetstream.RawStreamMsg{Sequence: seq}, nil
}

// TestCheckFlightsGetsTasksAtOnce: the tasks of several executions are
// got at once, not one round trip after another, and the executions with
// a task gone come back in the order they were asked about.
func TestCheckFlightsGetsTasksAtOnce(t *testing.T) {
	t.Parallel()
	ix := modelIndex{flights: map[string]flight{}}
	var keys []string
	gone := map[uint64]bool{}
	for i := range 40 {
		key := fmt.Sprintf("x%02d", i)
		keys = append(keys, key)
		ix.flights[key] = flight{rev: 1, seqs: []uint64{uint64(2 * i), uint64(2*i + 1)}}
		if i%3 == 0 {
			gone[uint64(2*i+1)] = true
		}
	}
	g := &overlapGets{gone: gone, waiting: make(chan struct{})}
	var out swept
	look, err := ix.checkFlights(t.Context(), g, keys, &out, zerolog.Nop())
	require.NoError(t, err)
	require.False(t, g.alone, "a get waited alone: the gets were made one after another")
	require.LessOrEqual(t, g.most, flightGets, "at most flightGets gets at once")
	var want []string
	for i := 0; i < 40; i += 3 {
		want = append(want, keys[i])
	}
	require.Equal(t, want, look, "the executions with a task gone, in order")
	require.Equal(t, 40-len(want), out.flying)
	require.Zero(t, out.errors)
}

// stoppingGets stops the sweep (cancel) at its after-th get, and counts
// the gets made.
type stoppingGets struct {
	mu     sync.Mutex
	gets   int
	after  int
	cancel context.CancelFunc
}

func (g *stoppingGets) GetMsg(ctx context.Context, seq uint64, _ ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	g.mu.Lock()
	g.gets++
	if g.gets == g.after {
		g.cancel()
	}
	g.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return nil, jetstream.ErrMsgNotFound // gone: a sweep that went on would read the models again
}

// TestCheckFlightsStoppedMidwayCountsNothing: a sweep stopped while its
// gets are under way returns the stop, counts nothing and hands out no
// more gets than were under way.
func TestCheckFlightsStoppedMidwayCountsNothing(t *testing.T) {
	t.Parallel()
	ix := modelIndex{flights: map[string]flight{}}
	var keys []string
	for i := range 1000 {
		key := fmt.Sprintf("x%03d", i)
		keys = append(keys, key)
		ix.flights[key] = flight{rev: 1, seqs: []uint64{uint64(i + 1)}}
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	g := &stoppingGets{after: 50, cancel: cancel}
	var out swept
	look, err := ix.checkFlights(ctx, g, keys, &out, zerolog.Nop())
	require.ErrorIs(t, err, context.Canceled)
	require.Nil(t, look)
	require.Zero(t, out.flying)
	require.Zero(t, out.errors)
	require.LessOrEqual(t, g.gets, 50+flightGets, "no get handed out after the stop but those under way")
}

// TestCatchUpReadsWhatSettled: between sweeps, a catch-up reads the
// models written before the last read asked where the bucket stood and
// not written since; the models written after it, or written again, are
// left to the next read. A read of every model (the first, or one due)
// it makes as a sweep does.
func TestCatchUpReadsWhatSettled(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	kv, err := js.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
	now := time.Now()
	put := func(id string) uint64 { return putRunning(t, kv, id, now) }
	rev := func(ix *modelIndex, id string) uint64 {
		t.Helper()
		x, ok := ix.entries[id]
		require.True(t, ok, "%s indexed", id)
		return x.rev
	}

	var ix modelIndex
	put("a")
	require.NoError(t, ix.catchUp(ctx, kv, now))
	require.Len(t, ix.entries, 1, "the first read is of every model")
	require.Equal(t, now, ix.readAll)

	b := put("b")
	put("c")
	require.NoError(t, ix.catchUp(ctx, kv, now))
	require.Len(t, ix.entries, 1, "written after the sweep asked where the bucket stood: not settled yet")

	c := put("c") // written again: the revision the catch-up could read is gone
	d := put("d")
	require.NoError(t, ix.catchUp(ctx, kv, now))
	require.Len(t, ix.entries, 2, "b settled; c written again, d after the last catch-up asked")
	require.Equal(t, b, rev(&ix, "b"))
	require.Equal(t, c, ix.next, "the next read starts at c's new revision")

	require.NoError(t, ix.catchUp(ctx, kv, now))
	require.Len(t, ix.entries, 4, "c and d settled since")
	require.Equal(t, c, rev(&ix, "c"))
	require.Equal(t, d, rev(&ix, "d"))
	require.Equal(t, d+1, ix.next)

	e := put("e")
	require.NoError(t, ix.refresh(ctx, kv, now))
	require.Equal(t, e, rev(&ix, "e"), "a sweep reads everything written since")
	f := put("f")
	later := now.Add(FullReadEvery)
	require.NoError(t, ix.catchUp(ctx, kv, later))
	require.Equal(t, later, ix.readAll, "a full read due, made whole")
	require.Equal(t, f, rev(&ix, "f"))
	require.Len(t, ix.entries, 6)
}

// TestRunCatchesUpBetweenSweeps: a running janitor reads the models that
// settled into its index between its sweeps.
func TestRunCatchesUpBetweenSweeps(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	j, err := New(Config{Interval: time.Hour}, js, zerolog.Nop())
	require.NoError(t, err)
	require.Equal(t, DefaultCatchUpEvery, j.catchUpEvery, "an hour between sweeps: catch-ups between them")
	for name, cfg := range map[string]Config{
		"sweeps as often":        {Interval: DefaultCatchUpEvery},
		"catch-ups turned off":   {Interval: time.Hour, CatchUpEvery: -1},
		"catch-ups as often too": {Interval: time.Minute, CatchUpEvery: 31 * time.Second},
	} {
		other, err := New(cfg, js, zerolog.Nop())
		require.NoError(t, err)
		require.Zero(t, other.catchUpEvery, name)
	}
	j.catchUpEvery = 20 * time.Millisecond
	kv, err := js.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
	put := func(id string) { putRunning(t, kv, id, time.Now()) }
	indexed := func(id string) func() bool {
		return func() bool {
			j.sweeping.Lock()
			defer j.sweeping.Unlock()
			_, ok := j.index.entries[id]
			return ok
		}
	}
	put("x1")
	natstest.Serve(t, j.Run)
	natstest.Eventually(t, 20*time.Second, indexed("x1"), "the first catch-up reads every model")
	put("x2")
	natstest.Eventually(t, 20*time.Second, indexed("x2"), "a model written since read once it settled")
}

// TestCatchUpCutShort: a catch-up whose read stops midway (the watch
// ends, as on a lost connection) keeps what it applied and starts the
// next read after it, not past the models it did not read; a deleted
// model's marker is read as any model.
func TestCatchUpCutShort(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	kv, err := js.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
	now := time.Now()
	var ix modelIndex
	require.NoError(t, ix.catchUp(ctx, kv, now), "the first read, of an empty bucket")
	for _, id := range []string{"a", "b", "c"} {
		putRunning(t, kv, id, now)
	}
	require.NoError(t, kv.Delete(ctx, "b")) // its marker, revision 4
	_, err = kv.Put(ctx, "d", []byte(`{"id":"d","workflow":"wf","status":"started"}`))
	require.NoError(t, err)
	require.NoError(t, ix.catchUp(ctx, kv, now))
	require.Empty(t, ix.entries, "nothing settled yet")

	require.Error(t, ix.catchUp(ctx, cutKV{KeyValue: kv, after: 2}, now), "the watch ended after a and c")
	require.Len(t, ix.entries, 2)
	require.Contains(t, ix.entries, "a")
	require.Contains(t, ix.entries, "c")
	require.EqualValues(t, 4, ix.next, "the next read starts at b's marker")

	require.NoError(t, ix.catchUp(ctx, kv, now))
	require.Len(t, ix.entries, 4)
	require.Equal(t, kindMarker, ix.entries["b"].kind)
	require.EqualValues(t, 6, ix.next)
}

// putRunning writes the read model of a running execution id, last
// updated at updated, and returns its revision.
func putRunning(t *testing.T, kv jetstream.KeyValue, id string, updated time.Time) uint64 {
	t.Helper()
	b, err := json.Marshal(projections.Execution{ID: id, Workflow: "wf", Status: projections.StatusStarted, UpdatedAt: updated})
	require.NoError(t, err)
	rev, err := kv.Put(t.Context(), id, b)
	require.NoError(t, err)
	return rev
}

// cutKV is a bucket whose watches end after their first after entries.
type cutKV struct {
	jetstream.KeyValue
	after int
}

func (c cutKV) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	w, err := c.KeyValue.WatchAll(ctx, opts...)
	if err != nil {
		return nil, err
	}
	cw := &cutWatcher{inner: w, out: make(chan jetstream.KeyValueEntry), done: make(chan struct{})}
	go func() {
		defer close(cw.out)
		for n := 0; n < c.after; n++ {
			var e jetstream.KeyValueEntry
			select {
			case e = <-w.Updates():
			case <-cw.done:
				return
			}
			select {
			case cw.out <- e:
			case <-cw.done:
				return
			}
			if e == nil {
				return
			}
		}
	}()
	return cw, nil
}

type cutWatcher struct {
	inner jetstream.KeyWatcher
	out   chan jetstream.KeyValueEntry
	done  chan struct{}
	once  sync.Once
}

func (w *cutWatcher) Updates() <-chan jetstream.KeyValueEntry { return w.out }

func (w *cutWatcher) Stop() error {
	w.once.Do(func() { close(w.done) })
	return w.inner.Stop()
}

// TestAnEntryStaysSmall: a janitor keeps an entry per execution kept,
// finished ones for days, so the entry is most of its memory per
// execution (with the map's room and the key). It holds its names by one
// interned handle, and fits in 64 bytes; two models of the same names
// share them.
func TestAnEntryStaysSmall(t *testing.T) {
	t.Parallel()
	require.LessOrEqual(t, unsafe.Sizeof(indexed{}), uintptr(64))
	a := indexed{kind: kindModel, names: namesOf("orders", "7d", "eu", projections.StatusSucceeded)}
	b := indexed{kind: kindModel, names: namesOf("orders", "7d", "eu", projections.StatusSucceeded)}
	require.Equal(t, a.names, b.names, "one interned value for both")
	require.Equal(t, "orders", a.workflow())
	require.Equal(t, "eu", a.retentionKey())
	require.Equal(t, "7d", a.rule().Value())
	require.Equal(t, projections.StatusSucceeded, a.status())
}
