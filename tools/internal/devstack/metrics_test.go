package devstack

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
)

// scrape reads the stack's /metrics.
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	return string(b)
}

// TestMetricsOfEveryService: with MetricsAddr the stack serves one
// /metrics with every service's metrics: an execution run through it is
// counted by the dispatcher (started, ended, its sleep's timer), the
// agent (its operation) and the api's projector, beside the janitor's,
// both services' consumers and the process's.
func TestMetricsOfEveryService(t *testing.T) {
	t.Parallel()
	info, cancel, done := runWith(t, Config{DataDir: t.TempDir(), NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
		Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)})
	defer func() { cancel(); require.NoError(t, <-done) }()
	require.True(t, strings.HasPrefix(info.MetricsURL, "http://127.0.0.1:") && strings.HasSuffix(info.MetricsURL, "/metrics"), info.MetricsURL)

	ctx := t.Context()
	c := info.Client()
	_, err := c.ApplyWorkflow(ctx, []byte("name: measured\nsteps:\n  - {id: a, kind: noop}\n  - {id: nap, kind: sleep, duration: 10ms}\n"))
	require.NoError(t, err)
	st, err := c.Start(ctx, client.StartRequest{Workflow: "measured"})
	require.NoError(t, err)
	natstest.Eventually(t, 30*time.Second, func() bool {
		x, err := c.Execution(ctx, st.ID)
		return err == nil && x.Status == projections.StatusSucceeded
	}, "the execution succeeded")

	want := []string{
		`jetflow_dispatcher_executions_started_total{namespace="default"} 1`,
		`jetflow_dispatcher_executions_ended_total{namespace="default",status="succeeded"} 1`,
		`jetflow_dispatcher_steps_total{kind="sleep",namespace="default",outcome="succeeded"} 1`,
		`jetflow_dispatcher_timer_lateness_seconds_count{namespace="default",purpose="sleep"} 1`,
		`jetflow_agent_operations_total{kind="noop",namespace="default",outcome="succeeded"} 1`,
		`jetflow_agent_tasks_in_flight{namespace="default",queue="default"} 0`,
		`jetflow_consumer_pending_messages{consumer="agent-default",namespace="default",service="agent",stream="JF_TASKS"} 0`,
		`jetflow_consumer_pending_messages{consumer="dispatcher-commands",namespace="default",service="dispatcher",stream="JF_COMMANDS"} 0`,
		`jetflow_janitor_finished_executions{namespace="default"} `,
		`jetflow_janitor_sweeps_total{namespace="default",outcome="failed"} `,
		`jetflow_projector_events_total{namespace="default"} `,
		`jetflow_projections_parked{namespace="default"} 0`,
		"go_goroutines ",
		"process_resident_memory_bytes ",
	}
	var body string
	var missing []string
	natstest.Eventually(t, 30*time.Second, func() bool {
		body, missing = scrape(t, info.MetricsURL), missing[:0]
		for _, w := range want {
			if !strings.Contains(body, w) {
				missing = append(missing, w)
			}
		}
		return len(missing) == 0
	}, "every service's metrics served (missing: %q)", &missing)
	require.NotContains(t, body, `jetflow_projector_events_total{namespace="default"} 0`+"\n", "the projector's events counted")
}

// TestMetricsAddressRefused: a metrics address another program listens
// on stops the stack before it makes anything, naming it; so does
// giving both MetricsAddr and Registerer.
func TestMetricsAddressRefused(t *testing.T) {
	t.Parallel()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	dir := t.TempDir() + "/data"
	err = Run(ctx, Config{DataDir: dir, NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: busy.Addr().String(), Log: zerolog.Nop()}, nil)
	require.ErrorContains(t, err, "metrics address")
	require.ErrorContains(t, err, "address already in use")
	require.NoDirExists(t, dir, "nothing made before the address was found busy")

	err = Run(ctx, Config{DataDir: dir, NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
		Registerer: prometheus.NewRegistry(), Log: zerolog.Nop()}, nil)
	require.ErrorContains(t, err, "MetricsAddr and Registerer are both set")
}

// dashboard is the Grafana dashboard of deployments/grafana.
const dashboard = "../../../deployments/grafana/jetflow.json"

// recorder is a registerer that notes the name of every metric
// registered through it (by way of the namespace wrappers too).
type recorder struct {
	prometheus.Registerer
	mu    sync.Mutex
	names map[string]bool
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *recorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.mu.Lock()
			r.names[m[1]] = true
			r.mu.Unlock()
		}
	}
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *recorder) has(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.names[name]
}

// TestDashboardQueriesRegisteredMetrics: every metric the Grafana
// dashboard queries (in its panels and its variables) is one that the
// services of a stack, or the process, register, so that a metric renamed
// or removed cannot leave a panel empty; and every panel queries
// through the dashboard's data source variable.
func TestDashboardQueriesRegisteredMetrics(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(dashboard)
	require.NoError(t, err)
	var d struct {
		Title  string
		Panels []struct {
			ID         int
			Type       string
			Title      string
			Datasource struct{ UID string }
			Targets    []struct{ Expr string }
		}
		Templating struct {
			List []struct {
				Name  string
				Query json.RawMessage
			}
		}
	}
	require.NoError(t, json.Unmarshal(raw, &d))

	rec := &recorder{Registerer: prometheus.NewRegistry(), names: map[string]bool{}}
	require.NoError(t, registerRuntime(rec)) // as MetricsAddr serves them
	_, cancel, done := runWith(t, Config{DataDir: t.TempDir(), NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Registerer: rec,
		Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)})
	defer func() { cancel(); require.NoError(t, <-done) }()
	var exprs []string
	ids := map[int]bool{}
	for _, p := range d.Panels {
		require.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		require.Equal(t, "${datasource}", p.Datasource.UID, "panel %q", p.Title)
		require.NotEmpty(t, p.Targets, "panel %q queries nothing", p.Title)
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		var q struct{ Query string }
		if json.Unmarshal(v.Query, &q) == nil && q.Query != "" {
			exprs = append(exprs, q.Query)
		}
	}
	metric := regexp.MustCompile(`\b(?:jetflow|go|process)_[a-z0-9_]+\b`)
	queried := map[string]bool{}
	for _, e := range exprs {
		for _, name := range metric.FindAllString(e, -1) {
			queried[name] = true
		}
	}
	var unknown []string
	services := map[string]bool{}
	check := func() {
		unknown, services = nil, map[string]bool{}
		for name := range queried {
			base := name
			if !rec.has(base) { // a histogram's series
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					if strings.HasSuffix(name, s) && rec.has(strings.TrimSuffix(name, s)) {
						base = strings.TrimSuffix(name, s)
					}
				}
			}
			if !rec.has(base) {
				unknown = append(unknown, name)
				continue
			}
			for _, svc := range []string{"dispatcher", "agent", "janitor", "projector", "consumer"} {
				if strings.HasPrefix(base, "jetflow_"+svc+"_") {
					services[svc] = true
				}
			}
		}
		slices.Sort(unknown)
	}
	// The services register their metrics as each part of them starts
	// (the api's visibility index after the projector's, say): on a busy
	// machine, seconds apart.
	deadline := time.Now().Add(60 * time.Second)
	for check(); len(unknown) > 0 && time.Now().Before(deadline); check() {
		time.Sleep(100 * time.Millisecond)
	}
	require.Empty(t, unknown, "the dashboard queries metrics no service registers")
	require.Len(t, services, 5, "the dashboard shows every service's metrics: %v", services)
	require.GreaterOrEqual(t, len(queried), 30, "the dashboard's queries name %d metrics", len(queried))
}
