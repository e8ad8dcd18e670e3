package bus_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
)

// TestDecodeAcceptsAnyHeaderCase decodes a message as `nats pub -H K:V`
// sends it when people type header keys in HTTP's canonical case.
func TestDecodeAcceptsAnyHeaderCase(t *testing.T) {
	t.Parallel()
	h := nats.Header{}
	for _, kv := range [][2]string{{"Ce-Specversion", "1.0"}, {"CE-ID", "e-1"}, {"Ce-Source", "urn:x"},
		{"Ce-Type", string(events.TypeStartExecution)}, {"Content-Type", "application/json"}, {"Ce-Workflow", "wf"}} {
		h.Add(kv[0], kv[1])
	}
	ev, err := bus.Decode(h, []byte(`{"workflow":"wf","execution_id":"x1"}`))
	require.NoError(t, err)
	require.Equal(t, "e-1", ev.ID)
	require.Equal(t, "urn:x", ev.Source)
	require.Equal(t, "wf", ev.Workflow)
	require.Equal(t, &events.StartExecution{Workflow: "wf", ExecutionID: "x1"}, ev.Data)

	// When both spellings are present the lower-case one (the binding's) wins.
	h.Set("ce-id", "e-2")
	ev, err = bus.Decode(h, []byte(`{"workflow":"wf"}`))
	require.NoError(t, err)
	require.Equal(t, "e-2", ev.ID)
}
