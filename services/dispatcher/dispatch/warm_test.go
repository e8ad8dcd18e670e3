package dispatch

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/workflow"
)

func TestComingTakesTheTimersDueBy(t *testing.T) {
	s := newSoonTimers(0, 0)
	now := time.Now()
	require.True(t, s.add(now, now.Add(3*time.Second), "wf", "x1", "t1", 30))
	require.True(t, s.add(now, now.Add(2*time.Second), "wf", "x2", "t2", 20))
	require.True(t, s.add(now, now.Add(time.Minute), "wf", "x3", "t3", 10))
	require.True(t, s.add(now, now.Add(warmAhead/2), "wf", "x4", "t4", 40), "due within warmAhead: its blocks were just used")
	require.True(t, s.add(now, now.Add(3*time.Second), "wf", "x5", "t5", 0), "unknown sequence")
	seqs := func(es []warmEntry) (out []uint64) {
		for _, e := range es {
			out = append(out, e.seq)
		}
		return out
	}
	require.Empty(t, s.coming(now, now.Add(time.Second)))
	got := s.coming(now, now.Add(5*time.Second))
	require.Equal(t, []uint64{20, 30}, seqs(got), "by firing time; the later timer and the unknown one left out")
	require.Equal(t, "x2", got[0].exec)
	require.Equal(t, "wf", got[0].workflow)
	require.Empty(t, s.coming(now, now.Add(5*time.Second)), "taken once")
	require.Empty(t, s.coming(now.Add(2*time.Minute), now.Add(2*time.Minute)), "due by now: too late to read ahead, dropped")
}

func TestSpanEndsKeepsTheFirstAndLastOfEachSpan(t *testing.T) {
	require.Empty(t, spanEnds(nil))
	require.Equal(t, []uint64{7}, spanEnds([]uint64{7}))
	require.Equal(t, []uint64{3, 999, 1000, 2500, 2990, 4000, 5001, 5007},
		spanEnds([]uint64{999, 2500, 3, 500, 1000, 2990, 2700, 3, 600, 4000, 4000, 5001, 5007, 5007}))
}

// TestTimersDueSoonAreReadAhead: a dispatcher reads, about warmAhead
// before timers kept in memory fire, one event near their executions'
// last from the events stream's leader, once for events in one span of
// sequences, so that the firings' appends find their blocks in the
// server's memory.
func TestTimersDueSoonAreReadAhead(t *testing.T) {
	nc, js := natstest.Connect(t, natstest.RunJetStream(t))
	defs, err := catalog.Open(t.Context(), js)
	require.NoError(t, err)
	def, err := workflow.Parse([]byte("name: napper\nsteps:\n  - {id: nap, kind: sleep, duration: 3s}\n"))
	require.NoError(t, err)
	_, _, err = defs.Apply(t.Context(), def)
	require.NoError(t, err)

	var mu sync.Mutex
	var reads []uint64
	var readAt []time.Time
	sub, err := nc.Subscribe(bus.APISubject(js, "STREAM.MSG.GET."+bus.StreamEvents), func(m *nats.Msg) {
		var q bus.MsgQuery
		if json.Unmarshal(m.Data, &q) != nil || q.Seq == 0 {
			return // a read of a history's last event, not a read ahead
		}
		mu.Lock()
		defer mu.Unlock()
		reads = append(reads, q.Seq)
		readAt = append(readAt, time.Now())
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	d, err := New(t.Context(), Config{}, js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	natstest.Serve(t, d.Run)
	natstest.Eventually(t, 30*time.Second, func() bool { return d.Ready() == nil }, "ready")

	const n = 3
	for i := range n {
		ev := events.New("test", "", "", time.Now(), &events.StartExecution{Workflow: "napper", ExecutionID: fmt.Sprintf("n%d", i)})
		msg, err := bus.Encode(bus.SubjectStart, ev)
		require.NoError(t, err)
		_, err = js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(ev.ID))
		require.NoError(t, err)
	}
	// Each execution's sleep fires; its firing is recorded at its time.
	// The events a read ahead may name: an execution's last event when its
	// timer was armed (the one before its arming) or before it fired.
	fired := map[string]time.Time{}
	named := map[uint64]bool{}
	natstest.Eventually(t, 60*time.Second, func() bool {
		for i := range n {
			id := fmt.Sprintf("n%d", i)
			evs, err := history.Read(t.Context(), js, bus.ExecutionSubject("napper", id), 0)
			if err != nil {
				return false
			}
			for k, e := range evs {
				armed := events.ArmingOf(e.Data) != nil // its own event, or the sleep's wait (docs/adr/0018)
				firing := events.FiringOf(e.Data) != "" // its timer.fired, or the sleep's success recording it
				if (armed || firing) && k > 0 {
					named[evs[k-1].Seq] = true
				}
				if firing {
					fired[id] = e.Time
				}
			}
		}
		return len(fired) == n
	}, "every sleep fired")

	mu.Lock()
	defer mu.Unlock()
	// A fresh stream: every execution's events are within one span, read
	// at its first and last.
	require.NotEmpty(t, reads, "read ahead")
	require.LessOrEqual(t, len(reads), 2, "at most two reads for the three timers: %v", reads)
	for _, seq := range reads {
		require.True(t, named[seq], "read %d, an execution's last event (one of %v)", seq, named)
	}
	for id, at := range fired {
		require.True(t, readAt[0].Before(at), "read before %s fired (read at %s, fired at %s)", id,
			readAt[0].Format(time.StampMilli), at.Format(time.StampMilli))
		t.Logf("%s: read %s before its firing", id, at.Sub(readAt[0]).Round(time.Millisecond))
	}
}

// TestReadingAheadStopsAtOnce: a dispatcher stopping (stop closed, its
// context still live: Run returning on an error) is not held up by reads
// ahead that nobody answers, each of which would wait for its timeout.
func TestReadingAheadStopsAtOnce(t *testing.T) {
	nc, js := natstest.Connect(t, natstest.RunJetStream(t))
	d, err := New(t.Context(), Config{}, js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	asked := make(chan struct{}, 16)
	sub, err := nc.Subscribe("unanswered.>", func(*nats.Msg) { asked <- struct{}{} }) // never answered
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	d.js, err = jetstream.NewWithAPIPrefix(nc, "unanswered")
	require.NoError(t, err)
	now := time.Now()
	for i := range 4 { // four spans: four reads of up to a timeout each
		require.True(t, d.soon.add(now, now.Add(warmAhead+500*time.Millisecond), "wf", fmt.Sprint("x", i), "t", uint64(1+i*warmSpan)))
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { defer close(done); d.warmSoon(t.Context(), stop) }()
	select {
	case <-asked:
	case <-time.After(30 * time.Second):
		t.Fatal("no read ahead")
	}
	stopped := time.Now()
	close(stop)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("reading ahead did not stop")
	}
	require.Less(t, time.Since(stopped), bus.ServiceRequestTimeout, "stopped without waiting for the read under way")
}
