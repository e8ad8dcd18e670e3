package natsserver

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSyncSettings: the fsync settings reach the server's JetStream, and
// without them it keeps nats-server's default (fsync every 2 min).
func TestSyncSettings(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		cfg      Config
		always   bool
		interval time.Duration
	}{
		{"default", Config{}, false, 2 * time.Minute},
		{"always", Config{SyncAlways: true}, true, 2 * time.Minute},
		{"interval", Config{SyncInterval: 100 * time.Millisecond}, false, 100 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg := c.cfg
			cfg.StoreDir, cfg.Port = t.TempDir(), -1
			s, err := Start(cfg)
			require.NoError(t, err)
			defer Stop(s)
			js := s.JetStreamConfig()
			require.NotNil(t, js)
			require.Equal(t, c.always, js.SyncAlways)
			require.Equal(t, c.interval, js.SyncInterval)
		})
	}
}
