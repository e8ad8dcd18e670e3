package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/internal/svcruntest"
)

// fireBundle is a running dispatcher whose executions sleep for an hour,
// so that the test fires their timers itself, through recordFires.
type fireBundle struct {
	js jetstream.JetStream
	d  *Dispatcher
}

func setupFires(t *testing.T) *fireBundle {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	defs, err := catalog.Open(t.Context(), js)
	require.NoError(t, err)
	for _, src := range []string{
		"name: nap\nsteps:\n  - {id: nap, kind: sleep, duration: 1h}\n",
		// Two events more before its sleep than nap's.
		"name: letnap\nsteps:\n  - {id: a, kind: let, vars: {x: 1}}\n  - {id: nap, kind: sleep, duration: 1h}\n",
		// Its sleep's end does not end it: a let follows.
		"name: naplet\nsteps:\n  - {id: nap, kind: sleep, duration: 1h}\n  - {id: a, kind: let, vars: {x: 1}}\n",
		"name: waitto\nsteps:\n  - {id: w, kind: wait, signal: go, timeout: 1h}\n",
	} {
		def, err := workflow.Parse([]byte(src))
		require.NoError(t, err)
		_, _, err = defs.Apply(t.Context(), def)
		require.NoError(t, err)
	}
	d, err := New(t.Context(), Config{}, js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	natstest.Serve(t, d.Run)
	return &fireBundle{js: js, d: d}
}

// asleep starts an execution of wf and waits until it sleeps; it returns
// the FireTimer the server would deliver when its sleep comes due.
func (b *fireBundle) asleep(t *testing.T, wf, id string) events.Event {
	t.Helper()
	ev := events.New("test", "", "", time.Now(), &events.StartExecution{Workflow: wf, ExecutionID: id})
	msg, err := bus.Encode(bus.SubjectStart, ev)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(ev.ID))
	require.NoError(t, err)
	return b.sleeping(t, wf, id)
}

// sleeping waits until execution id of wf sleeps, and returns the
// FireTimer the server would deliver when its sleep comes due.
func (b *fireBundle) sleeping(t *testing.T, wf, id string) events.Event {
	t.Helper()
	var timerID string
	natstest.Eventually(t, 30*time.Second, func() bool {
		evs, err := history.Read(t.Context(), b.js, bus.ExecutionSubject(wf, id), 0)
		if err != nil || len(evs) == 0 || evs[len(evs)-1].Type != events.TypeStepWaiting {
			return false
		}
		for _, e := range evs {
			if a := events.ArmingOf(e.Data); a != nil { // the sleep's wait records it (docs/adr/0018)
				timerID = a.TimerID
			}
		}
		return timerID != ""
	}, "%s sleeps", id)
	// The worker that recorded the sleep may still hold the execution (a
	// loaded machine slows its last steps): a batch would leave it to it.
	natstest.Eventually(t, 30*time.Second, func() bool {
		unlock, ok := b.d.handling.tryLock(id)
		if ok {
			unlock()
		}
		return ok
	}, "the dispatcher is done with %s", id)
	return events.New("jetflow/dispatcher", id, wf, time.Now(), &events.FireTimer{ExecutionID: id, Workflow: wf, TimerID: timerID})
}

// fireJob is the job of a fired timer's message as a consumer delivers it.
func fireJob(ev events.Event) job {
	return job{ev: ev, key: ev.Data.(*events.FireTimer).ExecutionID, alive: time.Now()}
}

