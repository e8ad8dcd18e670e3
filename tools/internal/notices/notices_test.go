package notices

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/partition"
)

// schedule publishes the schedule of timer id of execution exec, due at
// due, as a dispatcher sets it: its notice, at noticeAt, or (noticeAt
// zero) its firing, at due.
func schedule(t *testing.T, js jetstream.JetStream, n int, exec, id string, due, noticeAt time.Time) uint64 {
	t.Helper()
	at, target := due, bus.PartitionTimerSubject(partition.Of(exec, n), exec)
	var p events.Payload = &events.FireTimer{ExecutionID: exec, Workflow: "wf", TimerID: id}
	if !noticeAt.IsZero() {
		at, target = noticeAt, bus.PartitionNoticeSubject(partition.Of(exec, n), exec)
		p = &events.TimerNotice{ExecutionID: exec, Workflow: "wf", TimerID: id, Due: due}
	}
	msg, err := bus.ScheduleMsg(id, events.New("jetflow/dispatcher", exec, "wf", time.Now(), p), at, target)
	require.NoError(t, err)
	ack, err := js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
	return ack.Sequence
}

// pending reads timer id's schedule: the event, when it fires, where.
func pending(t *testing.T, js jetstream.JetStream, id string) (events.Event, string, string, uint64) {
	t.Helper()
	stream, err := js.Stream(t.Context(), bus.StreamTimers)
	require.NoError(t, err)
	m, err := stream.GetLastMsgForSubject(t.Context(), bus.ScheduleSubject(id))
	require.NoError(t, err)
	ev, err := bus.Decode(m.Header, m.Data)
	require.NoError(t, err)
	return ev, m.Header.Get("Nats-Schedule"), m.Header.Get("Nats-Schedule-Target"), m.Sequence
}

// TestToFiringsSetsNoticesBackToTheirFirings: every pending notice
// becomes its timer's firing at its due time, on the execution's timers
// subject, and fires then; a firing is left as it is; a notice replaced
// since it was read is left to its new schedule.
func TestToFiringsSetsNoticesBackToTheirFirings(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	require.NoError(t, bus.Bootstrap(t.Context(), js, bus.Config{}, bus.Durables{}))
	n, err := bus.Partitions(t.Context(), js)
	require.NoError(t, err)
	later := time.Now().Add(3 * time.Hour).Truncate(time.Millisecond)
	notice := later.Add(-time.Minute)
	schedule(t, js, n, "x1", "t1", later, notice)
	firing := schedule(t, js, n, "x2", "t2", later, time.Time{})
	// A timer due in 2 s whose notice would come only in an hour (as if
	// it waited for a dispatcher that knows notices): set back, it fires
	// at its due time.
	schedule(t, js, n, "x3", "t3", time.Now().Add(2*time.Second), notice)

	// A notice replaced after it was read (a re-arming) is left as it is.
	stale := schedule(t, js, n, "x4", "t4", later, notice)
	rearmed := schedule(t, js, n, "x4", "t4", later.Add(time.Hour), notice.Add(time.Hour))
	set, err := toFiring(t.Context(), js, &events.TimerNotice{ExecutionID: "x4", Workflow: "wf", TimerID: "t4", Due: later}, stale, n, time.Now())
	require.NoError(t, err)
	require.False(t, set, "the schedule read is no longer the timer's")
	_, _, _, seq := pending(t, js, "t4")
	require.Equal(t, rearmed, seq, "the re-arming's schedule is kept")

	// A notice that fired and waits for a dispatcher that knows notices.
	fired, err := bus.Encode(bus.PartitionNoticeSubject(partition.Of("x5", n), "x5"), events.New("jetflow/dispatcher", "x5", "wf", time.Now(),
		&events.TimerNotice{ExecutionID: "x5", Workflow: "wf", TimerID: "t5", Due: later}))
	require.NoError(t, err)
	_, err = js.PublishMsg(t.Context(), fired)
	require.NoError(t, err)

	res, err := ToFirings(t.Context(), js, time.Now)
	require.NoError(t, err)
	require.Equal(t, Result{Schedules: 4, Notices: 3, Set: 3, Passes: 2, Fired: 1}, res,
		"a second pass finds no notice left; the fired one is counted, for the rollback to wait for")

	ev, at, target, _ := pending(t, js, "t1")
	require.Equal(t, events.TypeFireTimer, ev.Type)
	require.Equal(t, &events.FireTimer{ExecutionID: "x1", Workflow: "wf", TimerID: "t1"}, ev.Data)
	require.Equal(t, "fire-t1", ev.ID)
	require.Equal(t, Source, ev.Source)
	require.Equal(t, "@at "+later.UTC().Format(time.RFC3339Nano), at, "at the due time")
	require.Equal(t, bus.PartitionTimerSubject(partition.Of("x1", n), "x1"), target, "on the execution's timers subject")
	_, _, _, seq = pending(t, js, "t2")
	require.Equal(t, firing, seq, "a firing is left as it is")
	ev, _, _, _ = pending(t, js, "t4")
	require.Equal(t, events.TypeFireTimer, ev.Type, "the re-armed notice is set back too, once read as it is")

	// The one due soon fires at its due time, into the timers subject.
	stream, err := js.Stream(t.Context(), bus.StreamTimers)
	require.NoError(t, err)
	natstest.Eventually(t, 30*time.Second, func() bool {
		_, err := stream.GetLastMsgForSubject(t.Context(), bus.PartitionTimerSubject(partition.Of("x3", n), "x3"))
		_, gone := stream.GetLastMsgForSubject(t.Context(), bus.ScheduleSubject("t3"))
		return err == nil && errors.Is(gone, jetstream.ErrMsgNotFound)
	}, "the firing of t3 did not fire (and leave its schedule)")

	// Run again: nothing left to set.
	res, err = ToFirings(t.Context(), js, time.Now)
	require.NoError(t, err)
	require.Equal(t, Result{Schedules: 3, Passes: 1, Fired: 1}, res, "t3's schedule fired; the other three are firings")
}
