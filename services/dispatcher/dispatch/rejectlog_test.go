package dispatch_test

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/services/dispatcher/dispatch"
)

// lockedBuffer is a log sink the dispatcher's goroutines share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRejectionIsLoggedOnce: a rejected command is one warning in the
// dispatcher's log, not a warning and then an error for the same message.
func TestRejectionIsLoggedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs lockedBuffer
	d, err := dispatch.New(t.Context(), dispatch.Config{}, b.js, zerolog.New(&logs))
	require.NoError(t, err)
	natstest.Serve(t, d.Run)

	// An unknown workflow (rejected by the handler) and a plain message
	// (rejected as it arrives).
	ev := events.New("test-client", "", "", time.Now(), &events.StartExecution{Workflow: "nope", ExecutionID: "r-1"})
	msg, err := bus.Encode(bus.SubjectStart, ev)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), &nats.Msg{Subject: bus.SubjectStart, Data: []byte(`{"workflow":"nope"}`)})
	require.NoError(t, err)

	require.Eventually(t, func() bool { return strings.Count(logs.String(), "command rejected") == 2 },
		20*time.Second, 10*time.Millisecond, "%s", logs.String())
	// Both messages are terminated, and nothing more is said about them.
	waitConsumerCaughtUp(t, b.js, bus.StreamCommands)
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		require.NotContains(t, line, `"level":"error"`, "a rejection is not an error of the dispatcher: %s", line)
		require.NotContains(t, line, "drop message", line)
	}
}
