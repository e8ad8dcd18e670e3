package dispatch

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRetryDelayDoublesToItsBound: one policy, 100 ms doubling, never
// more than 10 s, also for absurd counts.
func TestRetryDelayDoublesToItsBound(t *testing.T) {
	t.Parallel()
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond}
	for i, w := range want {
		require.Equal(t, w, retryDelay(i+1), "try %d", i+1)
	}
	require.Equal(t, retryFirst, retryDelay(0))
	require.Equal(t, retryMax, retryDelay(8))
	require.Equal(t, retryMax, retryDelay(1<<30))
}
