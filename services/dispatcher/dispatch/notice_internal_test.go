package dispatch

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
)

// scheduleOf is the pending schedule of timer id: its command's type, the
// time it is set for, and the notice it carries (nil for a firing). It
// checks where the schedule fires: a notice on its partition's notices
// subject, a firing on its timers subject.
func (b *memBundle) scheduleOf(t *testing.T, id string) (events.Type, string, *events.TimerNotice) {
	t.Helper()
	stream, err := b.js.Stream(t.Context(), bus.StreamTimers)
	require.NoError(t, err)
	m, err := stream.GetLastMsgForSubject(t.Context(), bus.ScheduleSubject(id))
	require.NoError(t, err, "the schedule of timer %s", id)
	ev, err := bus.Decode(m.Header, m.Data)
	require.NoError(t, err)
	n, _ := ev.Data.(*events.TimerNotice)
	target := bus.PartitionTimerSubject(b.d.partitionOf(ev.Subject), ev.Subject)
	if n != nil {
		target = bus.PartitionNoticeSubject(b.d.partitionOf(ev.Subject), ev.Subject)
	}
	require.Equal(t, target, m.Header.Get("Nats-Schedule-Target"), "where the %s fires", ev.Type)
	return ev.Type, strings.TrimPrefix(m.Header.Get("Nats-Schedule"), "@at "), n
}

// isCached says whether execution id's state is in the dispatcher's cache.
func (b *memBundle) isCached(id string) bool {
	states, _, _ := b.cached()
	for _, x := range states {
		if x.id == id {
			return true
		}
	}
	return false
}

// napping runs a dispatcher with cfg (2 workers) and a clock that the
// test moves ahead (ahead), starts execution n1 of a workflow sleeping
// three hours, and returns the sleep's arming once it waits.
func napping(t *testing.T, cfg Config) (b *memBundle, ahead *atomic.Int64, arming *events.TimerArmed) {
	t.Helper()
	ahead = new(atomic.Int64)
	cfg.Workers, cfg.Now = 2, func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	b = setupMem(t, cfg, napDefinition)
	return b, ahead, b.napArmed(t, "n1")
}

// napDefinition is a workflow that sleeps three hours.
const napDefinition = "name: nap\nsteps:\n  - {id: nap, kind: sleep, duration: 3h}\n"

// napArmed starts execution id of napDefinition and returns its sleep's
// arming once it waits.
func (b *memBundle) napArmed(t *testing.T, id string) *events.TimerArmed {
	t.Helper()
	b.publish(t, bus.SubjectStart, &events.StartExecution{Workflow: "nap", ExecutionID: id})
	natstest.Eventually(t, 30*time.Second, func() bool { return b.last(t, "nap", id) == events.TypeStepWaiting },
		"nap %s is not waiting", id)
	evs, err := b.d.hist.Read(t.Context(), bus.ExecutionSubject("nap", id), 0)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	arming := events.ArmingOf(evs[len(evs)-1].Data)
	require.NotNil(t, arming, "the wait records its arming")
	return arming
}

