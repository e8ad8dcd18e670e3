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

// TestMissingStreamIsFoundAndCreatedAgain: a stream deleted under a
// running service is found within a look; a service without -creds
// creates it again, one with -creds (which may not) reports it until
// someone does.
func TestMissingStreamIsFoundAndCreatedAgain(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	log := zerolog.New(zerolog.NewTestWriter(t))

	require.NoError(t, js.DeleteStream(ctx, bus.StreamRejections))
	restricted := watchTopology(ctx, js, bus.Config{}, auth.RoleDispatcher, true, 50*time.Millisecond, log)
	defer restricted.Stop()
	require.Eventually(t, func() bool {
		m := restricted.Missing()
		return len(m) == 1 && m[0] == "stream "+bus.StreamRejections
	}, 10*time.Second, 20*time.Millisecond, "the dispatcher, which publishes rejections, finds the stream missing")
	_, err := js.Stream(ctx, bus.StreamRejections)
	require.Error(t, err, "an identity with -creds does not create it")

	open := watchTopology(ctx, js, bus.Config{}, auth.RoleDispatcher, false, 50*time.Millisecond, log)
	defer open.Stop()
	require.Eventually(t, func() bool {
		_, err := js.Stream(ctx, bus.StreamRejections)
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "a service without -creds creates it again")
	require.Eventually(t, func() bool { return len(restricted.Missing()) == 0 }, 10*time.Second, 20*time.Millisecond,
		"and the other finds it there again")
}
