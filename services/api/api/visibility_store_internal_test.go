package api

import (
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/services/api/visibility/sqlitestore"
)

// TestVisibilityCacheReachesTheStore: the SQLite index an api opens for a
// namespace keeps the page cache its configuration gives (and the
// default without one), in a directory and in memory.
func TestVisibilityCacheReachesTheStore(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg  Config
		want int
	}{
		"Default":         {cfg: Config{VisibilityDir: t.TempDir()}, want: sqlitestore.DefaultCacheBytes},
		"Dir":             {cfg: Config{VisibilityDir: t.TempDir(), VisibilityCache: 8 << 20}, want: 8 << 20},
		"InMemory":        {cfg: Config{VisibilityCache: 2 << 20}, want: 2 << 20},
		"DefaultInMemory": {cfg: Config{}, want: sqlitestore.DefaultCacheBytes},
	} {
		store, _, err := openStore(t.Context(), tc.cfg, "default", zerolog.Nop())
		require.NoError(t, err, name)
		s, ok := store.(*sqlitestore.Store)
		require.True(t, ok, "%s: a SQLite index: %T", name, store)
		got, err := s.CacheBytes(t.Context())
		require.NoError(t, err, name)
		require.Equal(t, tc.want, got, name)
		require.NoError(t, s.Close(), name)
	}
}
