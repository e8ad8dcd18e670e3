package dispatch

import (
	"container/heap"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// Timers due soon also fire from memory (docs/adr/0013). A timer is a
// message schedule in JF_TIMERS: durable, fired by the server into the
// partition's timers consumer whoever holds the partition then. But the
// server runs its scheduler at most every 250 ms, so a timer fires up to
// 250 ms late even alone, and a burst of thousands due at one instant is
// stored by the scheduler, delivered and only then recorded: the last of
// 10,000 was recorded about a second late on an idle 2-core machine.
//
// So the dispatcher that arms a timer due within soonHorizon also keeps
// it in a heap (soonTimers), and one goroutine fires it at its due time
// as a fired timer's message would be: through the fire loop, which
// records the firings of a burst in batches (fires.go), then the workers.
// The schedule stays the guarantee, set scheduleGrace after the due time:
// a dispatcher that stops, loses the partition, or drops the firing (an
// error, a state it could not load) leaves it to the schedule's message,
// which the next holder handles as before, that much late; one that fired
// it here and handled it acknowledges the schedule's message when it
// comes, without handling it again.
// Recording is idempotent either way (interp.Fired: a timer recorded
// fired is not recorded again).
//
// What it keeps per timer is a small struct, and only for timers due
// within soonHorizon that this process armed: no goroutine or timer of
// the runtime per execution, and none for executions asleep for longer
// (their memory per sleeping execution is unchanged).
//
// Unless Config.NoTimerNotices, a timer due later than soonHorizon when armed
// has its schedule set noticeLead before its due time, with a notice (events.TimerNotice)
// instead of the firing: the dispatcher holding its execution then, as
// the notice comes, reads its state, sets its schedule again as for a
// timer due soon, and keeps it in memory, its state cached until it
// fires (docs/adr/0019). A burst of long sleeps due at one instant then
// fires as one armed within the horizon does, instead of reading every
// history and waiting for every schedule's message at the due time.
const (
	// soonHorizon: timers due within it when armed fire from memory.
	soonHorizon = 2 * time.Minute
	// noticeLead: how long before its due time a long timer's notice
	// comes. Below soonHorizon, so that a notice handled a little late
	// still finds its timer within the horizon.
	noticeLead = time.Minute
	// soonMax bounds the timers kept in memory, and the firings
	// remembered as settled: past it, a timer fires by its schedule only.
	soonMax = 100_000
	// settledFor is how long a firing handled here waits for its
	// schedule's message before it is forgotten (the message, if it comes
	// later, is handled as any: it changes nothing).
	settledFor = 10 * time.Minute
	// scheduleGrace: the schedule of a timer kept in memory fires this
	// much after its due time, so that a burst's schedules are not
	// stored and delivered while the burst is being recorded from memory,
	// and come once their firings are handled (to be acknowledged). A
	// dispatcher that stops before it fires them leaves them this late.
	scheduleGrace = 2 * time.Second
	// notHeldAgain: a timer due in a partition this dispatcher does not
	// hold at that moment (its lease's renewal may merely be late) is
	// looked at again this much later, until its schedule fires.
	notHeldAgain = 100 * time.Millisecond
	// firedHereAgain: a schedule's message that comes while its timer,
	// fired from memory, is still being handled here comes again after
	// it, to be acknowledged (handled) or handled (dropped).
	firedHereAgain = time.Second
)

// soonTimer is one timer kept in memory.
type soonTimer struct {
	at       time.Time // when to fire, on this process's monotonic clock
	due      time.Time // its due time, as the dispatcher's clock (Config.Now) reads
	workflow string
	exec     string
	id       string
}

func (t soonTimer) when() time.Time { return t.at }

// timeHeap is a container/heap of entries by when they are due: the
// timers kept in memory (soonTimers.h) and their reads ahead (cold).
type timeHeap[T interface{ when() time.Time }] []T

func (h timeHeap[T]) Len() int           { return len(h) }
func (h timeHeap[T]) Less(i, j int) bool { return h[i].when().Before(h[j].when()) }
func (h timeHeap[T]) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timeHeap[T]) Push(x any)        { *h = append(*h, x.(T)) }
func (h *timeHeap[T]) Pop() any {
	old := *h
	e := old[len(old)-1]
	var zero T
	old[len(old)-1] = zero
	*h = old[:len(old)-1]
	return e
}

// soonTimers are the timers due soon that this dispatcher armed, and
// the firings it handled whose schedule's message has not come yet.
type soonTimers struct {
	// horizon, lead: soonHorizon and noticeLead (shorter in tests).
	horizon, lead time.Duration

	mu sync.Mutex
	h  timeHeap[soonTimer]
	// pending: fired from memory, being handled; settled: handled. Both
	// by settledKey, with when they were fired or handled.
	pending, settled map[string]time.Time
	// latest: the due time of each kept timer's latest arming, by
	// settledKey. A timer armed again (its first arming's decision failed
	// and was taken again later, or a re-arm) replaces its schedule in
	// JF_TIMERS; here the heap's older entry stays, and is skipped.
	latest map[string]time.Time
	wake   chan struct{}
	// cold: each kept timer's execution's last event when it was armed,
	// by when the timer fires, for warmSoon (warm.go).
	cold timeHeap[warmEntry]
}

