package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/tools/internal/backup"
	"jetflow.dev/tools/internal/devstack"
)

// TestRestoreRefusesBeforeConnecting: a directory that is no backup, or a
// backup this jetflow cannot read, is refused with its reason before any
// server is asked (none listens at the address given), with the same exit
// status from jetflow admin restore and jetflow dev --restore, which
// starts nothing (its data directory is not even made).
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
			code, stdout, stderr := jetflow(t, "", "admin", "restore", c.dir, "--nats", "nats://127.0.0.1:1")
			require.Equal(t, c.code, code, stderr)
			require.Contains(t, stderr, c.says)
			require.Contains(t, stderr, "nothing was changed")
			require.Empty(t, stdout)

			data := filepath.Join(t.TempDir(), "data")
			code, stdout, stderr = jetflow(t, "", "dev", "--data", data, "--restore", c.dir,
				"--nats-addr", "127.0.0.1:0", "--http", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0")
			require.Equal(t, c.code, code, "jetflow dev --restore: %s", stderr)
			require.Contains(t, stderr, c.says)
			require.Contains(t, stderr, "nothing was changed")
			require.Empty(t, stdout)
			_, err := os.Stat(data)
			require.ErrorIs(t, err, os.ErrNotExist, "jetflow dev started before refusing")
		})
	}
}

// TestRestoreRefusalComesFirst: a restore refused because of what the
// server holds says so and nothing else (no header, no progress), with
// the same exit status from jetflow admin restore (dispatchers running)
// and jetflow dev --restore (histories in its data directory); so does a
// backup into a directory in use.
func TestRestoreRefusalComesFirst(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	info, stop := stackIn(t, dir)
	natsFlags := []string{"--nats", info.NATSURL, "--creds", info.Creds(auth.RoleAdmin)}
	b := filepath.Join(t.TempDir(), "b")
	code, _, stderr := jetflow(t, "", append([]string{"admin", "backup", b}, natsFlags...)...)
	require.Equal(t, ExitOK, code, stderr)

	code, stdout, stderr := jetflow(t, "", append([]string{"admin", "backup", b}, natsFlags...)...)
	require.Equal(t, ExitUsage, code, stderr)
	require.Empty(t, stdout, "printed before the refusal")
	require.Contains(t, stderr, "is not empty")

	code, stdout, stderr = jetflow(t, "", append([]string{"admin", "restore", b}, natsFlags...)...)
	require.Equal(t, ExitConflict, code, stderr)
	require.Empty(t, stdout, "printed before the refusal")
	require.Contains(t, stderr, "jetflow services are running against this server")
	require.Contains(t, stderr, "nothing was changed")

	stop()
	code, stdout, stderr = jetflow(t, "", "dev", "--data", dir, "--restore", b, "--nats-addr", "127.0.0.1:0", "--http", "127.0.0.1:0",
		"--metrics-addr", "127.0.0.1:0")
	require.Equal(t, ExitConflict, code, "jetflow dev --restore: %s", stderr)
	require.Empty(t, stdout, "jetflow dev said it runs")
	require.Contains(t, stderr, "the server already holds data in")
	require.Contains(t, stderr, "give a new --data directory")
	require.NotContains(t, stderr, "--replace", "jetflow dev has no --replace")
	require.Contains(t, stderr, "nothing was changed")
}

