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

func TestComingTakesTheTimersDueByThenSorted(t *testing.T) {
	s := newSoonTimers()
	now := time.Now()
	require.True(t, s.add(now, now.Add(3*time.Second), "wf", "x1", "t1", 30))
	require.True(t, s.add(now, now.Add(2*time.Second), "wf", "x2", "t2", 20))
	require.True(t, s.add(now, now.Add(time.Minute), "wf", "x3", "t3", 10))
	require.True(t, s.add(now, now.Add(warmAhead/2), "wf", "x4", "t4", 40), "due within warmAhead: its blocks were just used")
	require.True(t, s.add(now, now.Add(3*time.Second), "wf", "x5", "t5", 0), "unknown sequence")
	require.Empty(t, s.coming(now.Add(time.Second)))
	require.Equal(t, []uint64{20, 30}, s.coming(now.Add(5*time.Second)), "sorted, the later timer and the unknown one left out")
	require.Empty(t, s.coming(now.Add(5*time.Second)), "taken once")
	require.Equal(t, []uint64{10}, s.coming(now.Add(2*time.Minute)))
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
	fired := map[string]time.Time{}
	natstest.Eventually(t, 60*time.Second, func() bool {
		for i := range n {
			id := fmt.Sprintf("n%d", i)
			evs, err := history.Read(t.Context(), js, bus.ExecutionSubject("napper", id), 0)
			if err != nil {
				return false
			}
			for _, e := range evs {
				if _, ok := e.Data.(*events.TimerFired); ok {
					fired[id] = e.Time
				}
			}
		}
		return len(fired) == n
	}, "every sleep fired")

	mu.Lock()
	defer mu.Unlock()
	// A fresh stream: every execution's events are within one span.
	require.Len(t, reads, 1, "one read for the three timers: %v", reads)
	last, err := history.Read(t.Context(), js, bus.ExecutionSubject("napper", "n0"), 0)
	require.NoError(t, err)
	require.NotEmpty(t, last)
	require.LessOrEqual(t, reads[0], last[len(last)-1].Seq, "a stored event")
	for id, at := range fired {
		require.True(t, readAt[0].Before(at), "read before %s fired (read at %s, fired at %s)", id,
			readAt[0].Format(time.StampMilli), at.Format(time.StampMilli))
		t.Logf("%s: read %s before its firing", id, at.Sub(readAt[0]).Round(time.Millisecond))
	}
}
