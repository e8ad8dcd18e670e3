package e2e

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/tools/internal/devstack"
)

type stack struct {
	info devstack.Info
	c    *client.Client
	nc   *nats.Conn
	js   jetstream.JetStream
	// stop stops the stack (also done when the test ends).
	stop func()
}

// startStack runs the whole system in-process on free loopback ports.
func startStack(t *testing.T, mod func(*devstack.Config)) *stack {
	t.Helper()
	cfg := devstack.Config{
		DataDir: t.TempDir(), NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Log:         zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
		TaskAckWait: 2 * time.Second, JanitorInterval: 500 * time.Millisecond, IdleAfter: 5 * time.Second,
		// Tests read their executions after they end; retention tests set their own.
		RetentionDefault: "forever",
	}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan devstack.Info, 1)
	done := make(chan error, 1)
	go func() { done <- devstack.Run(ctx, cfg, func(i devstack.Info) { ready <- i }) }()
	// Each replicated stream and bucket is a raft group over three
	// servers: on a loaded machine creating them can take each service a
	// few request timeouts (they retry until it is done).
	startIn := 30 * time.Second
	if cfg.Replicas > 1 {
		startIn = 90 * time.Second
	}
	var info devstack.Info
	select {
	case info = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("stack stopped: %v", err)
	case <-time.After(startIn):
		cancel()
		t.Fatalf("stack did not start within %s", startIn)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("stack did not stop")
			}
		})
	}
	t.Cleanup(stop)
	nc, err := info.Connect(auth.RoleAdmin, "e2e-test")
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	apiTokens.Store(strings.TrimPrefix(info.APIURL, "http://"), info.AdminToken)
	t.Cleanup(func() { apiTokens.Delete(strings.TrimPrefix(info.APIURL, "http://")) })
	s := &stack{info: info, c: info.Client(), nc: nc, js: js, stop: stop}
	require.Eventually(t, func() bool {
		resp, err := http.Get(info.APIURL + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	}, 10*time.Second, 20*time.Millisecond)
	return s
}

// apiTokens maps each running stack's api address to its admin token.
var apiTokens sync.Map

// tokenTransport adds the admin token of the stack a request is for, so
// that the tests which speak raw HTTP to an api pass its authentication
// (a request that sets its own Authorization keeps it).
type tokenTransport struct{}

func (tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if tok, ok := apiTokens.Load(r.URL.Host); ok && tok.(string) != "" && r.Header.Get("Authorization") == "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+tok.(string))
	}
	return http.DefaultTransport.RoundTrip(r)
}

// apiHTTP is the HTTP client of tests that call an api with raw requests.
var apiHTTP = &http.Client{Transport: tokenTransport{}}

func (s *stack) apply(t *testing.T, yaml string) client.Applied {
	t.Helper()
	a, err := s.c.ApplyWorkflow(context.Background(), []byte(yaml))
	require.NoError(t, err)
	return a
}

// waitStatus polls the api until the execution reaches a terminal state.
func (s *stack) waitDone(t *testing.T, id string, timeout time.Duration) projections.Execution {
	t.Helper()
	var x projections.Execution
	require.Eventually(t, func() bool {
		var err error
		x, err = s.c.Execution(context.Background(), id)
		return err == nil && x.Status.Terminal()
	}, timeout, 20*time.Millisecond, "execution %s did not finish; last state %+v", id, x)
	return x
}

// runToEnd starts an execution and waits (20 s at most) until it ends.
func (s *stack) runToEnd(t *testing.T, req client.StartRequest) projections.Execution {
	t.Helper()
	st, err := s.c.Start(context.Background(), req)
	require.NoError(t, err)
	return s.waitDone(t, st.ID, 20*time.Second)
}

// history reads an execution's events straight from the stream.
func (s *stack) history(t *testing.T, id string) []events.Event {
	t.Helper()
	var evs []events.Event
	var err error
	require.Eventually(t, func() bool { // retried: a cluster may be electing a leader
		evs, err = history.Read(context.Background(), s.js, events.ExecutionFilter(id), 0)
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "read history of %s: %v", id, err)
	return evs
}

// countTypes counts events by type (and step id for step events).
func countTypes(evs []events.Event) map[string]int {
	n := map[string]int{}
	for _, ev := range evs {
		key := string(ev.Type)
		switch p := ev.Data.(type) {
		case *events.StepSucceeded:
			key += "/" + p.StepID
		case *events.StepFailed:
			key += "/" + p.StepID
		case *events.StepScheduled:
			key += "/" + p.StepID
		}
		n[key]++
	}
	return n
}

// requireLinear checks that a history's sequences strictly increase and
// that it folds without error.
func requireLinear(t *testing.T, evs []events.Event) projections.Execution {
	t.Helper()
	for i := 1; i < len(evs); i++ {
		require.Greater(t, evs[i].Seq, evs[i-1].Seq, "history not linear at %d", i)
	}
	x, err := projections.Fold(evs)
	require.NoError(t, err)
	return x
}
