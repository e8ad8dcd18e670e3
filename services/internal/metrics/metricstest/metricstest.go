// Package metricstest reads the metrics a test's registry gathered: the
// tests of each service's metrics drive real work and check that the
// value moved. Only tests import it.
package metricstest

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value gathers g and returns the total of the series of metric name
// whose labels include labels (pairs: name, value): a counter's or a
// gauge's value, a histogram's count of observations. 0 when no series
// matches (a family not gathered has none).
func Value(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, _ := values(t, g, name, labels)
	return v
}

// Sum is a histogram's sum of observations over the series Value adds up.
func Sum(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	_, s := values(t, g, name, labels)
	return s
}

// Series counts the series of metric name whose labels include labels.
func Series(t testing.TB, g prometheus.Gatherer, name string, labels ...string) int {
	t.Helper()
	return len(matching(t, g, name, labels))
}

func values(t testing.TB, g prometheus.Gatherer, name string, labels []string) (value, sum float64) {
	t.Helper()
	for _, m := range matching(t, g, name, labels) {
		switch {
		case m.Counter != nil:
			value += m.Counter.GetValue()
		case m.Gauge != nil:
			value += m.Gauge.GetValue()
		case m.Histogram != nil:
			value += float64(m.Histogram.GetSampleCount())
			sum += m.Histogram.GetSampleSum()
		case m.Untyped != nil:
			value += m.Untyped.GetValue()
		}
	}
	return value, sum
}

func matching(t testing.TB, g prometheus.Gatherer, name string, labels []string) []*dto.Metric {
	t.Helper()
	if len(labels)%2 != 0 {
		t.Fatalf("metricstest: labels %q are not name, value pairs", labels)
	}
	fams, err := g.Gather()
	if err != nil {
		t.Fatalf("metricstest: gather: %v", err)
	}
	var out []*dto.Metric
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			for i := 0; i < len(labels); i += 2 {
				found := false
				for _, l := range m.GetLabel() {
					if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
						found = true
						break
					}
				}
				if !found {
					continue series
				}
			}
			out = append(out, m)
		}
	}
	return out
}

// Wait waits up to within until the sample of name with labels (as
// Value) is want, failing the test with the last value if it never is.
func Wait(t testing.TB, g prometheus.Gatherer, within time.Duration, want float64, name string, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := Value(t, g, name, labels...)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%q is %v after %s; want %v", name, labels, got, within, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
