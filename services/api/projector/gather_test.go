package projector

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
)

// sizedMsg is a message of a given size; nothing else of it is used.
type sizedMsg struct {
	jetstream.Msg
	data []byte
}

func (m sizedMsg) Data() []byte         { return m.data }
func (m sizedMsg) Subject() string      { return "jf.events.wf.x" }
func (m sizedMsg) Headers() nats.Header { return nats.Header{"Ce-Id": {"id"}} }

func inboxOf(n, size int) chan jetstream.Msg {
	inbox := make(chan jetstream.Msg, n)
	for range n {
		inbox <- sizedMsg{data: []byte(strings.Repeat("x", size))}
	}
	return inbox
}

// TestAGatheredBatchTakesMoreThanAPull: under load a batch takes what has
// come beyond one pull's batchMax (at 9,000 steps a second the 200 ms of
// Coalesce bring about 2,000 events), up to gatherMax events, and no more
// than gatherBytes of them (large events are held in memory until
// projected).
func TestAGatheredBatchTakesMoreThanAPull(t *testing.T) {
	t.Parallel()
	g := newGatherer()
	require.Greater(t, g.max, batchMax)
	require.Less(t, g.max, bus.ProjectorConsumerSpec().Config.MaxAckPending, "room for the next events while a full batch is projected")

	inbox := inboxOf(3000, 200)
	batch := g.fill(t.Context(), inbox, []jetstream.Msg{<-inbox}, time.Now().Add(50*time.Millisecond))
	require.Len(t, batch, 3000, "what has come, past one pull's %d", batchMax)

	inbox = inboxOf(g.max+100, 200)
	batch = g.fill(t.Context(), inbox, []jetstream.Msg{<-inbox}, time.Now().Add(time.Minute))
	require.Len(t, batch, g.max)
	require.Len(t, inbox, 100, "the rest left for the next batch")

	const big = 64 << 10
	inbox = inboxOf(1000, big)
	batch = g.fill(t.Context(), inbox, []jetstream.Msg{<-inbox}, time.Now().Add(time.Minute))
	want := gatherBytes/(big+msgSize(sizedMsg{})) + 1
	require.Len(t, batch, want, "bounded by bytes: the message that passes %d bytes is the last", gatherBytes)

	// Not busy (no until): what has come now, without waiting.
	inbox = inboxOf(10, 200)
	began := time.Now()
	batch = g.fill(t.Context(), inbox, []jetstream.Msg{<-inbox}, time.Time{})
	require.Len(t, batch, 10)
	require.Less(t, time.Since(began), 10*time.Second, "it did not wait for more")
}

// TestWhatMakesTheProjectorGather: a batch of busyBatch events, or one
// whose read models took busyBytes, makes the next batch gather; a small
// batch of small models does not.
func TestWhatMakesTheProjectorGather(t *testing.T) {
	t.Parallel()
	require.False(t, isBusy(1, 4<<10), "one event, a small model")
	require.False(t, isBusy(busyBatch-1, busyBytes-1))
	require.True(t, isBusy(busyBatch, 0), "many events")
	require.True(t, isBusy(1, busyBytes), "one large model")
}

// TestGatherAndCoalesceDefaults: 0 is the default, negative is none.
func TestGatherAndCoalesceDefaults(t *testing.T) {
	require.Equal(t, DefaultGather, (&Projector{}).gather())
	require.Equal(t, 2*time.Millisecond, (&Projector{Gather: 2 * time.Millisecond}).gather())
	require.Zero(t, (&Projector{Gather: -1}).gather(), "negative: every event projected as it comes")
	require.Equal(t, DefaultCoalesce, (&Projector{}).coalesce())
	require.Zero(t, (&Projector{Coalesce: -1}).coalesce())
}

