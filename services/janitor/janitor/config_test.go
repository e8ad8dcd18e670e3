package janitor_test

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/services/janitor/janitor"
)

// TestConfigValidate: the durations are checked against their ranges
// (zero is the default), by Validate and by New, so that a program
// embedding the janitor gets an error naming the field instead of a
// panic in the sweep's ticker.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg  janitor.Config
		want string // "" for valid
	}{
		"Defaults":          {},
		"Smallest":          {cfg: janitor.Config{Interval: 10 * time.Millisecond, IdleAfter: 100 * time.Millisecond}},
		"Largest":           {cfg: janitor.Config{Interval: 24 * time.Hour, IdleAfter: 7 * 24 * time.Hour}},
		"NegativeInterval":  {cfg: janitor.Config{Interval: -time.Second}, want: "janitor: Interval -1s: out of range, use 10ms to 24h"},
		"HugeInterval":      {cfg: janitor.Config{Interval: 1000 * time.Hour}, want: "janitor: Interval 1000h"},
		"NegativeIdleAfter": {cfg: janitor.Config{IdleAfter: -time.Minute}, want: "janitor: IdleAfter -1m: out of range, use 100ms to 168h"},
		"ShortIdleAfter":    {cfg: janitor.Config{IdleAfter: time.Millisecond}, want: "janitor: IdleAfter 1ms"},
		"BadRetention":      {cfg: janitor.Config{RetentionDefault: "parent"}, want: `janitor: RetentionDefault (-retention-default, JETFLOW_RETENTION_DEFAULT) "parent"`},
		"NoCatchUp":         {cfg: janitor.Config{CatchUpEvery: -1}},
		"ShortCatchUp":      {cfg: janitor.Config{CatchUpEvery: time.Millisecond}, want: "janitor: CatchUpEvery (-catch-up-every, JETFLOW_JANITOR_CATCH_UP_EVERY) 1ms: out of range, use a negative value (never; 0 on the command line) or 100ms to 1h"},
		"LongCatchUp":       {cfg: janitor.Config{CatchUpEvery: 2 * time.Hour}, want: "janitor: CatchUpEvery (-catch-up-every, JETFLOW_JANITOR_CATCH_UP_EVERY) 2h"},
	} {
		err := tc.cfg.Validate()
		_, newErr := janitor.New(tc.cfg, nil, zerolog.Nop())
		if tc.want == "" {
			require.NoError(t, err, name)
			require.NoError(t, newErr, name)
			continue
		}
		require.ErrorContains(t, err, tc.want, name)
		require.ErrorContains(t, newErr, tc.want, "%s: New", name)
	}
}