// history returns the types of an execution's events, and checks that
// its history is linear.
func (b *fireBundle) history(t *testing.T, wf, id string) []events.Type {
	t.Helper()
	evs := b.events(t, wf, id)
	out := make([]events.Type, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

// firings counts the events of evs that record a timer's firing.
func firings(evs []events.Event) int {
	n := 0
	for _, e := range evs {
		if events.FiringOf(e.Data) != "" {
			n++
		}
	}
	return n
}

// events returns an execution's events, and checks that its history is
// linear.
func (b *fireBundle) events(t *testing.T, wf, id string) []events.Event {
	t.Helper()
	evs, err := history.Read(t.Context(), b.js, bus.ExecutionSubject(wf, id), 0)
	require.NoError(t, err)
	require.NoError(t, history.Linear(evs))
	return evs
}

// finish handles a fired timer's message as a worker does after the
// batch, and checks that the execution ended with its timer recorded
// fired once.
func (b *fireBundle) finish(t *testing.T, ev events.Event) {
	t.Helper()
	require.NoError(t, b.d.handle(t.Context(), ev))
	p := ev.Data.(*events.FireTimer)
	evs := b.events(t, p.Workflow, p.ExecutionID)
	types := b.history(t, p.Workflow, p.ExecutionID)
	require.Equal(t, 1, firings(evs), "%s: %v", p.ExecutionID, types)
	require.Equal(t, events.TypeExecutionSucceeded, types[len(types)-1], "%s: %v", p.ExecutionID, types)
}

func (b *fireBundle) isCached(id string) bool {
	b.d.mu.Lock()
	defer b.d.mu.Unlock()
	_, ok := b.d.cache.get(id)
	return ok
}

// TestFiresRecordedInABatch: the firings of several executions are
// recorded by one batch, each once, and the workers then end their
// sleeps; a second firing of one execution in the same batch (a
// redelivery) is left to a worker and records nothing more. A sleep's
// firing is recorded by its success (docs/adr/0017): carried by the end
// of an execution it ends, which leaves the cache and the workers
// nothing to do; alone where a step follows. A state the dispatcher had
// cached (the firing is applied to it in place) is then the fold of its
// history.
func TestFiresRecordedInABatch(t *testing.T) {
	t.Parallel()
	b := setupFires(t)
	wfs := []string{"nap", "naplet", "nap"}
	var fired []events.Event
	for i, wf := range wfs {
		fired = append(fired, b.asleep(t, wf, fmt.Sprintf("n%d", i)))
	}
	_, _, err := b.d.load(t.Context(), "naplet", "n1", loading{}) // cached (a long sleep is not: a read puts it back)
	require.NoError(t, err)
	require.True(t, b.isCached("n1"))
	batch := []job{fireJob(fired[0]), fireJob(fired[1]), fireJob(fired[2]), fireJob(fired[1])}
	out := b.d.recordFires(t.Context(), batch)
	require.Len(t, out, 4)
	for i, wf := range wfs {
		require.True(t, out[i].recorded, "firing %d", i)
		require.NoError(t, out[i].err)
		evs := b.events(t, wf, fmt.Sprintf("n%d", i))
		last := evs[len(evs)-1]
		require.Equal(t, fired[i].Data.(*events.FireTimer).TimerID, events.FiringOf(last.Data), "the batch's event records the firing")
		require.Equal(t, 1, firings(evs))
		if wf == "nap" {
			require.Equal(t, events.TypeExecutionSucceeded, last.Type, "the sleep's end ends the execution")
			require.True(t, out[i].ended)
			require.False(t, b.isCached(fmt.Sprintf("n%d", i)), "an ended execution leaves the cache")
		} else {
			require.Equal(t, events.TypeStepSucceeded, last.Type)
			require.False(t, out[i].ended)
		}
	}
	evs := b.events(t, "naplet", "n1")
	want, err := projections.Fold(evs)
	require.NoError(t, err)
	b.d.mu.Lock()
	x, ok := b.d.cache.get("n1")
	b.d.mu.Unlock()
	require.True(t, ok, "n1's state stays cached")
	require.NoError(t, x.torn)
	require.Equal(t, want, x.state, "the cached state is the history's fold")
	require.False(t, out[3].recorded, "the second firing of n1 in the batch")
	require.NoError(t, out[3].err)
	for _, j := range batch {
		b.finish(t, j.ev)
	}
}

// TestFireBatchWithAConflict: another writer appended to one execution's
// history after this dispatcher cached it; the batch's append to it
// conflicts and changes nothing, the others are recorded, and the
// worker, reading its history again, decides anew: the other writer
// recorded the firing already, so the sleep ends with one timer.fired.
func TestFireBatchWithAConflict(t *testing.T) {
	t.Parallel()
	b := setupFires(t)
	var fired []events.Event
	for i := range 3 {
		fired = append(fired, b.asleep(t, "nap", fmt.Sprintf("c%d", i)))
	}
	// The dispatcher holds c1's state (an hour's sleep leaves the cache,
	// projections.Dormant: a read puts it back), then another dispatcher
	// records c1's firing.
	_, _, err := b.d.load(t.Context(), "nap", "c1", loading{})
	require.NoError(t, err)
	subject := bus.ExecutionSubject("nap", "c1")
	last, err := b.d.hist.LastSeq(t.Context(), subject)
	require.NoError(t, err)
	other := events.New("other-dispatcher", "c1", "nap", time.Now(), &events.TimerFired{TimerID: fired[1].Data.(*events.FireTimer).TimerID})
	other.PrevSeq = last
	_, err = b.d.hist.Append(t.Context(), subject, last, other)
	require.NoError(t, err)
	require.True(t, b.isCached("c1"), "the dispatcher holds c1's state from before the other's append")

	out := b.d.recordFires(t.Context(), []job{fireJob(fired[0]), fireJob(fired[1]), fireJob(fired[2])})
	require.True(t, out[0].recorded)
	require.True(t, out[2].recorded)
	require.False(t, out[1].recorded)
	require.True(t, errors.Is(out[1].err, bus.ErrConflict), "c1: %v", out[1].err)
	require.False(t, b.isCached("c1"), "a conflicting state leaves the cache")
	for _, ev := range fired {
		b.finish(t, ev)
	}
}

// TestFireBatchWithAFailedAppend: the events stream refuses one
// execution's append (its history is at the stream's per-subject limit);
// the others of the batch are recorded, that one is not, and its state
// leaves the cache. Once the stream takes it again, the worker records
// its firing once.
func TestFireBatchWithAFailedAppend(t *testing.T) {
	t.Parallel()
	b := setupFires(t)
	fired := []events.Event{b.asleep(t, "nap", "f0"), b.asleep(t, "letnap", "f1"), b.asleep(t, "nap", "f2")}
	full := b.history(t, "letnap", "f1")
	require.Greater(t, len(full), len(b.history(t, "nap", "f0")), "letnap's history is the longer")

	stream, err := b.js.Stream(t.Context(), bus.StreamEvents)
	require.NoError(t, err)
	cfg := stream.CachedInfo().Config
	limited := cfg
	limited.MaxMsgsPerSubject, limited.DiscardNewPerSubject = int64(len(full)), true
	_, err = b.js.UpdateStream(t.Context(), limited)
	require.NoError(t, err)

	_, _, err = b.d.load(t.Context(), "letnap", "f1", loading{}) // cached (a long sleep is not: a read puts it back)
	require.NoError(t, err)
	require.True(t, b.isCached("f1"))
	out := b.d.recordFires(t.Context(), []job{fireJob(fired[0]), fireJob(fired[1]), fireJob(fired[2])})
	require.True(t, out[0].recorded)
	require.True(t, out[2].recorded)
	require.False(t, out[1].recorded)
	require.Error(t, out[1].err)
	require.False(t, bus.IsConflict(out[1].err), "not a conflict: %v", out[1].err)
	require.Equal(t, full, b.history(t, "letnap", "f1"), "nothing appended to f1")
	require.False(t, b.isCached("f1"), "a failed append's state leaves the cache")

	_, err = b.js.UpdateStream(t.Context(), cfg)
	require.NoError(t, err)
	for _, ev := range fired {
		b.finish(t, ev)
	}
}

// TestRedeliveredFireRecordedOnce: a dispatcher recorded a firing and
// stopped before acting on it (or before acknowledging the end that
// recorded it); the message is delivered again to a dispatcher without
// the state cached. The batch reads the history, sees the firing
// recorded, and leaves the message to a worker, which goes on from it
// (naplet: the let after the sleep, then the end) or finds the execution
// ended (nap): the firing recorded once.
func TestRedeliveredFireRecordedOnce(t *testing.T) {
	t.Parallel()
	b := setupFires(t)
	for _, wf := range []string{"nap", "naplet"} {
		ev := b.asleep(t, wf, "r-"+wf)
		out := b.d.recordFires(t.Context(), []job{fireJob(ev)})
		require.True(t, out[0].recorded)
		require.Equal(t, wf == "nap", out[0].ended)
		b.d.evict("r-" + wf) // as a dispatcher that has not seen it

		out = b.d.recordFires(t.Context(), []job{fireJob(ev)})
		require.False(t, out[0].recorded, "recorded already")
		require.NoError(t, out[0].err)
		require.Equal(t, 1, firings(b.events(t, wf, "r-"+wf)), "%v", b.history(t, wf, "r-"+wf))
		b.finish(t, ev)
	}
}

// TestTimersDueTogether: executions whose sleeps end at the same instant
// all end, each with its timer recorded fired once, after it was due
// (through the consumers, the fire loop's batches and the workers).
func TestTimersDueTogether(t *testing.T) {
	t.Parallel()
	b := setupFires(t)
	def, err := workflow.Parse([]byte("name: at\nsteps:\n  - {id: nap, kind: sleep, until: '${input.due}'}\n"))
	require.NoError(t, err)
	defs, err := catalog.Open(t.Context(), b.js)
	require.NoError(t, err)
	_, _, err = defs.Apply(t.Context(), def)
	require.NoError(t, err)

	const n = 200
	due := time.Now().Add(3 * time.Second).UTC()
	input := []byte(fmt.Sprintf(`{"due":%q}`, due.Format(time.RFC3339Nano)))
	for i := range n {
		ev := events.New("test", "", "", time.Now(), &events.StartExecution{Workflow: "at", ExecutionID: fmt.Sprintf("a%d", i), Input: input})
		msg, err := bus.Encode(bus.SubjectStart, ev)
		require.NoError(t, err)
		_, err = b.js.PublishMsgAsync(msg, jetstream.WithMsgID(ev.ID))
		require.NoError(t, err)
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("start commands not stored")
	}
	stream, err := b.js.Stream(t.Context(), bus.StreamEvents)
	require.NoError(t, err)
	ended := func(id string) bool {
		m, err := stream.GetLastMsgForSubject(t.Context(), bus.ExecutionSubject("at", id))
		return err == nil && events.Type(m.Header.Get("ce-type")) == events.TypeExecutionSucceeded
	}
	natstest.Eventually(t, 90*time.Second, func() bool {
		for i := range n {
			if !ended(fmt.Sprintf("a%d", i)) {
				return false
			}
		}
		return true
	}, "every execution ends")
	for i := range n {
		evs, err := history.Read(t.Context(), b.js, bus.ExecutionSubject("at", fmt.Sprintf("a%d", i)), 0)
		require.NoError(t, err)
		require.NoError(t, history.Linear(evs))
		fired := 0
		for _, e := range evs {
			if events.FiringOf(e.Data) != "" {
				fired++
				require.False(t, e.Time.Before(due), "a%d fired at %s, before %s", i, e.Time, due)
			}
		}
		require.Equal(t, 1, fired, "a%d", i)
	}
}

// TestATimeoutIsNotBatched: a batch records only the firings nothing in
// between can overturn (a sleep's end, a retry's backoff). A wait's
// timeout recorded by a batch and acted on later by a worker would lose
// to a signal handled in between; it is left to the worker, which
// records the firing and the wait's failure in one turn, so a signal
// after it is too late.
func TestATimeoutIsNotBatched(t *testing.T) {
	t.Parallel()
	b := setupFires(t)
	fire := b.asleep(t, "waitto", "t1") // waits for a signal, an hour at most
	before := b.history(t, "waitto", "t1")
	out := b.d.recordFires(t.Context(), []job{fireJob(fire)})
	require.Len(t, out, 1)
	require.False(t, out[0].recorded, "a timeout's firing goes to the workers")
	require.Equal(t, before, b.history(t, "waitto", "t1"), "the batch appended nothing")

	require.NoError(t, b.d.handle(t.Context(), fire))
	evs := b.history(t, "waitto", "t1")
	require.Greater(t, len(evs), len(before)+1)
	require.Equal(t, events.TypeTimerFired, evs[len(before)])
	require.Equal(t, events.TypeStepFailed, evs[len(before)+1], "the wait fails with its firing, in the same turn")
}

// heldMsg is a message only compared by identity.
type heldMsg struct{ jetstream.Msg }

// TestFireJobsInHandAreKeptAlive: a job a recorder took (loading,
// appending, or holding it while more timers come due) is kept alive as
// a queued one is, until it is handed on with when it was last kept
// alive.
func TestFireJobsInHandAreKeptAlive(t *testing.T) {
	t.Parallel()
	q := newFireQueue()
	t0 := time.Date(2026, 11, 25, 0, 0, 0, 0, time.UTC)
	m := &heldMsg{}
	q.add(job{msg: m, key: "x1", alive: t0})
	every := func(job) time.Duration { return time.Second }
	require.Empty(t, q.due(t0.Add(500*time.Millisecond), every))
	taken := q.take(fireBatchMax)
	require.Len(t, taken, 1)
	require.Equal(t, []jetstream.Msg{m}, q.due(t0.Add(time.Second), every), "in hand: kept alive")
	require.Empty(t, q.due(t0.Add(1500*time.Millisecond), every), "a beat ago")
	j := q.release(taken[0])
	require.Equal(t, t0.Add(time.Second), j.alive, "handed on with its last beat")
	require.Empty(t, q.due(t0.Add(time.Hour), every), "handed on: the turns keep it alive now")
}

// TestAStartCutShortIsNotDropped: a start whose handling is cut short by
// the dispatcher stopping (its catalog read cancelled) is handed back,
// not dropped as a command that can never be applied: the next
// dispatcher starts it.
func TestAStartCutShortIsNotDropped(t *testing.T) {
	t.Parallel()
	b := setupFires(t)
	ev := events.New("test", "", "", time.Now(), &events.StartExecution{Workflow: "nap", ExecutionID: "cut-short"})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := b.d.handle(ctx, ev)
	require.Error(t, err)
	var perm permanentError
	require.False(t, errors.As(err, &perm), "a read cancelled by the stop is not permanent: %v", err)
}

// TestATimerFiringAfterTheEndIsNoNews: a timer's message that comes
// after its execution ended (the schedule kept as the guarantee of a
// timer fired from memory) changes nothing, and says so at debug only: a
// newcomer read it at info as something gone wrong.
func TestATimerFiringAfterTheEndIsNoNews(t *testing.T) {
	t.Parallel()
	b := setupFires(t)
	fire := b.asleep(t, "nap", "n-late")
	b.finish(t, fire)

	var logs svcruntest.Log
	ctx := zerolog.New(&logs).Level(zerolog.DebugLevel).WithContext(t.Context())
	require.NoError(t, b.d.handle(ctx, fire), "the same timer's message again")
	line := logs.Line("command changes nothing")
	require.NotNil(t, line, "%s", logs.String())
	require.Equal(t, "debug", line["level"])
	require.Equal(t, "the execution has ended", line["reason"])
}

// TestOtherCommandsThatChangeNothingSayItAtInfo: only a timer's message
// is demoted to debug; any other command that changes nothing (here the
// janitor's expiry of an execution that is still asleep, not ended) is
// worth an operator's notice and stays at info.
func TestOtherCommandsThatChangeNothingSayItAtInfo(t *testing.T) {
	t.Parallel()
	b := setupFires(t)
	fire := b.asleep(t, "nap", "n-kept")

	var logs svcruntest.Log
	ctx := zerolog.New(&logs).Level(zerolog.DebugLevel).WithContext(t.Context())
	expire := events.New("jetflow/janitor", "n-kept", "nap", time.Now(),
		&events.ExpireExecution{ExecutionID: "n-kept", Workflow: "nap", LastSeq: 1, Rule: "1", Group: "nap"})
	require.NoError(t, b.d.handle(ctx, expire))
	line := logs.Line("command changes nothing")
	require.NotNil(t, line, "%s", logs.String())
	require.Equal(t, "info", line["level"])
	require.Contains(t, line["reason"], "expire: the execution changed since the janitor looked")
	require.NotContains(t, b.history(t, "nap", "n-kept"), events.TypeExecutionExpired, "the execution is kept")
	b.finish(t, fire)
}

// TestAnEndRecordedInABatchIsLogged: an execution that a batch ends says
// so in the log, as one a worker ends does.
func TestAnEndRecordedInABatchIsLogged(t *testing.T) {
	t.Parallel()
	b := setupFires(t)
	fire := b.asleep(t, "nap", "logged")
	var logs svcruntest.Log
	d, err := New(t.Context(), Config{}, b.js, zerolog.New(&logs))
	require.NoError(t, err)
	out := d.recordFires(t.Context(), []job{fireJob(fire)})
	require.True(t, out[0].ended)
	line := logs.Line("execution succeeded")
	require.NotNil(t, line, "%s", logs.String())
	require.Equal(t, "logged", line["execution_id"])
	require.Equal(t, fire.Data.(*events.FireTimer).TimerID, line["timer_id"], "as a worker's fireTimer says it")
	require.Equal(t, "info", line["level"])
}

// TestAChildEndedByItsSleepTellsItsParent: a child execution whose sleep
// ends it is not ended by the fire loop's batch, which would acknowledge
// its message with nobody telling the parent: a worker records the end
// and tells the parent, which then goes on to its own end.
func TestAChildEndedByItsSleepTellsItsParent(t *testing.T) {
	t.Parallel()
	b := setupFires(t)
	defs, err := catalog.Open(t.Context(), b.js)
	require.NoError(t, err)
	def, err := workflow.Parse([]byte("name: dad\nsteps:\n  - {id: kid, kind: workflow, workflow: nap, child: true}\n"))
	require.NoError(t, err)
	_, _, err = defs.Apply(t.Context(), def)
	require.NoError(t, err)
	ev := events.New("test", "", "", time.Now(), &events.StartExecution{Workflow: "dad", ExecutionID: "dad1"})
	msg, err := bus.Encode(bus.SubjectStart, ev)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(ev.ID))
	require.NoError(t, err)
	var child string
	natstest.Eventually(t, 30*time.Second, func() bool {
		evs, err := history.Read(t.Context(), b.js, bus.ExecutionSubject("dad", "dad1"), 0)
		if err != nil {
			return false
		}
		for _, e := range evs {
			if c, ok := e.Data.(*events.StepChildStarted); ok {
				child = c.ExecutionID
			}
		}
		return child != ""
	}, "the child starts")
	fire := b.sleeping(t, "nap", child)

	q := newFireQueue()
	m := &ackMsg{}
	q.add(job{msg: m, ev: fire, key: child, alive: time.Now()})
	handed := make(chan job, 1)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); b.d.fireLoop(t.Context(), q, func(j job) { handed <- j }, stop) }()
	stopLoop := sync.OnceFunc(func() { close(stop); <-done })
	defer stopLoop()
	var j job
	for j.msg == nil {
		select {
		case j = <-handed:
		case <-time.After(10 * time.Millisecond):
			require.Zero(t, m.acks.Load(), "acknowledged by the loop: the parent would never be told")
		case <-time.After(30 * time.Second):
			t.Fatal("the child's firing was not handed to a worker")
		}
	}
	stopLoop()
	require.Zero(t, m.acks.Load(), "not acknowledged by the loop")
	b.finish(t, j.ev) // the worker records the end, and tells the parent
	natstest.Eventually(t, 30*time.Second, func() bool {
		evs, err := history.Read(t.Context(), b.js, bus.ExecutionSubject("dad", "dad1"), 0)
		return err == nil && len(evs) > 0 && evs[len(evs)-1].Type == events.TypeExecutionSucceeded
	}, "the parent ends once its child ended")
}

