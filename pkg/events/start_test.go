package events_test

import (
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
)

// TestAResultsStartIsOptional: a step's result and an agent's final
// report carry the operation's start as optional members. Events are read
// without refusing members the reader does not know, which is what lets
// an older jetflow read a newer one's start (it passes over it) and this
// one read a member a later release adds; without a start, the data is
// what an older writer wrote.
func TestAResultsStartIsOptional(t *testing.T) {
	t.Parallel()

	at := time.Date(2026, 3, 14, 15, 0, 2, 300_000_000, time.UTC)
	decode := func(typ events.Type, data string) events.Event {
		t.Helper()
		ce := event.New()
		ce.SetID("e1")
		ce.SetType(string(typ))
		ce.SetSource("jetflow/dispatcher")
		require.NoError(t, ce.SetData(event.ApplicationJSON, []byte(data)))
		ev, err := events.FromCloudEvent(ce)
		require.NoError(t, err, data)
		return ev
	}

	ev := decode(events.TypeStepSucceeded, `{"step_id":"a","attempt":1,"agent":"ag","started_at":"2026-03-14T15:00:02.3Z","delivery":2,"added_later":{"x":1}}`)
	ok := ev.Data.(*events.StepSucceeded)
	require.True(t, at.Equal(ok.StartedAt))
	require.Equal(t, 2, ok.Delivery)

	ev = decode(events.TypeOperationFailed, `{"task_id":"x.a.1","step_id":"a","attempt":1,"delivery":3,"error":"boom","started_at":"2026-03-14T15:00:02.3Z"}`)
	failed := ev.Data.(*events.OperationFailed)
	require.True(t, at.Equal(failed.StartedAt))
	require.Equal(t, 3, failed.Delivery)

	// Without a start nothing is written for it: an older reader's data.
	b, err := events.EncodeStructured(events.Event{ID: "e2", Type: events.TypeStepSucceeded, Source: "s",
		Data: &events.StepSucceeded{StepID: "a", Attempt: 1}})
	require.NoError(t, err)
	require.NotContains(t, string(b), "started_at")
	require.NotContains(t, string(b), "delivery")
}
