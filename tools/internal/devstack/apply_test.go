package devstack

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/workflow"
)

// TestApplyAtStartKeepsALaterVersion: the files jetflow dev applies at
// each start do not take the latest version back from one applied since
// (an example edited and applied by hand): a file unchanged since it was
// last applied is left. A changed file is applied, as a new version,
// even when it changed back to an older version's text. Without the
// record of what was applied (a data directory of an older release), a
// file that is an older version is left.
func TestApplyAtStartKeepsALaterVersion(t *testing.T) {
	t.Parallel()
	s := natstest.RunJetStream(t)
	nc, js := natstest.Connect(t, s)
	c := &bus.Conn{NC: nc, JS: js}
	ctx := t.Context()
	var logged bytes.Buffer
	log := zerolog.New(io.MultiWriter(zerolog.NewTestWriter(t), &logged))
	data, examples := t.TempDir(), t.TempDir()
	file := filepath.Join(examples, "hello.yaml")
	const (
		a = "name: hello\nsteps:\n  - {id: a, kind: noop}\n"
		b = "name: hello\nsteps:\n  - {id: b, kind: noop}\n"
		d = "name: hello\nsteps:\n  - {id: d, kind: noop}\n"
	)
	store, err := catalog.Open(ctx, js)
	require.NoError(t, err)
	write := func(text string) {
		t.Helper()
		require.NoError(t, os.WriteFile(file, []byte(text), 0o600))
	}
	start := func() {
		t.Helper()
		require.NoError(t, applyFiles(ctx, c, data, []string{examples}, log))
	}
	byHand := func(text string) {
		t.Helper()
		def, err := workflow.Parse([]byte(text))
		require.NoError(t, err)
		_, created, err := store.Apply(ctx, def)
		require.NoError(t, err)
		require.True(t, created)
	}
	latest := func(version int, step, what string) {
		t.Helper()
		rec, err := store.Get(ctx, "hello", 0)
		require.NoError(t, err)
		require.Equal(t, version, rec.Version, what)
		require.Equal(t, step, rec.Definition.Steps[0].ID, what)
	}

	write(a)
	start()
	latest(1, "a", "the first start applies the file")
	start()
	latest(1, "a", "the same file again is no new version")

	byHand(b)
	latest(2, "b", "applied by hand")
	start()
	latest(2, "b", "a start after: the version applied since stays the latest")

	write(b)
	start()
	write(a) // reverted: a change of the file all the same
	start()
	latest(3, "a", "the file changed since it was applied: applied")

	// A data directory without the record: by the versions alone.
	require.NoError(t, os.Remove(filepath.Join(data, AppliedFile)))
	byHand(d)
	start()
	latest(4, "d", "the file is an older version: the version applied since stays the latest")
	versions, err := store.Versions(ctx, "hello")
	require.NoError(t, err)
	require.Len(t, versions, 4, "no version made again")
	start()
	latest(4, "d", "recorded again: left")

	// A changed file applied over a version applied since: said.
	logged.Reset()
	write(b)
	start()
	latest(5, "b", "the file changed: applied")
	require.Contains(t, logged.String(), `"level":"warn"`)
	require.Contains(t, logged.String(), "its version 5 replaces version 4 as the latest")
	logged.Reset()
	write(a)
	start()
	latest(6, "a", "changed again")
	require.NotContains(t, logged.String(), "replaces", "over the file's own last version: nothing to say")
}
