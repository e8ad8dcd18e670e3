package backup_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natsserver"
	"jetflow.dev/tools/internal/backup"
)

// A backup of one server restored into another, as jetflow admin backup
// and jetflow admin restore do it (docs/backup.md). go test runs it and
// checks what it prints.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tmp, err := os.MkdirTemp("", "jetflow-backup-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(tmp)

	// A deployment with two executions' histories.
	old, nc := serve(filepath.Join(tmp, "old"))
	js, _ := jetstream.New(nc)
	if err := bus.Bootstrap(ctx, js, bus.Config{}, bus.Durables{}); err != nil {
		panic(err)
	}
	for _, subj := range []string{"jf.events.hello.x1", "jf.events.hello.x1", "jf.events.hello.x2"} {
		if _, err := js.Publish(ctx, subj, []byte(`{}`)); err != nil {
			panic(err)
		}
	}

	// Backed up while it runs.
	m, err := backup.Backup(ctx, nc, filepath.Join(tmp, "backup"), backup.Options{})
	if err != nil {
		panic(err)
	}
	fmt.Printf("backup of schema %d, %d partitions, %d streams\n", m.SchemaVersion, m.Partitions, len(m.Streams))
	nc.Close()
	natsserver.Stop(old)

	// Restored into a new server; the bootstrap then makes the rest.
	srv, nc := serve(filepath.Join(tmp, "new"))
	defer natsserver.Stop(srv)
	defer nc.Close()
	r, err := backup.Restore(ctx, nc, filepath.Join(tmp, "backup"), false, backup.Options{})
	if err != nil {
		panic(err)
	}
	js, _ = jetstream.New(nc)
	if err := bus.Bootstrap(ctx, js, bus.Config{}, bus.Durables{}); err != nil {
		panic(err)
	}
	s, _ := js.Stream(ctx, bus.StreamEvents)
	fmt.Printf("restored %d streams: %d events, last sequence %d\n", len(r.Streams), s.CachedInfo().State.Msgs, s.CachedInfo().State.LastSeq)

	// Restoring again would overwrite them: refused, nothing changed.
	_, err = backup.Restore(ctx, nc, filepath.Join(tmp, "backup"), false, backup.Options{})
	fmt.Println(err != nil, errors.Is(err, backup.ErrRefused))
	// Output:
	// backup of schema 5, 8 partitions, 12 streams
	// restored 12 streams: 3 events, last sequence 3
	// true true
}

func serve(dir string) (*server.Server, *nats.Conn) {
	s, err := natsserver.Start(natsserver.Config{StoreDir: dir, Port: -1})
	if err != nil {
		panic(err)
	}
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		panic(err)
	}
	return s, nc
}
