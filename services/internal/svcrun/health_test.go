package svcrun_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natsserver"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/services/internal/svcrun"
	"jetflow.dev/services/internal/svcruntest"
)

// TestReadinessSaysWhy: /readyz is 503 naming why while the service has
// not said it is ready, while a stream it uses is missing and while its
// service says it is not; 200 otherwise. /healthz stays 200 throughout.
//
// Not parallel: Parse sets zerolog's global time format.
func TestReadinessSaysWhy(t *testing.T) {
	srv := natstest.RunJetStream(t)
	_, js := natstest.Connect(t, srv)
	env := map[string]string{"JETFLOW_NATS_URL": srv.ClientURL(), "JETFLOW_HEALTH_ADDR": "127.0.0.1:0", "JETFLOW_LOG_LEVEL": "error"}
	p := svcrun.New(auth.RoleDispatcher, func(k string) string { return env[k] }, &strings.Builder{})
	p.TopologyEvery = 50 * time.Millisecond
	addr := make(chan string, 1)
	p.HealthListening = func(a string) { addr <- a }
	require.NoError(t, p.Parse(nil))

	ctx, cancel := context.WithCancel(t.Context())
	var notReady atomic.Pointer[error]
	give := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- p.Serve(ctx, func(ctx context.Context, ns svcrun.Namespace) error {
			<-give
			ns.Ready(func() error {
				if err := notReady.Load(); err != nil {
					return *err
				}
				return nil
			})
			<-ctx.Done()
			return nil
		})
	}()
	defer func() { cancel(); require.NoError(t, <-done) }()

	var base string
	select {
	case a := <-addr:
		base = "http://" + a
	case err := <-done:
		t.Fatalf("Serve returned before listening: %v", err)
	}
	probe := func(path string) (int, svcrun.HealthState) {
		resp, err := http.Get(base + path)
		if err != nil {
			return 0, svcrun.HealthState{}
		}
		defer resp.Body.Close()
		var st svcrun.HealthState
		_ = json.NewDecoder(resp.Body).Decode(&st)
		return resp.StatusCode, st
	}
	readyWith := func(code int, why string) func() bool {
		return func() bool {
			c, st := probe("/readyz")
			return c == code && st.Namespaces[auth.DefaultNamespace] == why
		}
	}
	natstest.Eventually(t, 30*time.Second, readyWith(http.StatusServiceUnavailable, "starting"), "starting until the service says")
	code, _ := probe("/healthz")
	require.Equal(t, http.StatusOK, code)

	close(give)
	natstest.Eventually(t, 30*time.Second, readyWith(http.StatusOK, ""), "ready")

	why := error(&reason{"binding its consumers"})
	notReady.Store(&why)
	natstest.Eventually(t, 30*time.Second, readyWith(http.StatusServiceUnavailable, "binding its consumers"), "the service's reason")
	notReady.Store(nil)

	require.NoError(t, js.DeleteStream(t.Context(), bus.StreamRejections))
	natstest.Eventually(t, 30*time.Second, readyWith(http.StatusServiceUnavailable,
		"missing: stream "+bus.StreamRejections+" (jetflow bootstrap creates them again)"), "a missing stream")
	code, _ = probe("/healthz")
	require.Equal(t, http.StatusOK, code, "liveness does not depend on it")
	require.NoError(t, bus.Ensure(t.Context(), js, bus.Config{}))
	natstest.Eventually(t, 30*time.Second, readyWith(http.StatusOK, ""), "ready again")
}

type reason struct{ s string }

func (r *reason) Error() string { return r.s }

// TestLosingNATSIsLogged: a service says once that NATS went away (not
// only through the failures of what it tries meanwhile).
//
// Not parallel: Parse sets zerolog's global time format.
func TestLosingNATSIsLogged(t *testing.T) {
	srv := natstest.RunJetStream(t)
	natstest.Connect(t, srv) // the topology
	env := map[string]string{"JETFLOW_NATS_URL": srv.ClientURL()}
	log := &svcruntest.Log{}
	p := svcrun.New(auth.RoleJanitor, func(k string) string { return env[k] }, log)
	require.NoError(t, p.Parse(nil))
	ctx, cancel := context.WithCancel(t.Context())
	connected := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- p.Serve(ctx, func(ctx context.Context, _ svcrun.Namespace) error {
			close(connected)
			<-ctx.Done()
			return nil
		})
	}()
	defer func() { cancel(); require.NoError(t, <-done) }()
	select {
	case <-connected:
	case err := <-done:
		t.Fatalf("Serve returned: %v", err)
	}
	natsserver.Stop(srv)
	natstest.Eventually(t, 30*time.Second, func() bool {
		return log.Line("disconnected from nats, reconnecting") != nil
	}, "the loss of NATS is logged")
}
