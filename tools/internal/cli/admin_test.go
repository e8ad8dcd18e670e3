package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/tools/internal/backup"
)

// TestRestoreRefusesBeforeConnecting: a directory that is no backup, or a
// backup this jetflow cannot read, is refused with its reason before any
// server is asked (none listens at the address given).
func TestRestoreRefusesBeforeConnecting(t *testing.T) {
	t.Parallel()
	newer := t.TempDir()
	m := backup.Manifest{Format: backup.Format, FormatVersion: backup.FormatVersion, Jetflow: "v9", SchemaVersion: events.SchemaVersion + 1,
		Partitions: 8, Streams: []backup.Snapshot{{Stream: bus.StreamEvents, Dir: bus.StreamEvents}}}
	b, err := json.Marshal(m)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(newer, backup.ManifestFile), b, 0o600))
	cases := map[string]struct {
		dir  string
		code int
		says string
	}{
		"NotABackup":  {t.TempDir(), ExitUsage, "has no manifest.json"},
		"Missing":     {filepath.Join(t.TempDir(), "none"), ExitUsage, "not a jetflow backup"},
		"NewerSchema": {newer, ExitConflict, "written by jetflow v9"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := jetflow(t, "", "admin", "restore", c.dir, "--nats", "nats://127.0.0.1:1")
			require.Equal(t, c.code, code, stderr)
			require.Contains(t, stderr, c.says)
			require.Contains(t, stderr, "nothing was changed")
		})
	}
}