// TestALongTimersNoticeBringsItIntoMemory (docs/adr/0019): a sleep of
// three hours has its schedule set a minute before its due time, with a
// notice, and its state is let go (asleep). The notice, handled within
// two minutes of the due time (the dispatcher's clock moved on), sets the
// schedule again for the firing, 2 s after the due time as for a timer
// armed due soon, keeps the timer in memory, and keeps the state cached
// until it fires. A notice of another arming changes nothing. With
// notices off the schedule is the firing, at the due time.
func TestALongTimersNoticeBringsItIntoMemory(t *testing.T) {
	t.Parallel()
	for _, notices := range []bool{true, false} {
		b, ahead, arming := napping(t, Config{NoTimerNotices: !notices})
		require.False(t, b.isCached("n1"), "asleep for three hours: its state is let go")

		typ, at, notice := b.scheduleOf(t, arming.TimerID)
		if !notices {
			require.Equal(t, events.TypeFireTimer, typ)
			require.Equal(t, arming.Due.UTC().Format(time.RFC3339Nano), at, "the firing, at the due time")
			continue
		}
		require.Equal(t, events.TypeTimerNotice, typ)
		require.Equal(t, arming.Due.Add(-noticeLead).UTC().Format(time.RFC3339Nano), at, "a minute before the due time")
		require.Equal(t, &events.TimerNotice{ExecutionID: "n1", Workflow: "nap", TimerID: arming.TimerID, Due: arming.Due}, notice)

		// A notice of an earlier arming, due at another time, changes nothing.
		stale := *notice
		stale.Due = arming.Due.Add(-time.Hour)
		require.NoError(t, b.d.noticeTimer(t.Context(), &stale))
		typ, _, _ = b.scheduleOf(t, arming.TimerID)
		require.Equal(t, events.TypeTimerNotice, typ, "a stale notice sets nothing")
		require.False(t, b.isCached("n1"))

		// The notice comes a minute and a half before the due time.
		ahead.Store(int64(time.Until(arming.Due.Add(-90 * time.Second))))
		require.NoError(t, b.d.noticeTimer(t.Context(), notice))
		typ, at, _ = b.scheduleOf(t, arming.TimerID)
		require.Equal(t, events.TypeFireTimer, typ, "the notice sets the firing")
		require.Equal(t, arming.Due.Add(scheduleGrace).UTC().Format(time.RFC3339Nano), at, "as the guarantee of a timer kept in memory")
		require.True(t, b.d.soon.keeps("n1", map[string]projections.Timer{arming.TimerID: {}}), "kept in memory")
		require.True(t, b.isCached("n1"), "its state stays cached until it fires")
	}
}

// TestANoticeSetsTheFiringWhateverItFinds (docs/adr/0019): a notice never
// leaves its timer without a schedule. Handled by a dispatcher whose clock
// is behind the server's by more than the horizon, or that keeps no timer
// in memory, or for an execution that ended (a resume may come before
// the due time), it sets the firing for the due time, and keeps nothing
// in memory; it never sets another notice.
func TestANoticeSetsTheFiringWhateverItFinds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		behind time.Duration // the dispatcher's clock behind this one's when the notice comes
		cfg    Config
		cancel bool
	}{
		{name: "clock behind", behind: 4 * time.Minute, cfg: Config{}},
		{name: "no timers from memory", cfg: Config{NoTimersFromMemory: true}},
		{name: "ended", cfg: Config{}, cancel: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, ahead, arming := napping(t, tc.cfg)
			notice := &events.TimerNotice{ExecutionID: "n1", Workflow: "nap", TimerID: arming.TimerID, Due: arming.Due}
			if tc.cfg.NoTimersFromMemory {
				typ, _, _ := b.scheduleOf(t, arming.TimerID)
				require.Equal(t, events.TypeFireTimer, typ, "no notice without timers from memory")
			}
			if tc.cancel {
				b.publish(t, bus.SubjectAction, &events.ExecutionAction{ExecutionID: "n1", Action: events.ActionCancel, RequestedBy: "test"})
				natstest.Eventually(t, 30*time.Second, func() bool { return b.last(t, "nap", "n1") == events.TypeExecutionCancelled },
					"nap n1 is not cancelled")
			}
			ahead.Store(int64(time.Until(arming.Due.Add(-time.Minute)) - tc.behind))
			require.NoError(t, b.d.noticeTimer(t.Context(), notice))
			typ, at, _ := b.scheduleOf(t, arming.TimerID)
			require.Equal(t, events.TypeFireTimer, typ, "the notice sets the firing")
			require.Equal(t, arming.Due.UTC().Format(time.RFC3339Nano), at, "for the due time")
			require.False(t, b.d.soon.keeps("n1", map[string]projections.Timer{arming.TimerID: {}}), "kept nowhere but in its schedule")
		})
	}
}

