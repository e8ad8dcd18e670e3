package agent

import (
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/services/internal/metrics"
)

// Metrics are the agent's Prometheus metrics (docs/observability.md).
// Make them once per registry with NewMetrics, for one namespace (wrap
// the registerer with its label), and give them to the agents of that
// namespace in Config.Metrics. A nil *Metrics counts nothing: tests and
// programs that do not serve metrics leave it out.
type Metrics struct {
	inFlight     *prometheus.GaugeVec
	redeliveries *prometheus.CounterVec
	requests     *prometheus.CounterVec
	operations   *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	lag          *metrics.ConsumerLag
}

// Operation outcomes (the outcome label).
const (
	opSucceeded = iota
	opFailed
	// opRefused: the operation did not run (the policy or a missing
	// secret refused it, no handler has its kind, its execution was
	// killed or ended).
	opRefused
	opOutcomes
)

var opOutcomeNames = [opOutcomes]string{"succeeded", "failed", "refused"}

// unregisteredKind is the kind label of an operation no handler of the
// agent runs: tasks name any kind a workflow wrote, and the series stay
// bounded by the handlers.
const unregisteredKind = "unregistered"

// NewMetrics registers the agent's metrics on reg (nil: a registry of
// their own, which nothing serves).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m := &Metrics{
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "jetflow_agent_tasks_in_flight",
			Help: "Tasks the agent's workers have in hand now (checked, run, reported), by queue; at most -concurrency per queue.",
		}, []string{"queue"}),
		redeliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetflow_agent_redeliveries_total",
			Help: "Tasks delivered to the agent again (their earlier delivery's agent died, stalled or handed them back), by queue.",
		}, []string{"queue"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetflow_agent_task_requests_total",
			Help: "The workers' requests for a task, by queue, lane (normal, bulk) and answer: task, none (no task waited, or the request expired), error.",
		}, []string{"queue", "lane", "answer"}),
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "jetflow_agent_operations_total",
			Help: "Operations the agent reported, by kind (unregistered: no handler for it) and outcome: succeeded, failed, refused (not run: policy, secret, no handler, execution killed).",
		}, []string{"kind", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "jetflow_agent_operation_duration_seconds",
			Help:    "How long operations ran on the agent, from the handler's start to its end, by kind and outcome (succeeded, failed).",
			Buckets: []float64{.0005, .001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
		}, []string{"kind", "outcome"}),
		lag: metrics.NewConsumerLag("agent"),
	}
	for _, c := range []prometheus.Collector{m.inFlight, m.redeliveries, m.requests, m.operations, m.duration, m.lag} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("agent: register metrics: %w", err)
		}
	}
	return m, nil
}

// meter is one agent's label children of its Metrics, resolved when it
// is made (its queues and handlers are fixed then): a task costs a map
// lookup and an atomic add or two. A nil *meter counts nothing.
type meter struct {
	m      *Metrics
	queues map[string]queueMeter
	kinds  map[string]*kindMeter
}

type queueMeter struct {
	inFlight    prometheus.Gauge
	redelivered prometheus.Counter
	requests    *requestCounts
}

// The lanes and the answers to a request for a task (the lane and
// answer labels of jetflow_agent_task_requests_total).
const (
	laneNormal = iota
	laneBulk
	laneCount
)

const (
	answerTask = iota
	answerNone
	answerError
	answerCount
)

var (
	laneNames   = [laneCount]string{"normal", "bulk"}
	answerNames = [answerCount]string{"task", "none", "error"}
)

// requestCounts count one queue's requests for a task, by lane and
// answer. A nil *requestCounts counts nothing.
type requestCounts [laneCount][answerCount]prometheus.Counter

// count counts a request to lane answered by m (nil: no task) or err.
func (c *requestCounts) count(lane int, m jetstream.Msg, err error) {
	if c == nil {
		return
	}
	answer := answerNone
	switch {
	case err != nil:
		answer = answerError
	case m != nil:
		answer = answerTask
	}
	c[lane][answer].Inc()
}

type kindMeter struct {
	count    [opOutcomes]prometheus.Counter
	duration [opOutcomes]prometheus.Observer // nil for refused
}

// meter resolves the children of queues and of the kinds of handlers.
func (m *Metrics) meter(queues []string, handlers map[string]struct{}) *meter {
	if m == nil {
		return nil
	}
	mt := &meter{m: m, queues: map[string]queueMeter{}, kinds: map[string]*kindMeter{}}
	for _, q := range queues {
		var asked requestCounts
		for lane, ln := range laneNames {
			for answer, an := range answerNames {
				asked[lane][answer] = m.requests.WithLabelValues(q, ln, an)
			}
		}
		mt.queues[q] = queueMeter{inFlight: m.inFlight.WithLabelValues(q), redelivered: m.redeliveries.WithLabelValues(q), requests: &asked}
	}
	for k := range handlers {
		mt.kinds[k] = m.kind(k)
	}
	mt.kinds[unregisteredKind] = m.kind(unregisteredKind)
	return mt
}

func (m *Metrics) kind(k string) *kindMeter {
	var km kindMeter
	for o, name := range opOutcomeNames {
		km.count[o] = m.operations.WithLabelValues(k, name)
		if o != opRefused {
			km.duration[o] = m.duration.WithLabelValues(k, name)
		}
	}
	return &km
}

// upDown counts what is in hand: a gauge, or nothing.
type upDown interface {
	Inc()
	Dec()
}

type noCount struct{}

func (noCount) Inc() {}
func (noCount) Dec() {}

// inFlight is the count of queue's tasks in hand (a worker counts each
// task up while it has it).
func (mt *meter) inFlight(queue string) upDown {
	if mt == nil {
		return noCount{}
	}
	if g := mt.queues[queue].inFlight; g != nil {
		return g
	}
	return noCount{}
}

// requests are the counts of queue's requests for a task (nil: none).
func (mt *meter) requests(queue string) *requestCounts {
	if mt == nil {
		return nil
	}
	return mt.queues[queue].requests
}

// redelivered counts a task of queue delivered again.
func (mt *meter) redelivered(queue string) {
	if mt == nil {
		return
	}
	if c := mt.queues[queue].redelivered; c != nil {
		c.Inc()
	}
}

// operation counts an operation of kind that ended with outcome, having
// run for took (refused: it did not run).
func (mt *meter) operation(kind string, outcome int, took time.Duration) {
	if mt == nil {
		return
	}
	k, ok := mt.kinds[kind]
	if !ok {
		k = mt.kinds[unregisteredKind]
	}
	k.count[outcome].Inc()
	if d := k.duration[outcome]; d != nil {
		d.Observe(took.Seconds())
	}
}

// watchConsumers reports the backlog of the queues' consumers at each
// scrape (the bulk lane's once bound), until stop is called.
func (mt *meter) watchConsumers(a *Agent, queues []*lanes) (stop func()) {
	if mt == nil {
		return func() {}
	}
	return mt.m.lag.Watch(a.js, func() []metrics.ConsumerRef {
		out := make([]metrics.ConsumerRef, 0, 2*len(queues))
		for _, l := range queues {
			out = append(out, metrics.ConsumerRef{Stream: bus.StreamTasks, Consumer: bus.AgentConsumer(l.queue)})
			if l.bulkConsumer() != nil {
				out = append(out, metrics.ConsumerRef{Stream: bus.StreamTasks, Consumer: bus.AgentBulkConsumer(l.queue)})
			}
		}
		return out
	})
}
