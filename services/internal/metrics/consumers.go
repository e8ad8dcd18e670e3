package metrics

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// ConsumerRef names a durable consumer of a stream.
type ConsumerRef struct{ Stream, Consumer string }

// LagTimeout bounds how long a scrape waits for the consumers' info: a
// NATS server that does not answer (a leader being elected, a
// partition) must not hold the scrape past Prometheus's own timeout. A
// consumer whose info did not come in time is left out of that scrape
// and counted in jetflow_consumer_info_errors_total.
const LagTimeout = 2 * time.Second

// lagLookups bounds the consumer info requests of one scrape in flight at
// once (a dispatcher holding every partition binds 3 + 4×partitions).
const lagLookups = 8

// ConsumerLag is a collector of the backlog of the durable consumers a
// service binds, read from the server at each scrape (a consumer info
// request each, in parallel, bounded by LagTimeout): nothing is counted
// on the paths that handle messages, and the numbers are the server's,
// shared by every process bound to the consumer. Services attach what
// they bind with Watch; a nil *ConsumerLag collects nothing.
type ConsumerLag struct {
	pending, ackPending, errs *prometheus.Desc

	mu      sync.Mutex
	sources map[*lagSource]struct{}
	failed  atomic.Uint64
}

type lagSource struct {
	js   jetstream.JetStream
	list func() []ConsumerRef
}

// NewConsumerLag returns the collector of service's consumers (the
// service label of its metrics: every service registered on one
// registry, as jetflow dev does, has its own).
func NewConsumerLag(service string) *ConsumerLag {
	l := prometheus.Labels{"service": service}
	vars := []string{"stream", "consumer"}
	return &ConsumerLag{
		pending: prometheus.NewDesc("jetflow_consumer_pending_messages",
			"Messages of the consumer's stream not yet delivered to it (NumPending: the backlog waiting for the service), at the last scrape.",
			vars, l),
		ackPending: prometheus.NewDesc("jetflow_consumer_ack_pending_messages",
			"Messages delivered to the consumer and not yet acknowledged (NumAckPending: in the service's hands), at the last scrape.",
			vars, l),
		errs: prometheus.NewDesc("jetflow_consumer_info_errors_total",
			"Consumer info requests of scrapes that failed or did not answer within 2s (that consumer is left out of the scrape).",
			nil, l),
		sources: map[*lagSource]struct{}{},
	}
}

// Watch adds the consumers list names, read with js, to those reported
// at each scrape, until stop is called. list is called at each scrape,
// so it may name consumers bound since (a dispatcher's partitions); it
// must be safe to call from any goroutine. A consumer named by several
// sources is reported once.
func (c *ConsumerLag) Watch(js jetstream.JetStream, list func() []ConsumerRef) (stop func()) {
	if c == nil {
		return func() {}
	}
	s := &lagSource{js: js, list: list}
	c.mu.Lock()
	c.sources[s] = struct{}{}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.sources, s)
		c.mu.Unlock()
	}
}

// Describe implements prometheus.Collector.
func (c *ConsumerLag) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.ackPending
	ch <- c.errs
}

// Collect implements prometheus.Collector: it asks the server for the
// info of every consumer watched.
func (c *ConsumerLag) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	sources := make([]*lagSource, 0, len(c.sources))
	for s := range c.sources {
		sources = append(sources, s)
	}
	c.mu.Unlock()
	refs := map[ConsumerRef]jetstream.JetStream{}
	for _, s := range sources {
		for _, r := range s.list() {
			if _, ok := refs[r]; !ok {
				refs[r] = s.js
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), LagTimeout)
	defer cancel()
	sem := make(chan struct{}, lagLookups)
	var wg sync.WaitGroup
	for r, js := range refs {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			cons, err := js.Consumer(ctx, r.Stream, r.Consumer)
			if err != nil {
				c.failed.Add(1)
				return
			}
			info := cons.CachedInfo()
			ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(info.NumPending), r.Stream, r.Consumer)
			ch <- prometheus.MustNewConstMetric(c.ackPending, prometheus.GaugeValue, float64(info.NumAckPending), r.Stream, r.Consumer)
		})
	}
	wg.Wait()
	ch <- prometheus.MustNewConstMetric(c.errs, prometheus.CounterValue, float64(c.failed.Load()))
}
