package svc_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/svc"
)

func TestRangeCheck(t *testing.T) {
	t.Parallel()
	ackWait := svc.Range[time.Duration]{Min: 300 * time.Millisecond, Max: time.Hour}
	for name, tc := range map[string]struct {
		v    time.Duration
		want string // "" for no error
	}{
		"Min":      {v: 300 * time.Millisecond},
		"Max":      {v: time.Hour},
		"Inside":   {v: 30 * time.Second},
		"Negative": {v: -time.Second, want: "agent: AckWait -1s: out of range, use 300ms to 1h"},
		"Zero":     {v: 0, want: "agent: AckWait 0s: out of range, use 300ms to 1h"},
		"BelowMin": {v: 299 * time.Millisecond, want: "agent: AckWait 299ms: out of range, use 300ms to 1h"},
		"AboveMax": {v: 90 * time.Minute, want: "agent: AckWait 1h30m: out of range, use 300ms to 1h"},
	} {
		err := ackWait.Check("agent: AckWait", tc.v)
		if tc.want == "" {
			require.NoError(t, err, name)
			continue
		}
		require.EqualError(t, err, tc.want, name)
		var re *svc.RangeError
		require.True(t, errors.As(err, &re), name)
		require.Equal(t, "300ms to 1h", re.Range, name)
	}

	sizes := svc.Range[int64]{Min: 1 << 10, Max: 64 << 20}
	require.NoError(t, sizes.Check("MaxBody", 1<<20))
	require.EqualError(t, sizes.Check("MaxBody", -1), "MaxBody -1: out of range, use 1024 to 67108864")
}

// TestNeverIfZero: a flag's 0 (never: jetflow-api's and jetflow-bench's
// -projector-coalesce, jetflow-janitor's -catch-up-every) is negative
// in a Config, whose 0 is the default; any other value is taken as it
// is.
func TestNeverIfZero(t *testing.T) {
	t.Parallel()
	for flag, want := range map[time.Duration]time.Duration{0: -1, time.Millisecond: time.Millisecond, 200 * time.Millisecond: 200 * time.Millisecond,
		time.Second: time.Second, 5 * time.Second: 5 * time.Second} {
		require.Equal(t, want, svc.NeverIfZero(flag), "%s", flag)
	}
}
