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
	// Each scrape asks the server anew, each answer within LagTimeout: on
	// a loaded machine one may come too late, leave its consumer out of
	// that scrape and count an error. The claims are read from scrapes
	// whose answer about the consumer came.
	var got lagScrape
	natstest.Eventually(t, 30*time.Second, func() bool {
		got = scrapeLag(t, reg)
		_, ok := got.pending[spec.Config.Durable]
		return ok
	}, "no scrape reported the consumer")
	require.Equal(t, map[string]float64{spec.Config.Durable: 2}, got.pending, "one series however many sources name it; the missing consumer left out")
	require.Equal(t, map[string]float64{spec.Config.Durable: 1}, got.ackPending)
	require.GreaterOrEqual(t, got.errs, 1.0, "the missing consumer counted as an error")

	stopMissing()
	var before, after lagScrape
	natstest.Eventually(t, 30*time.Second, func() bool {
		before, after = scrapeLag(t, reg), scrapeLag(t, reg)
		_, a := before.pending[spec.Config.Durable]
		_, b := after.pending[spec.Config.Durable]
		return a && b
	}, "no two scrapes in a row reported the consumer")
	require.Len(t, after.pending, 1)
	require.Equal(t, before.errs, after.errs, "the missing consumer is no longer asked about")
	stop()
	require.Equal(t, 0, metricstest.Series(t, reg, "jetflow_consumer_pending_messages"))

	// A nil collector (metrics off) watches nothing.
	var none *metrics.ConsumerLag
	none.Watch(js, nil)()
}

// lagScrape is what one scrape of the consumers' backlog said: pending
// and in-hand messages by consumer, and the errors counted so far.
type lagScrape struct {
	pending, ackPending map[string]float64
	errs                float64
}

// scrapeLag gathers reg once.
func scrapeLag(t *testing.T, reg *prometheus.Registry) lagScrape {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := lagScrape{pending: map[string]float64{}, ackPending: map[string]float64{}}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			consumer := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "consumer" {
					consumer = l.GetValue()
				}
			}
			switch mf.GetName() {
			case "jetflow_consumer_pending_messages":
				out.pending[consumer] = m.GetGauge().GetValue()
			case "jetflow_consumer_ack_pending_messages":
				out.ackPending[consumer] = m.GetGauge().GetValue()
			case "jetflow_consumer_info_errors_total":
				out.errs += m.GetCounter().GetValue()
			}
		}
	}
	return out
}
