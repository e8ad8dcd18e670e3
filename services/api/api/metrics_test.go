package api

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/services/api/projector"
)

// TestMetricsSayWhatReadyzSays: the parked read models per namespace and
// each missing stream or bucket, at every scrape.
func TestMetricsSayWhatReadyzSays(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	var missing atomic.Value
	missing.Store([]string(nil))
	srv, err := New(t.Context(), Config{Auth: AuthConfig{Disabled: true},
		Missing: func() []string { return missing.Load().([]string) }}, js.Conn(), js, zerolog.Nop())
	require.NoError(t, err)
	proj, err := projector.New(t.Context(), js, zerolog.Nop())
	require.NoError(t, err)
	srv.projectors[DefaultNamespace] = proj
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(collector{srv}))

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP jetflow_projections_parked Executions whose read model the api's projector could not write and retries on its own.
# TYPE jetflow_projections_parked gauge
jetflow_projections_parked{namespace="default"} 0
`), "jetflow_projections_parked", "jetflow_topology_missing"))

	missing.Store([]string{"bucket jf-locks", "stream JF_REJECTIONS"})
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP jetflow_topology_missing 1 for each stream or bucket the api found missing at its last look (jetflow bootstrap makes it again).
# TYPE jetflow_topology_missing gauge
jetflow_topology_missing{name="bucket jf-locks"} 1
jetflow_topology_missing{name="stream JF_REJECTIONS"} 1
`), "jetflow_topology_missing"))
}

// TestMetricsSayWhatTheProjectorDid: the events projected, the read
// models written, and each write's lag behind its latest event.
func TestMetricsSayWhatTheProjectorDid(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	srv, err := New(ctx, Config{Auth: AuthConfig{Disabled: true}}, js.Conn(), js, zerolog.Nop())
	require.NoError(t, err)
	proj, err := projector.New(ctx, js, zerolog.Nop())
	require.NoError(t, err)
	srv.projectors[DefaultNamespace] = proj
	srv.observe(DefaultNamespace, proj)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(collector{srv}))

	var last uint64
	at := time.Now().Add(-time.Minute) // recorded a minute ago: the lag is at least that
	for i, p := range []events.Payload{
		&events.ExecutionStarted{Workflow: "wf", Version: 1, Input: json.RawMessage(`{}`), Steps: []events.StepRef{{ID: "s", Kind: "noop"}}, Token: "t"},
		&events.ExecutionCancelled{},
	} {
		ev := events.New("test", "m1", "wf", at.Add(time.Duration(i)*time.Millisecond), p)
		ev.PrevSeq = last
		last, err = history.Append(ctx, js, bus.ExecutionSubject("wf", "m1"), last, ev)
		require.NoError(t, err)
	}
	natstest.Serve(t, proj.Run)
	natstest.Eventually(t, 30*time.Second, func() bool { return proj.Stats().Events == 2 }, "both events projected")

	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf
	}
	require.Contains(t, got, "jetflow_projector_events_total")
	require.EqualValues(t, 2, got["jetflow_projector_events_total"].GetMetric()[0].GetCounter().GetValue())
	writes := got["jetflow_projector_writes_total"].GetMetric()[0].GetCounter().GetValue()
	require.GreaterOrEqual(t, writes, 1.0, "the read model written")
	require.LessOrEqual(t, writes, 2.0)
	h := got["jetflow_projector_lag_seconds"].GetMetric()[0]
	require.Equal(t, "default", h.GetLabel()[0].GetValue())
	require.EqualValues(t, writes, h.GetHistogram().GetSampleCount(), "one lag a write")
	require.GreaterOrEqual(t, h.GetHistogram().GetSampleSum(), 60*writes-1, "each a minute or more behind")
	require.Contains(t, got, "jetflow_projector_gathering")
	require.Zero(t, got["jetflow_projector_gathering"].GetMetric()[0].GetGauge().GetValue(), "two events: nothing to gather")
}

// TestServeRegistersTheProjectorsMetrics: Serve, given a Registerer, has
// its projectors report to it: once an execution's events are projected,
// the registry gathers their events, writes and lag.
func TestServeRegistersTheProjectorsMetrics(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	natstest.Serve(t, func(ctx context.Context) error {
		return Serve(ctx, Config{Auth: AuthConfig{Disabled: true}, Listener: ln, Registerer: reg}, nc, js, zerolog.Nop())
	})
	var last uint64
	for _, p := range []events.Payload{
		&events.ExecutionStarted{Workflow: "wf", Version: 1, Input: json.RawMessage(`{}`), Steps: []events.StepRef{{ID: "s", Kind: "noop"}}, Token: "t"},
		&events.ExecutionCancelled{},
	} {
		ev := events.New("test", "m2", "wf", time.Now(), p)
		ev.PrevSeq = last
		last, err = history.Append(ctx, js, bus.ExecutionSubject("wf", "m2"), last, ev)
		require.NoError(t, err)
	}
	names := func() map[string]bool {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		got := map[string]bool{}
		for _, mf := range mfs {
			got[mf.GetName()] = true
		}
		return got
	}
	natstest.Eventually(t, 30*time.Second, func() bool { return names()["jetflow_projector_lag_seconds"] },
		"the projector's lag gathered")
	got := names()
	require.True(t, got["jetflow_projector_events_total"])
	require.True(t, got["jetflow_projector_writes_total"])
	require.True(t, got["jetflow_projector_gathering"])
	require.True(t, got["jetflow_projections_parked"])
}