// TestAdminFindsDevWithoutFlags: beside a jetflow dev (its data directory
// in JETFLOW_DATA), jetflow admin backup, jetflow admin clear-notices and
// jetflow bootstrap find its NATS and its admin identity by itself; without them bootstrap is
// refused.
func TestAdminFindsDevWithoutFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	info, _ := stackIn(t, dir)
	c, err := devstack.ReadConn(dir)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, devstack.AuthDir, "default", "admin.creds"), c.AdminCreds)

	var out, errOut bytes.Buffer
	a := &app{getenv: func(k string) string { return map[string]string{"JETFLOW_DATA": dir}[k] }, stdout: &out, stderr: &errOut}
	cmd := a.backupCmd()
	cmd.SetArgs([]string{filepath.Join(t.TempDir(), "b")})
	cmd.SetContext(t.Context())
	require.NoError(t, cmd.Execute(), errOut.String())
	require.Contains(t, out.String(), "backing up "+c.NATS)
	require.Contains(t, out.String(), "backup done")

	// A three-hour sleep's notice is set back to its firing; a client may not.
	code, _, stderr := jetflow(t, info.APIURL, "workflow", "apply", "-f", writeFile(t, "name: nap\nsteps:\n  - {id: nap, kind: sleep, duration: 3h}\n"))
	require.Equal(t, ExitOK, code, stderr)
	code, _, stderr = jetflow(t, info.APIURL, "run", "nap", "--id", "nap-1")
	require.Equal(t, ExitOK, code, stderr)
	natstest.Eventually(t, 30*time.Second, func() bool {
		_, evs, _ := jetflow(t, info.APIURL, "events", "nap-1")
		return strings.Contains(evs, "step.waiting")
	}, "nap-1 does not sleep")
	code, stdout, stderr := jetflow(t, "", "admin", "clear-notices", "--nats", c.NATS, "--creds", c.ClientCreds)
	require.Equal(t, ExitDenied, code, stderr)
	require.Contains(t, stderr, "admin identity")
	require.Empty(t, stdout, "nothing printed as done")
	out.Reset()
	errOut.Reset()
	clear := a.clearNoticesCmd()
	clear.SetArgs(nil)
	clear.SetContext(t.Context())
	require.NoError(t, clear.Execute(), errOut.String())
	require.Contains(t, out.String(), c.NATS+": ", "it says which deployment it read")
	require.Contains(t, out.String(), "notices among them 1, set back to their firings 1", "the sleep's notice")
	require.Contains(t, out.String(), "no notice left")

	out.Reset()
	errOut.Reset()
	boot := a.bootstrapCmd()
	boot.SetArgs(nil)
	boot.SetContext(t.Context())
	require.NoError(t, boot.Execute(), errOut.String())
	require.Contains(t, out.String(), "topology ready on "+c.NATS)

	// Not beside it, with its NATS named and no creds: the server refuses.
	b := &app{getenv: func(string) string { return "" }, stdout: &out, stderr: &errOut}
	boot = b.bootstrapCmd()
	boot.SetArgs([]string{"--nats", c.NATS})
	boot.SetContext(t.Context())
	err = boot.Execute()
	require.Error(t, err)
	require.Contains(t, err.Error(), "Authorization Violation")
}

