package dispatch

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/workflow"
)

// A take that finds no trace of the lease does not look for what its last
// holder left: the dispatchers' bucket must keep an expiry's marker for
// longer than a rescue looks back (with the longest lease TTL), or a
// holder that died within the window would look like none.
func TestExpiryMarkersOutliveTheRescueWindow(t *testing.T) {
	t.Parallel()
	require.Less(t, rescueWindow+Ranges.LeaseTTL.Max, bus.DispatchersMarkerTTL)
	// A rescue's read leaves part of its time to the executions that go
	// on (history.ScanIf.Share: 0 or 1 would not).
	require.Greater(t, rescueShare, 0.0)
	require.Less(t, rescueShare, 1.0)
	for _, c := range []struct {
		v    partition.Vacancy
		died bool
	}{{partition.VacancyNever, false}, {partition.VacancyReleased, false}, {partition.VacancyExpired, true}, {partition.VacancyUnknown, true}} {
		require.Equal(t, c.died, mayHaveDied(c.v), c.v.String())
	}
}

// A rescue decodes only the events that may dispatch a local step, by
// their data (rescueReads): each event that does (dispatchesLocal), as
// the dispatcher encodes it, must be read, and those of another queue
// are passed over.
func TestARescueReadsEveryEventThatDispatchesALocalStep(t *testing.T) {
	t.Parallel()
	dispatch := func(queue string) *events.StepDispatched {
		return &events.StepDispatched{StepID: "s", Kind: "noop", Attempt: 1, TaskID: "t-1", Queue: queue, Input: json.RawMessage(`{"queue":"x"}`)}
	}
	payloads := func(queue string) []events.Payload {
		d := dispatch(queue)
		return []events.Payload{d, d.Sending(),
			&events.StepSucceeded{StepID: "r", Attempt: 1, Output: json.RawMessage(`{"ok":true}`), Then: dispatch(queue)},
			&events.ExecutionStarted{Workflow: "w", Version: 1, Input: json.RawMessage(`{}`), Then: dispatch(queue)}}
	}
	for _, queue := range []string{workflow.LocalQueue, "default", "_local2", "x_local"} {
		for _, p := range payloads(queue) {
			ev := events.New("jetflow/test", "e-1", "w", time.Now(), p)
			msg, err := bus.Encode(bus.ExecutionSubject("w", "e-1"), ev)
			require.NoError(t, err)
			decoded, err := bus.Decode(msg.Header, msg.Data)
			require.NoError(t, err)
			local := queue == workflow.LocalQueue
			require.Equal(t, local, dispatchesLocal(decoded), "%s %s", ev.Type, msg.Data)
			require.Equal(t, local, rescueReads(string(ev.Type), msg.Data), "%s %s", ev.Type, msg.Data)
		}
	}
	for _, p := range []events.Payload{&events.ExecutionSucceeded{}, &events.ExecutionFailed{Error: "x"}, &events.ExecutionCancelled{}} {
		ev := events.New("jetflow/test", "e-1", "w", time.Now(), p)
		msg, err := bus.Encode(bus.ExecutionSubject("w", "e-1"), ev)
		require.NoError(t, err)
		require.True(t, rescueReads(string(ev.Type), msg.Data), "an end is read: it says the execution ended")
	}
	require.False(t, rescueReads(string(events.TypeStepStarted), []byte(`{"queue":"_local"}`)), "a type a rescue does not look at")
}
