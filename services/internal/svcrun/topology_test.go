package svcrun

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
)

// TestMissingStreamIsFound: a stream deleted under a running service is
// found within a look, reported until it is there again, and not created
// by the service (jetflow bootstrap does, with the deployment's settings).
func TestMissingStreamIsFound(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	log := zerolog.New(zerolog.NewTestWriter(t))

	require.NoError(t, js.DeleteStream(ctx, bus.StreamRejections))
	require.NoError(t, js.DeleteStream(ctx, bus.StreamAdvisories))
	topo := watchTopology(ctx, js, bus.Config{}, auth.RoleDispatcher, 50*time.Millisecond, log)
	defer topo.Stop()
	require.Eventually(t, func() bool {
		m := topo.Missing()
		return len(m) == 1 && m[0] == "stream "+bus.StreamRejections
	}, 10*time.Second, 20*time.Millisecond, "the dispatcher, which publishes rejections, finds that stream missing, and only the streams it uses")
	_, err := js.Stream(ctx, bus.StreamRejections)
	require.Error(t, err, "the service does not create it")

	require.NoError(t, bus.Ensure(ctx, js, bus.Config{})) // as jetflow bootstrap does
	require.Eventually(t, func() bool { return len(topo.Missing()) == 0 }, 10*time.Second, 20*time.Millisecond,
		"it finds it there again")
}
