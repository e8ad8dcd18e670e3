package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/tools/internal/cli"
	"jetflow.dev/tools/internal/devstack"
)

// TestBackupRestore: executions are backed up while the stack runs (some
// finished, one waiting for a signal, one sleeping), the stack is stopped
// and its data thrown away, and a new stack on a new data directory
// restores the backup before its services start. The finished executions
// read the same, byte for byte; the waiting one completes after a signal,
// the sleeping one when its timer fires; new starts work and the ids
// already used are still refused; api keys still work; the read models
// are re-projected.
func TestBackupRestore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := startStack(t, nil)
	a.apply(t, "name: bk-quick\nsteps:\n  - {id: a, kind: noop}\n  - {id: b, kind: log, message: done}\n")
	a.apply(t, "name: bk-wait\nsteps:\n  - {id: gate, kind: wait, signal: go, timeout: 1h}\n  - {id: after, kind: noop}\n")
	a.apply(t, "name: bk-sleep\nsteps:\n  - {id: nap, kind: sleep, duration: 6s}\n  - {id: after, kind: noop}\n")
	finished := []string{"q1", "q2", "q3"}
	for _, id := range finished {
		x := a.runToEnd(t, client.StartRequest{Workflow: "bk-quick", ID: id})
		require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))
	}
	_, err := a.c.Start(ctx, client.StartRequest{Workflow: "bk-wait", ID: "w1"})
	require.NoError(t, err)
	_, err = a.c.Start(ctx, client.StartRequest{Workflow: "bk-sleep", ID: "s1"})
	require.NoError(t, err)
	a.waitStepStatus(t, "w1", "gate", projections.OpWaiting)
	a.waitStepStatus(t, "s1", "nap", projections.OpWaiting)
	key, err := a.c.CreateKey(ctx, client.KeyRequest{Name: "reader", Scopes: []string{"read"}, Namespaces: []string{"default"}})
	require.NoError(t, err)
	before := map[string][]byte{}
	for _, id := range append(finished, "w1") {
		b, err := json.Marshal(a.history(t, id))
		require.NoError(t, err)
		before[id] = b
	}

	// No other identity may take it: refused at once, not left waiting.
	var out, errOut bytes.Buffer
	code := cli.Main(ctx, []string{"admin", "backup", filepath.Join(t.TempDir(), "denied"), "--nats", a.info.NATSURL,
		"--creds", a.info.Creds(auth.RoleJanitor)}, &out, &errOut)
	require.Equal(t, cli.ExitDenied, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	require.Contains(t, errOut.String(), "need the admin identity")

	// The backup, through the command line, as the admin identity.
	dir := filepath.Join(t.TempDir(), "backup")
	out.Reset()
	errOut.Reset()
	code = cli.Main(ctx, []string{"admin", "backup", dir, "--nats", a.info.NATSURL, "--creds", a.info.Creds(auth.RoleAdmin)}, &out, &errOut)
	require.Equal(t, cli.ExitOK, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	t.Logf("jetflow admin backup:\n%s", out.String())
	require.Contains(t, out.String(), "backup done")
	require.Contains(t, out.String(), "not backed up: KV_"+bus.BucketExecutions)
	a.stop()

	// A new stack on a new data directory (new identities too), restoring
	// the backup before its bootstrap and services.
	b := startStack(t, func(c *devstack.Config) { c.Restore = dir })
	for _, id := range finished {
		x := b.waitDone(t, id, 20*time.Second)
		require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))
		got, err := json.Marshal(b.history(t, id))
		require.NoError(t, err)
		require.JSONEq(t, string(before[id]), string(got), "history of %s", id)
	}
	got, err := json.Marshal(b.history(t, "w1"))
	require.NoError(t, err)
	require.JSONEq(t, string(before["w1"]), string(got), "history of w1")

	// An api key made before the backup still works.
	_, err = client.New(b.info.APIURL, client.WithToken(key.Token)).Execution(ctx, "q1")
	require.NoError(t, err, "the api key made before the backup")

	// The waiting execution goes on when signalled, the sleeping one when
	// its restored timer fires.
	b.waitStepStatus(t, "w1", "gate", projections.OpWaiting)
	_, err = b.c.Signal(ctx, "w1", "go", json.RawMessage(`{"by":"test"}`))
	require.NoError(t, err)
	x := b.waitDone(t, "w1", 30*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))
	x = b.waitDone(t, "s1", 60*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))
	requireLinear(t, b.history(t, "s1"))

	// New starts work; the ids used before the backup stay used.
	x = b.runToEnd(t, client.StartRequest{Workflow: "bk-quick", ID: "q4"})
	require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))
	_, err = b.c.Start(ctx, client.StartRequest{Workflow: "bk-quick", ID: "q1"})
	var apiErr *client.Error
	require.True(t, errors.As(err, &apiErr), "starting q1 again: %v", err)
	require.Equal(t, http.StatusConflict, apiErr.Status, apiErr.Message)
	require.Contains(t, apiErr.Message, "already used")

	// The read models were re-projected from the restored histories.
	rm, err := b.js.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
	poll(t, 20*time.Second, "read models of q1, q2, q3", func() (bool, string) {
		for _, id := range finished {
			if _, err := rm.Get(ctx, id); err != nil {
				return false, fmt.Sprintf("%s: %v", id, err)
			}
		}
		return true, ""
	})

	// Restoring again onto the deployment that now runs it: refused,
	// naming the dispatchers running, nothing changed (what a restore
	// onto data says is checked in package backup).
	out.Reset()
	errOut.Reset()
	code = cli.Main(ctx, []string{"admin", "restore", dir, "--nats", b.info.NATSURL, "--creds", b.info.Creds(auth.RoleAdmin)}, &out, &errOut)
	require.Equal(t, cli.ExitConflict, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
	require.Contains(t, errOut.String(), "jetflow services are running against this server (dispatchers ")
	require.Contains(t, errOut.String(), "nothing was changed")
	x, err = b.c.Execution(ctx, "q4")
	require.NoError(t, err)
	require.Equal(t, projections.StatusSucceeded, x.Status)
}