// TestExitCodeRule: the errors of every command map to the statuses of
// docs/cli.md ("Exit codes"), whichever command met them.
func TestExitCodeRule(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		err  error
		want int
	}{
		"NotABackup":       {fmt.Errorf("--restore: %w: x", backup.ErrNotBackup), ExitUsage},
		"RestoreRefused":   {fmt.Errorf("restore: %w: data in the way", backup.ErrRefused), ExitConflict},
		"InvalidWorkflow":  {fmt.Errorf("apply x.yaml: %w", &workflow.ValidationError{Problems: []workflow.FieldError{{Field: "steps", Message: "required"}}}), ExitUsage},
		"DataDirInUse":     {fmt.Errorf("run: %w", devstack.ErrDataDirInUse), ExitConflict},
		"NATSUnreachable":  {fmt.Errorf("connect to nats at nats://x: %w", nats.ErrNoServers), ExitUnreachable},
		"NotAdmin":         {fmt.Errorf("%w: permissions violation", ErrNotAdmin), ExitDenied},
		"OperationFailed":  {errors.New("restore: the restore stopped part-way"), ExitFailed},
		"UsageOfAnyLength": {usagef("--limit 0"), ExitUsage},
	} {
		require.Equal(t, c.want, exitCode(c.err), name)
	}

	// jetflow dev refuses a --apply path that is not there before it starts.
	data := filepath.Join(t.TempDir(), "data")
	code, stdout, stderr := jetflow(t, "", "dev", "--data", data, "--apply", filepath.Join(t.TempDir(), "none.yaml"),
		"--nats-addr", "127.0.0.1:0", "--http", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0")
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, "none.yaml")
	require.Empty(t, stdout)
	_, err := os.Stat(data)
	require.ErrorIs(t, err, os.ErrNotExist, "jetflow dev started before refusing")

	// ... and a --visibility-postgres that is no PostgreSQL URL.
	code, stdout, stderr = jetflow(t, "", "dev", "--data", data, "--visibility-postgres", "postgres://u:s3cr3t@h/db?pool_max_conns=many",
		"--nats-addr", "127.0.0.1:0", "--http", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0")
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, "--visibility-postgres (JETFLOW_VISIBILITY_POSTGRES): not a PostgreSQL URL (cannot parse pool_max_conns")
	require.NotContains(t, stderr, "s3cr3t")
	require.Empty(t, stdout)

	// ... and a PostgreSQL nobody answers at: before its banner says it
	// runs, and before it makes the data directory.
	code, stdout, stderr = jetflow(t, "", "dev", "--data", data, "--visibility-postgres", "postgres://u:s3cr3t@127.0.0.1:1/db?sslmode=disable",
		"--nats-addr", "127.0.0.1:0", "--http", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0")
	require.NotEqual(t, 0, code, stderr)
	require.Contains(t, stderr, "visibility: connect to PostgreSQL")
	require.NotContains(t, stderr, "s3cr3t")
	require.Empty(t, stdout)
	_, err = os.Stat(data)
	require.ErrorIs(t, err, os.ErrNotExist, "jetflow dev made its data directory before it found PostgreSQL unreachable")

	// ... and an address another program listens on, before it makes
	// the data directory, its keys or its store.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = busy.Close() })
	code, _, stderr = jetflow(t, "", "dev", "--data", data, "--nats-addr", "127.0.0.1:18999", "--http", "127.0.0.1:18999",
		"--metrics-addr", "127.0.0.1:0")
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, "--nats-addr and --http are both 127.0.0.1:18999")
	code, _, stderr = jetflow(t, "", "dev", "--data", data, "--nats-addr", "127.0.0.1:0", "--http", "127.0.0.1:18999",
		"--metrics-addr", "127.0.0.1:18999")
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, "--http and --metrics-addr are both 127.0.0.1:18999")
	// A port alone is no address: HOST:PORT.
	code, _, stderr = jetflow(t, "", "dev", "--data", data, "--nats-addr", "127.0.0.1:0", "--http", "24081", "--metrics-addr", "127.0.0.1:0")
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, `--http "24081": give HOST:PORT, e.g. 127.0.0.1:24081`)
	code, _, stderr = jetflow(t, "", "dev", "--data", data, "--nats-addr", "localhost", "--http", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0")
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, `--nats-addr "localhost": give HOST:PORT, e.g. 127.0.0.1:4223`)
	code, _, stderr = jetflow(t, "", "dev", "--data", data, "--nats-addr", "127.0.0.1:0", "--http", "127.0.0.1:0", "--metrics-addr", "localhost:")
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, `--metrics-addr "localhost:": give HOST:PORT, e.g. 127.0.0.1:9465`, "an empty port is no port (not any free one)")
	// Two flags given the same port alone: the form is what to fix first.
	code, _, stderr = jetflow(t, "", "dev", "--data", data, "--nats-addr", "127.0.0.1:0", "--http", "24081", "--metrics-addr", "24081")
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, `--http "24081": give HOST:PORT, e.g. 127.0.0.1:24081`)
	_, err = os.Stat(data)
	require.ErrorIs(t, err, os.ErrNotExist, "jetflow dev made its data directory before refusing")
	for _, flag := range []string{"--nats-addr", "--http", "--metrics-addr"} {
		args := []string{"dev", "--data", data, "--nats-addr", "127.0.0.1:0", "--http", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
			flag, busy.Addr().String()}
		code, stdout, stderr = jetflow(t, "", args...)
		require.Equal(t, ExitConflict, code, "%s: %s", flag, stderr)
		require.Contains(t, stderr, flag+" "+busy.Addr().String()+": the address is in use")
		if flag == "--metrics-addr" {
			require.Contains(t, stderr, `or --metrics-addr "" to serve none`)
		}
		require.Empty(t, stdout)
		_, err = os.Stat(data)
		require.ErrorIs(t, err, os.ErrNotExist, "%s: jetflow dev made its data directory before refusing", flag)
	}
}

// TestDevVisibilityPostgresFromTheEnvironment: jetflow dev takes
// JETFLOW_VISIBILITY_POSTGRES when --visibility-postgres is not given
// (refusing a bad one before it starts), and its --help never prints
// the variable's value, which may hold a password.
func TestDevVisibilityPostgresFromTheEnvironment(t *testing.T) {
	t.Parallel()
	env := map[string]string{"JETFLOW_VISIBILITY_POSTGRES": "postgres://u:s3cr3t@h/db?pool_max_conns=many"}
	var out, errOut bytes.Buffer
	a := &app{getenv: func(k string) string { return env[k] }, stdout: &out, stderr: &errOut}

	help := a.devCmd()
	help.SetArgs([]string{"--help"})
	help.SetOut(&out)
	help.SetContext(t.Context())
	require.NoError(t, help.Execute())
	require.Contains(t, out.String(), "--visibility-postgres")
	require.NotContains(t, out.String(), "s3cr3t")

	out.Reset()
	data := filepath.Join(t.TempDir(), "data")
	dev := a.devCmd()
	dev.SetArgs([]string{"--data", data, "--nats-addr", "127.0.0.1:0", "--http", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"})
	dev.SetContext(t.Context())
	err := dev.Execute()
	require.ErrorContains(t, err, "--visibility-postgres (JETFLOW_VISIBILITY_POSTGRES): not a PostgreSQL URL (cannot parse pool_max_conns)")
	require.NotContains(t, err.Error(), "s3cr3t")
	_, statErr := os.Stat(data)
	require.ErrorIs(t, statErr, os.ErrNotExist, "refused before the data directory was made")
}
