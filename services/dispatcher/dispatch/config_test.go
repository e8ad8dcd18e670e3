package dispatch_test

import (
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/services/dispatcher/dispatch"
)

// TestConfigValidate: every count and duration is checked against its
// range (zero is the default), by Validate and by New, so that a program
// embedding the dispatcher gets an error naming the field instead of a
// panic in a ticker.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg  dispatch.Config
		want string // "" for valid
	}{
		"Defaults":              {},
		"Smallest":              {cfg: dispatch.Config{Workers: 1, CacheSize: 1, AckWait: 300 * time.Millisecond, MaxAckPending: 1, LeaseTTL: time.Second}},
		"NegativeWorkers":       {cfg: dispatch.Config{Workers: -1}, want: "dispatch: Workers -1: out of range, use 1 to 4096"},
		"HugeWorkers":           {cfg: dispatch.Config{Workers: 1 << 20}, want: "dispatch: Workers 1048576"},
		"NegativeCacheSize":     {cfg: dispatch.Config{CacheSize: -5}, want: "dispatch: CacheSize -5: out of range, use 1 to 1000000"},
		"NegativeAckWait":       {cfg: dispatch.Config{AckWait: -time.Second}, want: "dispatch: AckWait -1s: out of range, use 300ms to 1h"},
		"ShortAckWait":          {cfg: dispatch.Config{AckWait: 10 * time.Millisecond}, want: "dispatch: AckWait 10ms"},
		"HugeAckWait":           {cfg: dispatch.Config{AckWait: 1000 * time.Hour}, want: "dispatch: AckWait 1000h"},
		"NegativeMaxAckPending": {cfg: dispatch.Config{MaxAckPending: -1}, want: "dispatch: MaxAckPending -1: out of range, use 1 to 65536"},
		"ShortLeaseTTL":         {cfg: dispatch.Config{LeaseTTL: 500 * time.Millisecond}, want: "dispatch: LeaseTTL 500ms: out of range, use 1s to 1m"},
		"NegativeLeaseTTL":      {cfg: dispatch.Config{LeaseTTL: -time.Second}, want: "dispatch: LeaseTTL -1s"},
		"LongLeaseTTL":          {cfg: dispatch.Config{LeaseTTL: time.Hour}, want: "dispatch: LeaseTTL 1h"},
		"FractionalLeaseTTL":    {cfg: dispatch.Config{LeaseTTL: 1500 * time.Millisecond}, want: "dispatch: LeaseTTL 1.5s: use whole seconds"},
		"BadMember":             {cfg: dispatch.Config{Member: "a b"}, want: "-member, JETFLOW_DISPATCHER_MEMBER"},
		"APIURL":                {cfg: dispatch.Config{APIURL: "https://jetflow.example.com:8443/base"}},
		"LongAPIURL":            {cfg: dispatch.Config{APIURL: "http://h/" + strings.Repeat("a", 600)}, want: "APIURL (-api-url, JETFLOW_API_URL) is 609 bytes; at most 512"},
		"APIURLNotAURL":         {cfg: dispatch.Config{APIURL: "127.0.0.1:8080"}, want: "give an http or https URL with a host"},
	} {
		err := tc.cfg.Validate()
		if tc.want == "" {
			require.NoError(t, err, name)
			continue
		}
		require.ErrorContains(t, err, tc.want, name)
		_, err = dispatch.New(t.Context(), tc.cfg, nil, zerolog.Nop()) // refused before it touches JetStream
		require.ErrorContains(t, err, tc.want, "%s: New", name)
	}
}
