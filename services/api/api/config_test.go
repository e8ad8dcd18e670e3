package api_test

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/services/api/api"
)

// TestConfigValidate: the durations and sizes are checked against their
// ranges (zero is the default), by Validate and by New, so that a program
// embedding the api gets an error naming the field.
func TestConfigValidate(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg  api.Config
		want string // "" for valid
	}{
		"Defaults":          {},
		"Largest":           {cfg: api.Config{StartWait: time.Minute, MaxBody: 64 << 20, Auth: api.AuthConfig{CacheTTL: time.Minute}}},
		"NegativeStartWait": {cfg: api.Config{StartWait: -time.Second}, want: "api: StartWait -1s: out of range, use 1ms to 1m"},
		"HugeStartWait":     {cfg: api.Config{StartWait: time.Hour}, want: "api: StartWait 1h"},
		"NegativeMaxBody":   {cfg: api.Config{MaxBody: -1}, want: "api: MaxBody -1: out of range, use 1024 to 67108864"},
		"TinyMaxBody":       {cfg: api.Config{MaxBody: 10}, want: "api: MaxBody 10"},
		"NegativeCacheTTL":  {cfg: api.Config{Auth: api.AuthConfig{CacheTTL: -time.Second}}, want: "api: Auth.CacheTTL -1s: out of range, use 1ms to 1m"},
		"LongCacheTTL":      {cfg: api.Config{Auth: api.AuthConfig{CacheTTL: 2 * time.Minute}}, want: "api: Auth.CacheTTL 2m"},
		"AuthOffWithTokens": {cfg: api.Config{Auth: api.AuthConfig{Disabled: true, AdminTokenFile: "x"}}, want: "authentication is off"},
		"Addr":              {cfg: api.Config{Addr: "[::1]:0"}},
		"AddrWithoutPort":   {cfg: api.Config{Addr: "nonsense"}, want: `api: Addr "nonsense" (-http, JETFLOW_HTTP_ADDR): give host:port`},
		"TinyMaxReadModel":  {cfg: api.Config{MaxReadModel: 1000}, want: "api: MaxReadModel 1000: out of range, use 16384 to 67108864"},
		"VisibilityDirFile": {cfg: api.Config{VisibilityDir: "config_test.go"}, want: `api: VisibilityDir "config_test.go" (-visibility-dir, JETFLOW_VISIBILITY_DIR) is a file`},
		"VisibilityDirNew":  {cfg: api.Config{VisibilityDir: "no/such/dir/yet"}},
		"TinyVisibilityCache": {cfg: api.Config{VisibilityCache: 4096},
			want: "api: VisibilityCache (-visibility-cache-bytes, JETFLOW_VISIBILITY_CACHE_BYTES) 4096: out of range, use 1048576 to 68719476736"},
		"VisibilityBoth": {cfg: api.Config{VisibilityDir: "x", VisibilityPostgres: "postgres://db/jetflow"},
			want: "api: both VisibilityDir (-visibility-dir, JETFLOW_VISIBILITY_DIR) and VisibilityPostgres (-visibility-postgres, JETFLOW_VISIBILITY_POSTGRES) are set"},
		"VisibilityPostgresBad": {cfg: api.Config{VisibilityPostgres: "postgres://u:secret@[::1"},
			want: "api: VisibilityPostgres (-visibility-postgres, JETFLOW_VISIBILITY_POSTGRES): not a PostgreSQL URL"},
		"VisibilityPostgres": {cfg: api.Config{VisibilityPostgres: "postgres://jetflow@127.0.0.1:5432/jetflow?sslmode=disable"}},
	} {
		err := tc.cfg.Validate()
		if tc.want == "" {
			require.NoError(t, err, name)
			continue
		}
		require.ErrorContains(t, err, tc.want, name)
		_, err = api.New(t.Context(), tc.cfg, nil, nil, zerolog.Nop()) // refused before it touches NATS
		require.ErrorContains(t, err, tc.want, "%s: New", name)
	}
}
