// Package metrics is the Prometheus endpoint a service program may serve:
// a registry with the runtime's collectors, and its /metrics listener
// (Listen serves any of a service's small admin listeners).
package metrics

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
	"github.com/rs/zerolog"
)

// Registry returns a registry holding the Go runtime's and the process's
// collectors, for a service's own metrics.
func Registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Serve serves reg on http://addr/metrics until stop is called, which
// returns once the listener is shut down. setting names where addr came
// from (a flag), for the error if it cannot listen. It logs "metrics
// listening" with the address.
func Serve(setting, addr string, reg *prometheus.Registry, log zerolog.Logger) (stop func(), err error) {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	_, stop, err = Listen(setting, addr, mux, "metrics", log)
	return stop, err
}

// Listen serves h on addr (a service's small admin listener: metrics,
// probes) until stop is called, which returns once it is shut down.
// setting names where addr came from (a flag), for the error if it
// cannot listen; it logs "<name> listening" with the address, which it
// returns (port 0 picks one).
func Listen(setting, addr string, h http.Handler, name string, log zerolog.Logger) (bound string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("%s %q: %w", setting, addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg(name + " server")
		}
	}()
	bound = ln.Addr().String()
	log.Info().Str("addr", bound).Msg(name + " listening")
	return bound, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
		<-served
	}, nil
}