// newSoonTimers keeps timers due within horizon; a longer one's notice
// comes lead before it is due (0, or a lead not below the horizon:
// soonHorizon, noticeLead).
func newSoonTimers(horizon, lead time.Duration) *soonTimers {
	if horizon <= 0 || lead <= 0 || lead >= horizon {
		horizon, lead = soonHorizon, noticeLead
	}
	return &soonTimers{horizon: horizon, lead: lead, pending: map[string]time.Time{}, settled: map[string]time.Time{}, latest: map[string]time.Time{},
		wake: make(chan struct{}, 1)}
}

// fits reports whether a timer armed now and due at due would be kept
// (its schedule is then set scheduleGrace later); add keeps it once its
// schedule is stored.
func (s *soonTimers) fits(now, due time.Time) bool {
	if s == nil || due.Sub(now) > s.horizon {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.h) < soonMax
}

// add keeps a timer armed now (by the dispatcher's clock) and due at due,
// if it falls within the horizon and there is room; it reports whether it
// did. seq is the stream sequence of the execution's last event as it was
// armed (0: unknown), read ahead of the timer's firing (warm.go).
func (s *soonTimers) add(now, due time.Time, workflow, exec, id string, seq uint64) bool {
	if s == nil {
		return false
	}
	key := settledKey(exec, id)
	wait := due.Sub(now)
	s.mu.Lock()
	if wait > s.horizon || len(s.h) >= soonMax {
		delete(s.latest, key) // an earlier arming kept here is no longer the timer's
		s.mu.Unlock()
		return false
	}
	at := time.Now().Add(max(0, wait))
	heap.Push(&s.h, soonTimer{at: at, due: due, workflow: workflow, exec: exec, id: id})
	s.latest[key] = due
	if seq != 0 && wait > warmAhead && len(s.cold) < soonMax {
		heap.Push(&s.cold, warmEntry{at: at, seq: seq, workflow: workflow, exec: exec})
	}
	first := s.h[0].id == id
	s.mu.Unlock()
	if first {
		s.wakeLoop()
	}
	return true
}

// wakeLoop wakes the fire loop to look at the heap's head again.
func (s *soonTimers) wakeLoop() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// due removes and returns the timers whose time has come by now (this
// process's clock), and how long until the next one (0: none left).
func (s *soonTimers) due(now time.Time) ([]soonTimer, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []soonTimer
	for len(s.h) > 0 && !s.h[0].at.After(now) {
		t := heap.Pop(&s.h).(soonTimer)
		key := settledKey(t.exec, t.id)
		if due, ok := s.latest[key]; !ok || !due.Equal(t.due) {
			continue // armed again since (or no longer kept): stale
		}
		delete(s.latest, key)
		out = append(out, t)
	}
	if len(s.h) == 0 {
		return out, 0
	}
	return out, max(time.Millisecond, s.h[0].at.Sub(now))
}

func settledKey(exec, id string) string { return exec + "/" + id }

// noticeAt is when the notice of a timer armed now and due at due comes
// (docs/adr/0019), and whether it has one: a timer due past the horizon
// has; one due within it is kept, or fires by its schedule.
func (s *soonTimers) noticeAt(now, due time.Time) (time.Time, bool) {
	if s == nil || due.Sub(now) <= s.horizon {
		return time.Time{}, false
	}
	return due.Add(-s.lead), true
}

// keeps reports whether a timer of execution exec among timers (its
// state's) is kept here to fire from memory: its state is then kept
// cached, even asleep, so that the firing finds it (a burst of long
// sleeps brought here by their notices would otherwise read every
// history as it fires).
func (s *soonTimers) keeps(exec string, timers map[string]projections.Timer) bool {
	if s == nil || len(timers) == 0 {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, t := range timers {
		if _, kept := s.latest[settledKey(exec, id)]; kept && !t.Fired {
			return true
		}
	}
	return false
}

// forget drops the timer's entry, if any (armed again beyond the
// horizon: only its schedule fires it).
func (s *soonTimers) forget(exec, id string) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.latest, settledKey(exec, id))
}

// requeue keeps t, taken by due, to fire at at instead, unless the timer
// was armed again meanwhile (that arming's entry is the timer's now). It
// wakes the fire loop when t is now the first to come due, as add does:
// the loop computed how long to sleep before it requeued t (an hour, if
// the heap was empty then), and an entry at the heap's head keeps any
// later add from being first.
func (s *soonTimers) requeue(t soonTimer, at time.Time) {
	key := settledKey(t.exec, t.id)
	s.mu.Lock()
	if _, armed := s.latest[key]; armed || len(s.h) >= soonMax {
		s.mu.Unlock()
		return
	}
	t.at = at
	heap.Push(&s.h, t)
	s.latest[key] = t.due
	first := s.h[0].id == t.id && s.h[0].exec == t.exec
	s.mu.Unlock()
	if first {
		s.wakeLoop()
	}
}

