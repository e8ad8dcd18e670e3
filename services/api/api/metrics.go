package api

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"jetflow.dev/services/api/projector"
)

var (
	parkedDesc = prometheus.NewDesc("jetflow_projections_parked",
		"Executions whose read model the api's projector could not write and retries on its own.",
		[]string{"namespace"}, nil)
	missingDesc = prometheus.NewDesc("jetflow_topology_missing",
		"1 for each stream or bucket the api found missing at its last look (jetflow bootstrap makes it again).",
		[]string{"name"}, nil)
	projectedDesc = prometheus.NewDesc("jetflow_projector_events_total",
		"Events the api's projector has projected into the read models (an event delivered again counts again).",
		[]string{"namespace"}, nil)
	indexLiveDesc = prometheus.NewDesc("jetflow_visibility_live",
		"1 while the api's visibility index has caught up with the read models since it started or was reset; 0 while it is being fed (lists by time or attribute answer 503).",
		[]string{"namespace"}, nil)
	indexRevisionDesc = prometheus.NewDesc("jetflow_visibility_revision",
		"The executions bucket revision the api's visibility index has applied (compare with the bucket's last revision to see it behind).",
		[]string{"namespace"}, nil)
	writesDesc = prometheus.NewDesc("jetflow_projector_writes_total",
		"Read models the api's projector has written, parked ones written again included (once for several events: -projector-coalesce under load, -projector-gather otherwise).",
		[]string{"namespace"}, nil)
	gatheringDesc = prometheus.NewDesc("jetflow_projector_gathering",
		"1 while the api's projector gathers the events of -projector-coalesce before it writes the read models (events come fast; the models lag that much), 0 while it waits -projector-gather.",
		[]string{"namespace"}, nil)
)

// newLagHistogram is, for each read model written with new events, how
// long the oldest of them had waited, by namespace.
func newLagHistogram() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "jetflow_projector_lag_seconds",
		Help:    "For each read model the api's projector wrote with new events, how long the oldest of them had waited (now minus its time, by the recording dispatcher's clock).",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"namespace"})
}

// newListHistogram is how long lists from the visibility index take, by
// namespace: the wait for the index to hold what the read models held
// and the query.
func newListHistogram() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "jetflow_visibility_list_seconds",
		Help:    "How long GET /v1/executions took when answered from the visibility index: the wait for the index to apply what the read models held when asked, and the query.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, []string{"namespace"})
}

// observe has proj report its read models' lag to s's histogram, as
// namespace ns (before proj runs).
func (s *Server) observe(ns string, proj *projector.Projector) {
	lag := s.projectorLag.WithLabelValues(ns)
	proj.OnWrite = func(d time.Duration) { lag.Observe(d.Seconds()) }
}

// collector reports, at each scrape, what /readyz says (the parked read
// models per namespace and the missing streams and buckets) and what the
// projectors have done (events, writes, lag).
type collector struct{ s *Server }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- parkedDesc
	ch <- missingDesc
	ch <- projectedDesc
	ch <- writesDesc
	ch <- gatheringDesc
	ch <- indexLiveDesc
	ch <- indexRevisionDesc
	c.s.projectorLag.Describe(ch)
	c.s.listDuration.Describe(ch)
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for ns, p := range c.s.projectors {
		ch <- prometheus.MustNewConstMetric(parkedDesc, prometheus.GaugeValue, float64(len(p.Parked())), ns)
		st := p.Stats()
		ch <- prometheus.MustNewConstMetric(projectedDesc, prometheus.CounterValue, float64(st.Events), ns)
		ch <- prometheus.MustNewConstMetric(writesDesc, prometheus.CounterValue, float64(st.Writes), ns)
		gathering := 0.0
		if st.Gathering {
			gathering = 1
		}
		ch <- prometheus.MustNewConstMetric(gatheringDesc, prometheus.GaugeValue, gathering, ns)
	}
	c.s.projectorLag.Collect(ch)
	for ns, f := range c.s.feeds {
		live := 0.0
		if f.Live() {
			live = 1
		}
		ch <- prometheus.MustNewConstMetric(indexLiveDesc, prometheus.GaugeValue, live, ns)
		ch <- prometheus.MustNewConstMetric(indexRevisionDesc, prometheus.GaugeValue, float64(f.Revision()), ns)
	}
	c.s.listDuration.Collect(ch)
	if c.s.cfg.Missing == nil {
		return
	}
	for _, name := range c.s.cfg.Missing() {
		ch <- prometheus.MustNewConstMetric(missingDesc, prometheus.GaugeValue, 1, name)
	}
}
