package dispatch

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/partition"
)

// TestRouteForwardsTheCommandAsPublished: the intake puts a command in
// its execution's partition of the inbox with its body byte for byte (the
// handler's strict checks must see what the sender sent, an unknown
// member included), its CloudEvent headers, the subject it arrived on,
// and none of the sender's JetStream headers; routing it twice stores it
// once.
func TestRouteForwardsTheCommandAsPublished(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	d, err := New(t.Context(), Config{}, js, zerolog.Nop())
	require.NoError(t, err)

	body := []byte(`{"workflow":"wf","execution_id":"x1","inptu":{"a":1}}`)
	m := nats.NewMsg(bus.SubjectStart)
	for k, v := range map[string]string{"ce-specversion": "1.0", "ce-id": "c1", "ce-source": "urn:test",
		"ce-type": string(events.TypeStartExecution), "content-type": "application/json", "Nats-Msg-Id": "mine"} {
		m.Header.Set(k, v)
	}
	m.Data = body
	_, err = js.PublishMsg(t.Context(), m)
	require.NoError(t, err)
	cons, err := js.OrderedConsumer(t.Context(), bus.StreamCommands, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	got, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	require.NoError(t, err)
	ev, err := bus.Decode(got.Headers(), got.Data())
	require.NoError(t, err)

	require.NoError(t, d.route(t.Context(), got, ev))
	require.NoError(t, d.route(t.Context(), got, ev), "routed again: a duplicate")

	stream, err := js.Stream(t.Context(), bus.StreamInbox)
	require.NoError(t, err)
	info, err := stream.Info(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, 1, info.State.Msgs, "stored once")
	routed, err := stream.GetLastMsgForSubject(t.Context(), bus.InboxSubject(partition.Of("x1", d.parts.n), "x1"))
	require.NoError(t, err)
	require.Equal(t, body, routed.Data)
	require.Equal(t, bus.SubjectStart, routed.Header.Get(CommandSubjectHeader))
	require.Equal(t, "c1", routed.Header.Get("ce-id"))
	require.NotEqual(t, "mine", routed.Header.Get("Nats-Msg-Id"), "the sender's message id is its own stream's")
}
