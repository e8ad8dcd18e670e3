package metrics_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/services/internal/metrics"
	"jetflow.dev/services/internal/metrics/metricstest"
)

// TestConsumerLag: a scrape reports the backlog of each consumer watched,
// as the server counts it (three tasks stored, one of them taken and not
// acknowledged: 2 pending, 1 in hand), once however many sources name
// it; a consumer that does not exist is left out and counted as an error;
// a source stopped is no longer asked about.
func TestConsumerLag(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	spec := bus.AgentQueueConsumer(bus.Durables{}, "lag")
	cons, err := js.CreateOrUpdateConsumer(t.Context(), spec.Stream, spec.Config)
	require.NoError(t, err)
	for i := range 3 {
		_, err := js.Publish(t.Context(), bus.TaskSubject("lag"), []byte{byte(i)})
		require.NoError(t, err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	for range batch.Messages() { // taken, not acknowledged
	}
	require.NoError(t, batch.Error())

	lag := metrics.NewConsumerLag("agent")
	reg := prometheus.NewRegistry()
	reg.MustRegister(lag)
	ref := metrics.ConsumerRef{Stream: spec.Stream, Consumer: spec.Config.Durable}
	stop := lag.Watch(js, func() []metrics.ConsumerRef { return []metrics.ConsumerRef{ref} })
	stopMissing := lag.Watch(js, func() []metrics.ConsumerRef {
		return []metrics.ConsumerRef{ref, {Stream: spec.Stream, Consumer: "nobody"}}
	})
	labels := []string{"service", "agent", "stream", spec.Stream, "consumer", spec.Config.Durable}
	require.Equal(t, 1, metricstest.Series(t, reg, "jetflow_consumer_pending_messages", labels...), "one series however many sources name it")
	require.Equal(t, 2.0, metricstest.Value(t, reg, "jetflow_consumer_pending_messages", labels...))
	require.Equal(t, 1.0, metricstest.Value(t, reg, "jetflow_consumer_ack_pending_messages", labels...))
	require.Equal(t, 0, metricstest.Series(t, reg, "jetflow_consumer_pending_messages", "consumer", "nobody"))
	require.GreaterOrEqual(t, metricstest.Value(t, reg, "jetflow_consumer_info_errors_total", "service", "agent"), 1.0)

	stopMissing()
	errs := metricstest.Value(t, reg, "jetflow_consumer_info_errors_total")
	require.Equal(t, 1, metricstest.Series(t, reg, "jetflow_consumer_pending_messages"))
	require.Equal(t, errs, metricstest.Value(t, reg, "jetflow_consumer_info_errors_total"), "the missing consumer is no longer asked about")
	stop()
	require.Equal(t, 0, metricstest.Series(t, reg, "jetflow_consumer_pending_messages"))

	// A nil collector (metrics off) watches nothing.
	var none *metrics.ConsumerLag
	none.Watch(js, nil)()
}