// Where a timer fired from memory stands, when its schedule's message
// comes.
const (
	notFiredHere = iota // not fired here (or forgotten): handle the message
	firedHere           // fired here and being handled: ask again shortly
	handledHere         // fired here and handled: acknowledge the message
)

// fire notes that a timer (key: settledKey) fired from memory and is
// being handled. It reports false when too many are (the timer is then
// left to its schedule).
func (s *soonTimers) fire(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return remember(s.pending, key)
}

// conclude ends the handling of a timer fired from memory: handled, its
// schedule's message will be acknowledged without being handled again;
// not, it will be handled as any.
func (s *soonTimers) conclude(key string, handled bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pending, key)
	if handled {
		remember(s.settled, key)
	}
}

// remember adds key to m, forgetting entries older than settledFor when
// m is full; false if it is full of newer ones.
func remember(m map[string]time.Time, key string) bool {
	now := time.Now()
	if len(m) >= soonMax {
		for k, at := range m {
			if now.Sub(at) > settledFor {
				delete(m, k)
			}
		}
		if len(m) >= soonMax {
			return false
		}
	}
	m[key] = now
	return true
}

// stand says where timer id of execution exec stands here as its
// schedule's message comes; a handled one is forgotten (its message
// comes once, or again only if acknowledging it failed).
func (s *soonTimers) stand(exec, id string) int {
	if s == nil {
		return notFiredHere
	}
	key := settledKey(exec, id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if at, ok := s.pending[key]; ok && time.Since(at) <= settledFor {
		return firedHere
	}
	at, ok := s.settled[key]
	if !ok {
		return notFiredHere
	}
	delete(s.settled, key)
	if time.Since(at) > settledFor {
		return notFiredHere
	}
	return handledHere
}

// fireSoon fires the timers kept in memory as they come due, handing
// each to queue as a fired timer's message (through the fire loop), until
// ctx ends or stop is closed. A timer of a partition this dispatcher no
// longer holds is dropped: its schedule fires it at the next holder.
func (d *Dispatcher) fireSoon(ctx context.Context, queue func(job), stop <-chan struct{}) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		ready, next := d.soon.due(time.Now())
		for _, st := range ready {
			if now := d.cfg.Now(); now.Before(st.due) { // the clock it is due by is behind this one's
				d.soon.requeue(st, time.Now().Add(st.due.Sub(now)))
				continue
			}
			from := d.holding(d.partitionOf(st.exec))
			if from == nil {
				// Not held, or its lease's renewal is late (a worker would
				// wait for it): looked at again shortly, until its
				// schedule, scheduleGrace after its due time, takes over.
				if d.cfg.Now().Sub(st.due) < scheduleGrace {
					d.soon.requeue(st, time.Now().Add(notHeldAgain))
				}
				continue
			}
			ev := events.New(d.cfg.Source, st.exec, st.workflow, d.cfg.Now(),
				&events.FireTimer{ExecutionID: st.exec, Workflow: st.workflow, TimerID: st.id})
			ev.ID = "fire-" + st.id
			key := settledKey(st.exec, st.id)
			if !d.soon.fire(key) {
				from.done()
				continue
			}
			d.cfg.Metrics.fired(true)
			queue(job{msg: &soonMsg{soon: d.soon, key: key}, ev: ev, key: st.exec, from: from})
		}
		if next == 0 {
			next = time.Hour
		}
		t.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-d.soon.wake:
		case <-t.C:
		}
	}
}

// soonMsg is a timer fired from memory, seen by the fire loop and the
// workers as a fired timer's message. Handled (acknowledged), it settles
// the timer; anything else (a Nak or Term: dropped) leaves the timer to
// its schedule's message.
type soonMsg struct {
	soon *soonTimers
	key  string // settledKey
}

var errFiredHere = errors.New("a timer fired from memory is stored nowhere: it has no metadata")

func (m *soonMsg) Metadata() (*jetstream.MsgMetadata, error) { return nil, errFiredHere }
func (m *soonMsg) Data() []byte                              { return nil }
func (m *soonMsg) Headers() nats.Header                      { return nil }
func (m *soonMsg) Subject() string                           { return "" }
func (m *soonMsg) Reply() string                             { return "" }
func (m *soonMsg) InProgress() error                         { return nil }
func (m *soonMsg) Ack() error                                { m.soon.conclude(m.key, true); return nil }
func (m *soonMsg) DoubleAck(context.Context) error           { return m.Ack() }
func (m *soonMsg) Nak() error                                { m.soon.conclude(m.key, false); return nil }
func (m *soonMsg) NakWithDelay(time.Duration) error          { return m.Nak() }
func (m *soonMsg) Term() error                               { return m.Nak() }
func (m *soonMsg) TermWithReason(string) error               { return m.Nak() }
