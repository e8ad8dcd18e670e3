package bus_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
)

// TestStopWatch: a watch stopped with its channel full (more keys than
// the channel holds, none read) is stopped at once, and nothing of it is
// left: its handler ends (StopWatch reads what it was blocked on), and so
// does nats.go's goroutine waiting for the watch's context (the
// unsubscribe ends it, though the caller's context goes on).
func TestStopWatch(t *testing.T) {
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "watched"})
	require.NoError(t, err)
	for i := range 400 { // the watcher's channel holds 256
		_, err := kv.Put(t.Context(), fmt.Sprintf("k%d", i), []byte("v"))
		require.NoError(t, err)
	}
	before := goleak.IgnoreCurrent()
	w, err := kv.WatchAll(t.Context())
	require.NoError(t, err)
	natstest.Eventually(t, 30*time.Second, func() bool { return len(w.Updates()) == cap(w.Updates()) }, "the channel fills")

	bus.StopWatch(w)
	goleak.VerifyNone(t, before)
}
