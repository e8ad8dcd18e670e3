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