// TestEventsAGatherBringsAreNoLoad: not under load, a batch is what is
// queued and then what comes within a Gather; only the queued events
// count as load (queued), so that a few executions at once do not make
// every batch a busy one. Under load the same: the events a Coalesce
// brings are no backlog; with Gather negative nothing is waited for.
func TestEventsAGatherBringsAreNoLoad(t *testing.T) {
	t.Parallel()
	msg := sizedMsg{data: []byte("x")}
	queue := func(g *gatherer, queued, coming int) chan jetstream.Msg {
		inbox := make(chan jetstream.Msg, queued+coming)
		for range queued {
			inbox <- msg
		}
		waited := false
		g.waiting = func() { // as fill begins to wait: the events of the wait come
			if !waited {
				waited = true
				for range coming {
					inbox <- msg
				}
			}
		}
		return inbox
	}

	g := newGatherer()
	g.max = 110 // full once the wait's events are in: no need to wait it out
	inbox := queue(g, 10, 100)
	p := &Projector{Gather: time.Minute}
	batch, queued := p.next(t.Context(), g, inbox, []jetstream.Msg{<-inbox}, false, time.Now())
	require.Len(t, batch, 110, "what was queued, then what came in the wait")
	require.Equal(t, 10, queued, "only the queued ones are load")
	require.False(t, isBusy(queued, 0))

	g = newGatherer()
	g.max = 110
	inbox = queue(g, 80, 30)
	batch, queued = p.next(t.Context(), g, inbox, []jetstream.Msg{<-inbox}, true, time.Now())
	require.Len(t, batch, 110, "under load, what was queued, then what came in the Coalesce")
	require.Equal(t, 80, queued, "under load too, only the queued ones are load")

	g = newGatherer()
	inbox = queue(g, 10, 100)
	batch, queued = (&Projector{Gather: -1}).next(t.Context(), g, inbox, []jetstream.Msg{<-inbox}, false, time.Now())
	require.Len(t, batch, 10, "no Gather: what is queued, at once, nothing waited for")
	require.Equal(t, 10, queued)

	require.False(t, busyAfter(10, 110, 0), "the wait's events are no load")
	require.True(t, busyAfter(busyBatch, 110, 0))
	require.False(t, busyAfter(10, 110, 10*(busyBytes-1)/10), "the queued events' share of the bytes")
	require.True(t, busyAfter(10, 110, 11*busyBytes), "a tenth of 11 times busyBytes")
	require.True(t, busyAfter(1, 1, busyBytes), "one large model, alone")
}

