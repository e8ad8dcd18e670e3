package svc_test

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/svc"
)

// TestFlagsRanges: a ranged flag's value, from the command line or the
// environment, is checked by Parse, and an error names the flag, its
// variable, the value and the range.
func TestFlagsRanges(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
		want string // "" for no error
	}{
		"Defaults":            {},
		"InRange":             {args: []string{"-wait", "2s", "-count", "64", "-replicas", "3"}},
		"NegativeDurationArg": {args: []string{"-wait", "-1s"}, want: "-wait (JETFLOW_WAIT) -1s: out of range, use 300ms to 1h"},
		"ZeroDurationArg":     {args: []string{"-wait", "0"}, want: "-wait (JETFLOW_WAIT) 0s: out of range, use 300ms to 1h"},
		"HugeDurationEnv":     {env: map[string]string{"JETFLOW_WAIT": "48h"}, want: "-wait (JETFLOW_WAIT) 48h: out of range, use 300ms to 1h"},
		"NegativeCountEnv":    {env: map[string]string{"JETFLOW_COUNT": "-3"}, want: "-count (JETFLOW_COUNT) -3: out of range, use 1 to 1024"},
		"ZeroCountArg":        {args: []string{"-count=0"}, want: "-count (JETFLOW_COUNT) 0: out of range, use 1 to 1024"},
		"ArgBeatsBadEnv":      {args: []string{"-count", "8"}, env: map[string]string{"JETFLOW_COUNT": "0"}},
		"Replicas":            {args: []string{"-replicas", "7"}, want: "-replicas (JETFLOW_REPLICAS) 7: out of range, use 1 to 5"},
		"UnparsableEnv":       {env: map[string]string{"JETFLOW_WAIT": "soon"}, want: `JETFLOW_WAIT="soon": not a duration (e.g. 30s, 500ms); it sets -wait (-h says what each flag takes)`},
		"UnparsableIntEnv":    {env: map[string]string{"JETFLOW_COUNT": " 8"}, want: `JETFLOW_COUNT=" 8": not an integer; it sets -count (`},
		"ArgBeatsUnparsable":  {args: []string{"-wait", "2s"}, env: map[string]string{"JETFLOW_WAIT": "soon"}},
		"HugeIntegerEnv":      {env: map[string]string{"JETFLOW_COUNT": "99999999999999999999"}, want: `JETFLOW_COUNT="99999999999999999999": an integer too large`},
	} {
		f := svc.NewFlags("prog", func(k string) string { return tc.env[k] })
		f.SetOutput(io.Discard)
		f.AddCommon()
		wait := f.DurationIn("wait", "JETFLOW_WAIT", 30*time.Second, svc.Range[time.Duration]{Min: 300 * time.Millisecond, Max: time.Hour}, "a wait")
		count := f.IntIn("count", "JETFLOW_COUNT", 16, svc.Range[int]{Min: 1, Max: 1024}, "a count")
		err := f.Parse(tc.args)
		if tc.want == "" {
			require.NoError(t, err, name)
			require.Positive(t, *wait, name)
			require.Positive(t, *count, name)
			continue
		}
		require.ErrorContains(t, err, tc.want, name)
	}
}

// TestFlagsUsageShowsRange: -h tells the range with the variable.
func TestFlagsUsageShowsRange(t *testing.T) {
	t.Parallel()
	f := svc.NewFlags("prog", func(string) string { return "" })
	f.IntIn("count", "JETFLOW_COUNT", 16, svc.Range[int]{Min: 1, Max: 1024}, "a count")
	require.Equal(t, "a count (1 to 1024) (env JETFLOW_COUNT)", f.Lookup("count").Usage)
}

// TestBadFlagSaysWhatToGive: a flag given a value of the wrong kind says
// what kind to give, as a bad environment value does, not "parse error".
func TestBadFlagSaysWhatToGive(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-wait", "banana"}, `invalid value "banana" for flag -wait: not a duration (e.g. 30s, 500ms)`},
		{[]string{"-wait", "5"}, "not a duration"},
		{[]string{"-count", "x"}, `invalid value "x" for flag -count: not an integer`},
		{[]string{"-on=maybe"}, "not a boolean (true or false)"},
	} {
		f := svc.NewFlags("test", func(string) string { return "" })
		f.SetOutput(io.Discard)
		f.Duration("wait", "W", time.Second, "")
		f.Int("count", "C", 1, "")
		f.Bool("on", "O", false, "")
		err := f.Parse(tc.args)
		require.ErrorContains(t, err, tc.want, "%v", tc.args)
		require.ErrorContains(t, err, "-h lists the flags")
	}
}

// TestAnUnknownFlagSaysWhichItMeant: a flag that is not defined names
// the one it most likely meant: the flag its variable's name sets (the
// variable JETFLOW_NATS_URL sets -nats, so -nats-url meant -nats), else
// the flag it spells without dashes or with underscores, else the only
// flag it begins or ends; none when nothing stands out.
func TestAnUnknownFlagSaysWhichItMeant(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		arg, want string
	}{
		{"-nats-url=nats://127.0.0.1:4222", "flag provided but not defined: -nats-url: did you mean -nats?"},
		{"--nats-url", "did you mean -nats?"},
		{"-visibility-cache", "did you mean -visibility-cache-bytes?"},
		{"-cache-bytes", "did you mean -visibility-cache-bytes?"},
		{"-visibilitycachebytes=5", "did you mean -visibility-cache-bytes?"},
		{"-visibility_cache_bytes", "did you mean -visibility-cache-bytes?"},
		{"-LogLevel=debug", "did you mean -log-level?"},
		{"-logjson", "did you mean -log-json?"},
		{"-log", "flag provided but not defined: -log (-h lists the flags)"}, // -log-level and -log-json
		{"-banana", "flag provided but not defined: -banana (-h lists the flags)"},
	} {
		f := svc.NewFlags("test", func(string) string { return "" })
		f.SetOutput(io.Discard)
		f.AddCommon()
		f.Int("visibility-cache-bytes", "JETFLOW_VISIBILITY_CACHE_BYTES", 0, "")
		err := f.Parse([]string{tc.arg})
		require.ErrorContains(t, err, tc.want, tc.arg)
		require.ErrorContains(t, err, "-h lists the flags")
	}
}
