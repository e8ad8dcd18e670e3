package svcrun

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/services/internal/metrics"
)

// Health is a service's small admin listener (-health-addr): liveness on
// /healthz, readiness on /readyz, for probes (docs/operations.md#health).
//
//   - /healthz is 200 while the process serves HTTP: restarting it cures
//     nothing NATS-side, so NATS being away does not make it fail.
//   - /readyz is 200 when every namespace the service serves is ready: its
//     NATS connection is up, none of the streams and buckets it uses is
//     missing, and the service says it is ready (its consumers are bound,
//     and what it must read first is read: see each service's Ready).
//     Otherwise 503, naming each namespace's reason.
type Health struct {
	mu     sync.Mutex
	served []string
	nss    map[string]*nsHealth
}

// nsHealth is what one namespace's readiness is made of.
type nsHealth struct {
	nc    *nats.Conn
	topo  *bus.Topology
	ready func() error // the service's own; nil until it gives one
}

// HealthState is /readyz's (and /healthz's) answer.
type HealthState struct {
	Status string `json:"status"` // ok or unavailable
	// Version is this build's (svc.Version): which processes still run
	// the old one during an upgrade.
	Version string `json:"version,omitempty"`
	// Namespaces says, by namespace, why one is not ready ("" when ready).
	Namespaces map[string]string `json:"namespaces,omitempty"`
}

func newHealth(served []string) *Health {
	return &Health{served: served, nss: map[string]*nsHealth{}}
}

// add records namespace name's connection once it is open.
func (h *Health) add(name string, nc *nats.Conn, topo *bus.Topology) *nsHealth {
	if h == nil {
		return nil
	}
	n := &nsHealth{nc: nc, topo: topo}
	h.mu.Lock()
	h.nss[name] = n
	h.mu.Unlock()
	return n
}

// setReady gives namespace n the service's own readiness check.
func (h *Health) setReady(n *nsHealth, ready func() error) {
	if h == nil || n == nil {
		return
	}
	h.mu.Lock()
	n.ready = ready
	h.mu.Unlock()
}

// State is the service's readiness now.
func (h *Health) State() HealthState {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := HealthState{Status: "ok", Version: svc.Version(), Namespaces: map[string]string{}}
	for _, name := range h.served {
		why := h.nss[name].notReady()
		st.Namespaces[name] = why
		if why != "" {
			st.Status = "unavailable"
		}
	}
	return st
}

// notReady says why the namespace is not ready ("" if it is).
func (n *nsHealth) notReady() string {
	switch {
	case n == nil:
		return "connecting to NATS"
	case n.nc.Status() != nats.CONNECTED:
		return "not connected to NATS (" + n.nc.Status().String() + ")"
	}
	if missing := n.topo.Missing(); len(missing) > 0 {
		return "missing: " + strings.Join(missing, ", ") + " (jetflow bootstrap creates them again)"
	}
	if n.ready == nil {
		return "starting"
	}
	if err := n.ready(); err != nil {
		return err.Error()
	}
	return ""
}

// Handler serves /healthz and /readyz.
func (h *Health) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeHealth(w, http.StatusOK, HealthState{Status: "ok", Version: svc.Version()})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		st := h.State()
		code := http.StatusOK
		if st.Status != "ok" {
			code = http.StatusServiceUnavailable
		}
		writeHealth(w, code, st)
	})
	return mux
}

func writeHealth(w http.ResponseWriter, code int, st HealthState) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(st)
}

// serveHealth listens on addr (setting names the flag, for the error) and
// serves h until stop is called.
func serveHealth(setting, addr string, h *Health, log zerolog.Logger, listening func(string)) (stop func(), err error) {
	bound, stop, err := metrics.Listen(setting, addr, h.Handler(), "health", log)
	if err != nil {
		return nil, err
	}
	if listening != nil {
		listening(bound)
	}
	return stop, nil
}