// TestGatheringFollowsThePace: the projector gathers the events of a
// Coalesce while they come at busyBatch a Coalesce or more, or their
// models take busyBytes, judged a Coalesce at a time whichever mode it
// was in (a backlog does not keep it on), and goes on until the pace
// falls below three quarters of that, or nothing comes for a Coalesce; a
// batch after an idle while counts for the time it took.
func TestGatheringFollowsThePace(t *testing.T) {
	t.Parallel()
	const period = 200 * time.Millisecond
	at := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	// judge has s count a period of batches of n events each, each of a
	// model of size bytes, and returns its judgment.
	judge := func(s *pace, batches, n int, size uint64) bool {
		if s.since.IsZero() {
			s.add(at, period, 0, 0) // the first period begins
		}
		from := s.since
		for i := range batches {
			s.add(from.Add(period*time.Duration(i+1)/time.Duration(batches)), period, n, uint64(n)*size)
		}
		return s.fast
	}

	require.False(t, judge(&pace{}, 40, 1, 1000), "40 events a period, small models")
	require.True(t, judge(&pace{}, 40, 2, 1000), "80 events a period")
	require.True(t, judge(&pace{}, 1, busyBatch, 1000), "64 in one batch")
	require.True(t, judge(&pace{}, 20, 1, 20_000), "20 events a period, of 20 KB models: 400 KB")
	require.False(t, judge(&pace{}, 20, 1, 10_000), "20 events of 10 KB models: 200 KB")
	// The same events of a 100 KB model, gathered (one write a period,
	// of its five events) or not (a write each): the same judgment.
	require.True(t, judge(&pace{}, 1, 5, 100_000), "five events in one write")
	require.True(t, judge(&pace{}, 5, 1, 100_000), "five writes of one event")

	// Hysteresis: 50 events a period keep it on, not begin it.
	s := &pace{}
	require.True(t, judge(s, 10, 10, 100), "100 events")
	require.True(t, judge(s, 10, 5, 100), "50 events: still on")
	require.False(t, judge(s, 10, 4, 100), "40 events: off")
	require.False(t, judge(s, 10, 5, 100), "50 events: not on again")

	// Scaled to a period: 100 events in a batch after ten periods idle
	// are ten a period.
	s = &pace{}
	require.True(t, judge(s, 10, 10, 100))
	s.add(s.since.Add(10*period), period, 100, 100)
	require.False(t, s.fast, "100 events over ten periods")

	// A period with nothing projected ends it: a backlog projected at
	// once and then a pause is not the pace of what comes after.
	s = &pace{}
	require.True(t, judge(s, 1, 1500, 100), "a backlog")
	require.False(t, s.idle(s.last.Add(period-time.Millisecond), period), "less than a period idle")
	require.True(t, s.fast)
	require.True(t, s.idle(s.last.Add(period), period), "a period idle")
	require.False(t, s.fast)
	s.add(at.Add(time.Hour), period, 1500, 100)
	require.False(t, s.fast, "a new period begins with the next batch")
	// A backlog, then a pause of just over a period: its events are
	// forgotten, not judged with the next ones.
	s = &pace{}
	require.True(t, judge(s, 1, 1500, 100), "a backlog")
	t0 := s.last.Add(period / 2)
	s.add(t0, period, 1500, 100) // another, half a period later
	require.True(t, s.idle(t0.Add(period+time.Millisecond), period))
	require.False(t, s.add(t0.Add(period+2*time.Millisecond), period, 1, 100), "a new period begins")
	require.Equal(t, 1, s.events, "the backlog's events forgotten")
	require.False(t, (&pace{}).idle(at, period), "nothing projected yet")

	// Not judged before a period is over; no Coalesce: never.
	s = &pace{}
	s.add(at, period, 0, 0)
	s.add(at.Add(period/2), period, 100, 0)
	require.False(t, s.fast, "half a period")
	s.add(at.Add(period), period, 0, 0)
	require.True(t, s.fast, "the period over")
	require.True(t, s.add(at.Add(2*period), -1, 100, 0), "no Coalesce: each batch a judgment (else a backlog's gathering never ended)")
	require.False(t, s.fast, "no Coalesce")
}

// TestWhenTheProjectorGathers: not gathering, it begins when a period is
// judged fast, or on a backlog or large models; gathering, it goes on
// until a period is judged slow, whatever queued meanwhile, and a batch
// that judged nothing (one ended early, a backlog's first) does not end
// it.
func TestWhenTheProjectorGathers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name               string
		busy, judged, fast bool
		queued, n          int
		wrote              uint64
		want               bool
	}{
		{"slow, no backlog", false, true, false, 10, 40, 0, false},
		{"judged fast, no backlog", false, true, true, 1, 1, 0, true},
		{"fast from an earlier period", false, false, true, 1, 1, 0, true},
		{"a backlog", false, false, false, busyBatch, busyBatch, 0, true},
		{"large models", false, false, false, 1, 1, busyBytes, true},
		{"the events of a Gather are no backlog", false, true, false, 10, 200, 0, false},
		{"gathering, judged slow", true, true, false, 0, 500, 0, false},
		{"gathering, judged slow, much queued meanwhile", true, true, false, 500, 3000, busyBytes, false},
		{"gathering, judged fast", true, true, true, 0, 500, 0, true},
		{"gathering, not judged yet", true, false, false, 0, 3072, 0, true},
	} {
		require.Equal(t, c.want, nextBusy(c.busy, c.judged, c.fast, c.queued, c.n, c.wrote), c.name)
	}
}
