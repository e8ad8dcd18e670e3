package dispatch

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
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
	"jetflow.dev/pkg/workflow"
)

// timerIDOf is interp.timerID.
func timerIDOf(execID, purpose, stepID string, attempt int) string {
	h := sha256.Sum256([]byte(execID + "\x00" + purpose + "\x00" + stepID + "\x00" + strconv.Itoa(attempt)))
	return "t" + hex.EncodeToString(h[:12])
}

// TestATimerArmedAgainFiresAtItsLatestDueTime: a decision arms a timer
// (its Before effect, publishSchedule, runs before the append of its
// arming: the wait's, docs/adr/0018), the append fails (a conflict, a leader election), and the
// decision taken again a moment later arms the same timer with a later
// due time, which the history records. The second schedule replaces the
// first in JF_TIMERS; the first arming's entry in memory must not fire
// the timer at the first due time (found by an independent review: it
// did, 3.5 s before the due time the history holds).
func TestATimerArmedAgainFiresAtItsLatestDueTime(t *testing.T) {
	for _, fromMemory := range []bool{true, false} {
		t.Run("fromMemory="+strconv.FormatBool(fromMemory), func(t *testing.T) {
			_, js := natstest.Connect(t, natstest.RunJetStream(t))
			defs, err := catalog.Open(t.Context(), js)
			require.NoError(t, err)
			def, err := workflow.Parse([]byte("name: waitto\nsteps:\n  - {id: w, kind: wait, signal: go, timeout: 5s}\n"))
			require.NoError(t, err)
			_, _, err = defs.Apply(t.Context(), def)
			require.NoError(t, err)
			d, err := New(t.Context(), Config{NoTimersFromMemory: !fromMemory}, js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
			require.NoError(t, err)
			natstest.Serve(t, d.Run)
			natstest.Eventually(t, 30*time.Second, func() bool { return d.Ready() == nil }, "ready")
			time.Sleep(time.Second) // partitions taken (a timer of one not held is looked at again)

			tid := timerIDOf("x1", events.TimerWaitTimeout, "w", 1)
			// The first decision's effect, whose TimerArmed append then failed.
			require.NoError(t, d.publishSchedule(t.Context(), "x1", "waitto", tid, time.Now().Add(1500*time.Millisecond), 0))

			ev := events.New("test", "", "", time.Now(), &events.StartExecution{Workflow: "waitto", ExecutionID: "x1"})
			msg, err := bus.Encode(bus.SubjectStart, ev)
			require.NoError(t, err)
			_, err = js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(ev.ID))
			require.NoError(t, err)

			var armed *events.TimerArmed
			var fired *events.Event
			natstest.Eventually(t, 20*time.Second, func() bool {
				evs, err := history.Read(t.Context(), js, bus.ExecutionSubject("waitto", "x1"), 0)
				if err != nil {
					return false
				}
				for i, e := range evs {
					if a := events.ArmingOf(e.Data); a != nil { // its own event, or the wait's (docs/adr/0018)
						armed = a
					}
					if _, ok := e.Data.(*events.TimerFired); ok {
						fired = &evs[i]
					}
				}
				return armed != nil && fired != nil
			}, "armed and fired")
			require.Equal(t, tid, armed.TimerID)
			t.Logf("recorded due %s, fired at %s (%s before its due time)", armed.Due.Format(time.StampMilli), fired.Time.Format(time.StampMilli), armed.Due.Sub(fired.Time))
			require.False(t, fired.Time.Before(armed.Due), "timer.fired recorded %s before the due time the history recorded", armed.Due.Sub(fired.Time))
		})
	}
}
