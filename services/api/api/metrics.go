package api

import (
	"github.com/prometheus/client_golang/prometheus"
)

var (
	parkedDesc = prometheus.NewDesc("jetflow_projections_parked",
		"Executions whose read model the api's projector could not write and retries on its own.",
		[]string{"namespace"}, nil)
	missingDesc = prometheus.NewDesc("jetflow_topology_missing",
		"1 for each stream or bucket the api found missing at its last look (jetflow bootstrap makes it again).",
		[]string{"name"}, nil)
)

// collector reports, at each scrape, what /readyz says: the parked read
// models per namespace and the missing streams and buckets.
type collector struct{ s *Server }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- parkedDesc
	ch <- missingDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	for ns, p := range c.s.projectors {
		ch <- prometheus.MustNewConstMetric(parkedDesc, prometheus.GaugeValue, float64(len(p.Parked())), ns)
	}
	if c.s.cfg.Missing == nil {
		return
	}
	for _, name := range c.s.cfg.Missing() {
		ch <- prometheus.MustNewConstMetric(missingDesc, prometheus.GaugeValue, 1, name)
	}
}