// ackMsg is a fired timer's message that counts its acknowledgements.
type ackMsg struct {
	jetstream.Msg
	acks atomic.Int32
}

func (m *ackMsg) Ack() error { m.acks.Add(1); return nil }
func (m *ackMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return nil, errors.New("a test's message has no metadata")
}

// TestTheFireLoopFinishesWhatItsBatchEnded: a sleep whose end ended its
// execution in the fire loop's batch leaves the workers nothing to do:
// the loop acknowledges its message itself once the end is stored, and
// hands on only the firing after which the execution goes on (a worker
// acts on it, then acknowledges it).
func TestTheFireLoopFinishesWhatItsBatchEnded(t *testing.T) {
	t.Parallel()
	b := setupFires(t)
	ends, goesOn := b.asleep(t, "nap", "e0"), b.asleep(t, "naplet", "e1")
	q := newFireQueue()
	endsMsg, goesOnMsg := &ackMsg{}, &ackMsg{}
	q.add(job{msg: endsMsg, ev: ends, key: "e0", alive: time.Now()})
	q.add(job{msg: goesOnMsg, ev: goesOn, key: "e1", alive: time.Now()})
	handed := make(chan job, 2)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); b.d.fireLoop(t.Context(), q, func(j job) { handed <- j }, stop) }()
	select {
	case j := <-handed:
		require.Equal(t, "e1", j.key, "only the firing after which the execution goes on is handed on")
	case <-time.After(30 * time.Second):
		t.Fatal("nothing handed on")
	}
	close(stop)
	<-done
	require.Empty(t, handed, "the ended one is not handed on")
	require.Equal(t, int32(1), endsMsg.acks.Load(), "the ended one's message is acknowledged by the loop")
	require.Zero(t, goesOnMsg.acks.Load(), "the other is a worker's to acknowledge")
	types := b.history(t, "nap", "e0")
	require.Equal(t, events.TypeExecutionSucceeded, types[len(types)-1])
	b.finish(t, goesOn)
}