// TestANoticeIsTakenFromItsSubjects (docs/adr/0019): a notice fired on
// its partition's notices subject is taken by the partition's notices
// consumer and handled; so is one fired on the timers' subject, where
// development builds before the notices' subjects set them.
func TestANoticeIsTakenFromItsSubjects(t *testing.T) {
	t.Parallel()
	for _, where := range []struct {
		name    string
		subject func(p int, exec string) string
	}{
		{"notices subject", bus.PartitionNoticeSubject},
		{"timers subject, set by earlier builds", bus.PartitionTimerSubject},
	} {
		t.Run(where.name, func(t *testing.T) {
			t.Parallel()
			b, ahead, arming := napping(t, Config{})
			ahead.Store(int64(time.Until(arming.Due.Add(-90 * time.Second))))
			b.publish(t, where.subject(b.d.partitionOf("n1"), "n1"),
				&events.TimerNotice{ExecutionID: "n1", Workflow: "nap", TimerID: arming.TimerID, Due: arming.Due})
			natstest.Eventually(t, 30*time.Second, func() bool {
				typ, _, _ := b.scheduleOf(t, arming.TimerID)
				return typ == events.TypeFireTimer
			}, "the notice did not set the firing")
			_, at, _ := b.scheduleOf(t, arming.TimerID)
			require.Equal(t, arming.Due.Add(scheduleGrace).UTC().Format(time.RFC3339Nano), at, "as the guarantee of a timer kept in memory")
			// Kept once the schedule is stored, a moment after it is seen.
			natstest.Eventually(t, 30*time.Second, func() bool {
				return b.d.soon.keeps("n1", map[string]projections.Timer{arming.TimerID: {}})
			}, "the timer is not kept in memory")
		})
	}
}

// TestNoticesWaitForTheirConsumers (docs/adr/0019): a dispatcher that
// may not make consumers, beside a bootstrap that did not make the
// notices consumers (an older one), takes its partitions all the same
// and sets no notice: a long timer's schedule is its firing, at its due
// time. Once the bootstrap has made them, it binds them and sets
// notices again.
func TestNoticesWaitForTheirConsumers(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	require.NoError(t, bus.Bootstrap(t.Context(), js, bus.Config{}, bus.Durables{}))
	n, err := bus.Partitions(t.Context(), js)
	require.NoError(t, err)
	for p := range n {
		require.NoError(t, js.DeleteConsumer(t.Context(), bus.StreamTimers, bus.PartitionNoticesConsumer(p)))
	}
	b := setupMemOn(t, js, Config{Workers: 2, BindOnly: true}, napDefinition)

	arming := b.napArmed(t, "n1")
	typ, at, _ := b.scheduleOf(t, arming.TimerID)
	require.Equal(t, events.TypeFireTimer, typ, "no notice without its consumer")
	require.Equal(t, arming.Due.UTC().Format(time.RFC3339Nano), at, "the firing, at the due time")
	// The metrics report the consumers bound, not those missing.
	p := b.d.partitionOf("n2")
	reported := func(name string) bool {
		for _, c := range b.d.consumerRefs() {
			if c.Consumer == name {
				return true
			}
		}
		return false
	}
	require.True(t, reported(bus.PartitionTimersConsumer(p)), "the timers consumer is bound")
	require.False(t, reported(bus.PartitionNoticesConsumer(p)), "the notices consumer is not")

	require.NoError(t, bus.Bootstrap(t.Context(), js, bus.Config{}, bus.Durables{}))
	natstest.Eventually(t, 30*time.Second, func() bool { return b.d.noticesHere("n2") },
		"the notices consumer of n2's partition is not bound once made")
	require.True(t, reported(bus.PartitionNoticesConsumer(p)), "the notices consumer bound is reported")
	require.True(t, reported(bus.PartitionTimersConsumer(p)))
	arming = b.napArmed(t, "n2")
	typ, at, _ = b.scheduleOf(t, arming.TimerID)
	require.Equal(t, events.TypeTimerNotice, typ, "a notice, its consumer made")
	require.Equal(t, arming.Due.Add(-noticeLead).UTC().Format(time.RFC3339Nano), at, "a minute before the due time")
}
