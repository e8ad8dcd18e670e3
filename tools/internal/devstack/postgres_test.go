package devstack

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/services/api/visibility/pgstore"
	"jetflow.dev/services/api/visibility/storetest"
)

// TestVisibilityIndexInPostgres: a stack given VisibilityPostgres (jetflow
// dev --visibility-postgres, JETFLOW_VISIBILITY_POSTGRES) keeps its
// visibility index there, not in its data directory, and lists an
// execution it ran from it.
func TestVisibilityIndexInPostgres(t *testing.T) {
	url := storetest.PostgresURL(t)
	// The default namespace's schema: no other test of this server uses it
	// (they make databases or schemas of their own); dropped before, in
	// case a killed run left it, and after.
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		s, err := pgstore.Open(ctx, url, pgstore.SchemaFor(auth.DefaultNamespace))
		require.NoError(t, err)
		defer s.Close()
		require.NoError(t, s.Drop(ctx))
	}
	drop()
	t.Cleanup(drop)

	dir := t.TempDir()
	info, stop, done := runWith(t, Config{DataDir: dir, NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", VisibilityPostgres: url,
		Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)})
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})
	c := info.Client()
	_, err := c.ApplyWorkflow(t.Context(), []byte("name: pg-listed\nsteps:\n  - {id: a, kind: noop}\n"))
	require.NoError(t, err)
	_, err = c.Start(t.Context(), client.StartRequest{Workflow: "pg-listed", ID: "pg-1"})
	require.NoError(t, err)
	natstest.Eventually(t, time.Minute, func() bool {
		list, _, err := c.ListExecutions(t.Context(), client.ListOptions{Workflow: "pg-listed"})
		return err == nil && len(list) == 1 && list[0].ID == "pg-1"
	}, "the execution is listed from the index in PostgreSQL")
	_, err = os.Stat(filepath.Join(dir, "visibility"))
	require.ErrorIs(t, err, os.ErrNotExist, "no index in the data directory")
}
