package api

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

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
