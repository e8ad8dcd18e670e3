package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
)

// TestEndRecordsFiring: the timer run tells an end that records its
// sleep's firing (docs/adr/0017) from one that does not, in the message
// as the dispatcher publishes it.
func TestEndRecordsFiring(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		end  *events.ExecutionSucceeded
		want bool
	}{
		{&events.ExecutionSucceeded{Step: &events.StepSucceeded{StepID: "nap", Attempt: 1, Fired: "t1"}}, true},
		{&events.ExecutionSucceeded{Step: &events.StepSucceeded{StepID: "nap", Attempt: 1}}, false},
		{&events.ExecutionSucceeded{Output: []byte(`{"fired":"t1"}`)}, false},
	} {
		msg, err := bus.Encode("jf.events.bench-timers.x1", events.New("test", "x1", timerWorkflow, time.Now(), c.end))
		require.NoError(t, err)
		require.Equal(t, c.want, endRecordsFiring(msg.Header), "%s", msg.Data)
	}
}

// TestWaitRecordsArming: the timer run tells a step.waiting that records
// its timer's arming (docs/adr/0018) from one that does not, in the
// message as the dispatcher publishes it.
func TestWaitRecordsArming(t *testing.T) {
	t.Parallel()
	due := time.Now().Add(time.Minute).UTC()
	for _, c := range []struct {
		wait *events.StepWaiting
		want bool
	}{
		{&events.StepWaiting{StepID: "nap", Attempt: 1, Until: due,
			Timer: &events.TimerArmed{TimerID: "t1", Purpose: events.TimerSleep, StepID: "nap", Attempt: 1, Due: due}}, true},
		{&events.StepWaiting{StepID: "nap", Attempt: 1, Until: due}, false},
		{&events.StepWaiting{StepID: "ask", Attempt: 1, Signals: []string{"timer"}}, false},
	} {
		msg, err := bus.Encode("jf.events.bench-timers.x1", events.New("test", "x1", timerWorkflow, time.Now(), c.wait))
		require.NoError(t, err)
		require.Equal(t, c.want, waitRecordsArming(msg.Header), "%s", msg.Data)
		typ, tracked := trackedType(msg.Header)
		require.Equal(t, c.want, tracked, "%s", msg.Data)
		if c.want {
			require.Equal(t, events.TypeTimerArmed, typ, "counted as the arming")
		}
	}
	for _, c := range []struct {
		p    events.Payload
		want bool
	}{
		{&events.TimerArmed{TimerID: "t1", Purpose: events.TimerSleep, Due: due}, true},
		{&events.TimerFired{TimerID: "t1"}, true},
		{&events.ExecutionSucceeded{}, true},
		{&events.ExecutionFailed{Error: "x"}, true},
		{&events.StepScheduled{StepID: "nap", Attempt: 1}, false},
	} {
		msg, err := bus.Encode("jf.events.bench-timers.x1", events.New("test", "x1", timerWorkflow, time.Now(), c.p))
		require.NoError(t, err)
		typ, tracked := trackedType(msg.Header)
		require.Equal(t, c.want, tracked, "%T", c.p)
		if c.want {
			require.Equal(t, c.p.EventType(), typ)
		}
	}
}
