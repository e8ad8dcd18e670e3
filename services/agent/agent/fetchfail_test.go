package agent

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// TestFetchFailuresPause: a worker tries again 50 ms after a failed
// fetch, then after a pause that doubles up to a second, and from 50 ms
// again once a fetch succeeded.
func TestFetchFailuresPause(t *testing.T) {
	var f fetchFailures
	now := time.Unix(1000, 0)
	var got []time.Duration
	for range 8 {
		p, _ := f.failed(jetstream.ErrConsumerLeadershipChanged, now)
		got = append(got, p)
		now = now.Add(p)
	}
	ms := time.Millisecond
	require.Equal(t, []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second, time.Second}, got)
	require.Equal(t, 8, f.count)

	f.over(now)
	p, _ := f.failed(jetstream.ErrConsumerLeadershipChanged, now)
	require.Equal(t, 50*ms, p, "a new streak starts short")
}

// TestFetchFailuresQuiet: a consumer's leader moving is said at debug
// level for the streak's first five seconds, and a warning after; any
// other failure is a warning at once. The end of a streak is said when a
// warning was.
func TestFetchFailuresQuiet(t *testing.T) {
	moves := []error{
		jetstream.ErrConsumerLeadershipChanged,
		fmt.Errorf("fetch: %w", jetstream.ErrNoHeartbeat),
		nats.ErrNoResponders,
	}
	for _, err := range moves {
		var f fetchFailures
		now := time.Unix(1000, 0)
		_, quiet := f.failed(err, now)
		require.True(t, quiet, err)
		_, quiet = f.failed(err, now.Add(4900*time.Millisecond))
		require.True(t, quiet, err)
		lasted, said := f.over(now.Add(4950 * time.Millisecond))
		require.False(t, said, "a quiet streak ends quietly: %v", err)
		require.Equal(t, 4950*time.Millisecond, lasted)

		_, quiet = f.failed(err, now)
		require.True(t, quiet)
		_, quiet = f.failed(err, now.Add(5*time.Second))
		require.False(t, quiet, "a move that lasts is a warning: %v", err)
		lasted, said = f.over(now.Add(6 * time.Second))
		require.True(t, said)
		require.Equal(t, 6*time.Second, lasted)
	}

	for _, err := range []error{jetstream.ErrConsumerDeleted, errors.New("pull: 400 bad request"), nats.ErrConnectionClosed} {
		var f fetchFailures
		_, quiet := f.failed(err, time.Unix(1000, 0))
		require.False(t, quiet, err)
		_, said := f.over(time.Unix(1001, 0))
		require.True(t, said, err)
	}

	var f fetchFailures
	_, said := f.over(time.Unix(1000, 0))
	require.False(t, said, "no streak, nothing to say")

	// A warning, then a quiet failure: the streak's end is still said.
	_, quiet := f.failed(jetstream.ErrConsumerDeleted, time.Unix(1000, 0))
	require.False(t, quiet)
	_, quiet = f.failed(nats.ErrNoResponders, time.Unix(1001, 0))
	require.True(t, quiet)
	_, said = f.over(time.Unix(1002, 0))
	require.True(t, said, "a streak with a warning in it ends said")
}
