package bus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
)

// TestStopWatch: a watcher stopped with its channel full (more keys than
// the channel holds, none read) is stopped at once, and its handler still
// ends: no goroutine of the watch is left.
func TestStopWatch(t *testing.T) {
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "watched"})
	require.NoError(t, err)
	for i := range 400 { // the watcher's channel holds 256
		_, err := kv.Put(t.Context(), fmt.Sprintf("k%d", i), []byte("v"))
		require.NoError(t, err)
	}
	before := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(t.Context())
	w, err := kv.WatchAll(ctx)
	require.NoError(t, err)
	natstest.Eventually(t, 30*time.Second, func() bool { return len(w.Updates()) == cap(w.Updates()) }, "the channel fills")

	bus.StopWatch(w)
	cancel() // ends nats.go's goroutine that waits for the context
	goleak.VerifyNone(t, before)
}
