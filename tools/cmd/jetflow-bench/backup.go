package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natsserver"
	"jetflow.dev/tools/internal/backup"
	"jetflow.dev/tools/internal/devstack"
)

// runBackup times a backup of the stack after the other runs, while its
// services still run (as jetflow admin backup takes it), then a restore
// of it into a new server of its own, and says how big the backup is and
// how long rebuilding every read model takes.
func runBackup(ctx context.Context, out io.Writer, nc *nats.Conn, stack devstack.Info, dataDir string) error {
	dir := filepath.Join(dataDir, "backup")
	m, err := backup.Backup(ctx, nc, dir, backup.Options{})
	if err != nil {
		return err
	}
	took := m.FinishedAt.Sub(m.StartedAt)
	var msgs uint64
	var bytes int64
	var events, ids uint64
	for _, s := range m.Streams {
		msgs += s.Messages
		bytes += s.SnapshotBytes
		switch s.Stream {
		case bus.StreamEvents:
			events = s.Messages
		case bus.BucketStream(bus.BucketExecutionIDs):
			ids = s.Messages
		}
	}
	fmt.Fprintf(out, "\nbackup run: %d executions (ids claimed), %d events, %d messages in %d streams\n", ids, events, msgs, len(m.Streams))
	fmt.Fprintf(out, "  backup           %s, %.1f MiB on disk\n", took.Round(time.Millisecond), float64(bytes)/(1<<20))

	store, err := os.MkdirTemp(dataDir, "restored-")
	if err != nil {
		return err
	}
	srv, err := natsserver.Start(natsserver.Config{StoreDir: store, Port: -1})
	if err != nil {
		return err
	}
	defer natsserver.Stop(srv)
	rc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return err
	}
	defer rc.Close()
	r, err := backup.Restore(ctx, rc, dir, false, backup.Options{})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  restore          %s (into a new server; the re-projection of the read models comes after)\n", r.Took.Round(time.Millisecond))
	for _, s := range r.Streams {
		fmt.Fprintf(out, "    %-22s %8d messages  backup %6d ms  restore %6d ms\n", s.Stream, s.Messages, findTook(m, s.Stream), s.TookMS)
	}
	// What the projector does after a restore, measured on the stack
	// itself: every read model folded again from the first event.
	res, err := stack.Client().RebuildProjections(ctx, 0)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  re-projection    %s for %d read models (jetflow projections rebuild on the stack: what the projector does after a restore)\n",
		(time.Duration(res.TookMS) * time.Millisecond).String(), res.Written+res.Unchanged)
	return nil
}

func findTook(m backup.Manifest, stream string) int64 {
	for _, s := range m.Streams {
		if s.Stream == stream {
			return s.TookMS
		}
	}
	return 0
}
