package devstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"jetflow.dev/services/agent/agent"
	"jetflow.dev/services/dispatcher/dispatch"
)

// The stack's metrics: every service of every namespace registers on one
// registry, served on one /metrics, as a deployment's Prometheus would
// see the four programs' endpoints together. The services' own metric
// names do not collide (each has its prefix); the dispatcher's, agent's
// and janitor's carry their namespace as a label, as their programs do,
// and the consumers' lag carries its service.

// serveMetrics is where the services register their metrics: with
// cfg.MetricsAddr a registry of the stack's own, with the process's
// collectors, served there until stop (url says where, for the caller
// to log once it goes on: a stack refused after it is not announced); else
// cfg.Registerer, nil when unset (no metrics).
func serveMetrics(cfg Config) (reg prometheus.Registerer, url string, stop func(), err error) {
	if cfg.MetricsAddr == "" {
		return cfg.Registerer, "", func() {}, nil
	}
	if cfg.Registerer != nil {
		return nil, "", nil, errors.New("devstack: MetricsAddr and Registerer are both set: the stack serves its own registry, or the program serves the one it gives")
	}
	r := prometheus.NewRegistry()
	if err := registerRuntime(r); err != nil {
		return nil, "", nil, err
	}
	ln, err := net.Listen("tcp", cfg.MetricsAddr)
	if err != nil {
		return nil, "", nil, fmt.Errorf("metrics address: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r, promhttp.HandlerOpts{Registry: r}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			cfg.Log.Error().Err(err).Msg("metrics server")
		}
	}()
	url = "http://" + ln.Addr().String() + "/metrics" // logged once the data directory is this stack's
	return r, url, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
		<-served
	}, nil
}

// registerRuntime registers the Go runtime's and the process's
// collectors, as each service program's registry has them.
func registerRuntime(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("devstack: register metrics: %w", err)
		}
	}
	return nil
}

// serviceMetrics are the metrics of one namespace's dispatcher, agent and
// janitor (all nil without a registry).
type serviceMetrics struct {
	dispatcher *dispatch.Metrics
	agent      *agent.Metrics
	janitor    prometheus.Registerer
}

// newServiceMetrics registers namespace ns's services' metrics on reg
// (nil: none), with the namespace label their programs give them.
func newServiceMetrics(reg prometheus.Registerer, ns string) (serviceMetrics, error) {
	if reg == nil {
		return serviceMetrics{}, nil
	}
	r := prometheus.WrapRegistererWith(prometheus.Labels{"namespace": ns}, reg)
	d, err := dispatch.NewMetrics(r)
	if err != nil {
		return serviceMetrics{}, err
	}
	a, err := agent.NewMetrics(r)
	if err != nil {
		return serviceMetrics{}, err
	}
	return serviceMetrics{dispatcher: d, agent: a, janitor: r}, nil
}
