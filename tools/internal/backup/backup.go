package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/svc"
)

// Options are told what a backup or a restore does, stream by stream.
type Options struct {
	// Starting, if set, is called once every check has passed, before
	// the first snapshot is taken or restored (and, for a restore, before
	// anything changes), with the manifest as far as it is known: what a
	// caller prints from then on (a header) never comes before a refusal.
	Starting func(Manifest)
	// Progress, if set, is called after each stream.
	Progress func(Snapshot)
}

// Backup writes a backup of the deployment nc reaches (its account) into
// dir, which must not exist or be empty: a directory per stream of
// [Plan] that is backed up, in its order, then the manifest. nc must be
// allowed the snapshot API (the admin identity).
func Backup(ctx context.Context, nc *nats.Conn, dir string, o Options) (Manifest, error) {
	m := Manifest{Format: Format, FormatVersion: FormatVersion, Jetflow: svc.Version(), SchemaVersion: events.SchemaVersion,
		StartedAt: time.Now().UTC()}
	if err := emptyDir(dir); err != nil {
		return m, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return m, err
	}
	if m.Partitions, err = bus.Partitions(ctx, js); err != nil {
		return m, fmt.Errorf("backup: %w", err)
	}
	if o.Starting != nil {
		o.Starting(m)
	}
	for _, it := range Plan() {
		if !it.Backup {
			m.Skipped = append(m.Skipped, Skipped{Stream: it.Stream, Why: it.Why})
			continue
		}
		if _, err := js.Stream(ctx, it.Stream); err != nil {
			if errors.Is(err, jetstream.ErrStreamNotFound) {
				return m, fmt.Errorf("backup: stream %s is missing: is this a jetflow deployment, and was it bootstrapped (jetflow bootstrap)?", it.Stream)
			}
			return m, fmt.Errorf("backup: look up stream %s: %w", it.Stream, err)
		}
		began := time.Now()
		s, err := snapshotStream(ctx, nc, it.Stream, filepath.Join(dir, it.Stream), it.Consumers)
		if err != nil {
			return m, fmt.Errorf("backup: %w", err)
		}
		snap := Snapshot{Stream: it.Stream, Bucket: it.Bucket, Dir: it.Stream, Consumers: it.Consumers,
			Messages: s.State.Messages, FirstSeq: s.State.FirstSeq, LastSeq: s.State.LastSeq, Bytes: s.State.Bytes,
			ConsumerCount: s.State.Consumers, SnapshotBytes: s.Bytes, TakenAt: began.UTC(), TookMS: time.Since(began).Milliseconds(),
			Config: s.Config}
		if !it.Consumers {
			snap.ConsumerCount = 0
		}
		m.Streams = append(m.Streams, snap)
		if o.Progress != nil {
			o.Progress(snap)
		}
	}
	m.FinishedAt = time.Now().UTC()
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return m, err
	}
	tmp := filepath.Join(dir, ManifestFile+".tmp")
	if err := writeFileSync(tmp, append(b, '\n')); err != nil {
		return m, fmt.Errorf("backup: write the manifest: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, ManifestFile)); err != nil {
		return m, fmt.Errorf("backup: write the manifest: %w", err)
	}
	return m, nil
}

// ErrDirInUse means a backup was given a directory that already holds
// files: nothing was written.
var ErrDirInUse = errors.New("backup: directory in use")

// emptyDir makes dir (0700) or checks that it is empty: a backup never
// mixes with another.
func emptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("backup: %w", err)
	case len(ents) > 0:
		return fmt.Errorf("%w: %s is not empty: give a new directory for each backup", ErrDirInUse, dir)
	}
	return nil
}

// ReadManifest reads and checks the manifest of the backup in dir, and
// that each snapshot it lists is there.
func ReadManifest(dir string) (Manifest, error) {
	var m Manifest
	if st, err := os.Stat(dir); err == nil && !st.IsDir() {
		return m, fmt.Errorf("%w: %s is a file; a backup is the directory jetflow admin backup wrote", ErrNotBackup, dir)
	}
	b, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Stat(dir); serr != nil {
			return m, fmt.Errorf("%w: %s: %w", ErrNotBackup, dir, serr)
		}
		return m, fmt.Errorf("%w: %s has no %s (a backup that did not finish, or another directory)", ErrNotBackup, dir, ManifestFile)
	}
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%w: %s: %w", ErrNotBackup, filepath.Join(dir, ManifestFile), err)
	}
	if err := CheckManifest(m); err != nil {
		return m, err
	}
	for _, s := range m.Streams {
		for _, f := range []string{MetaFile, DataFile} {
			if _, err := os.Stat(filepath.Join(dir, s.Dir, f)); err != nil {
				return m, fmt.Errorf("%w: the snapshot of %s is incomplete: %w", ErrNotBackup, s.Stream, err)
			}
		}
	}
	return m, nil
}

// Restored says what a restore did.
type Restored struct {
	Manifest Manifest
	// Deleted are the streams deleted before restoring (empty ones, or
	// with replace those that held data).
	Deleted []Existing
	// Streams are the restored streams, with how long each took.
	Streams []Snapshot
	Took    time.Duration
}

// Restore puts the backup in dir back onto the server nc reaches. It
// checks everything before it changes anything: the manifest, and that no
// stream it would create holds data (unless replace: then those streams,
// and the read models, are deleted first). It records the backup's number
// of partitions. It leaves the durable consumers of the events stream and
// of the streams not in the backup to the bootstrap (jetflow bootstrap,
// or jetflow dev at its start), which must run before the services.
func Restore(ctx context.Context, nc *nats.Conn, dir string, replace bool, o Options) (Restored, error) {
	began := time.Now()
	var r Restored
	m, err := ReadManifest(dir)
	if err != nil {
		return r, err
	}
	r.Manifest = m
	js, err := jetstream.New(nc)
	if err != nil {
		return r, err
	}
	t, err := target(ctx, js, m)
	if err != nil {
		return r, err
	}
	p, err := PlanRestore(m, t, replace)
	if err != nil {
		return r, err
	}
	if o.Starting != nil {
		o.Starting(m)
	}
	// From here on the server changes: an error says how to finish.
	partway := func(err error) error {
		return fmt.Errorf("restore: %w; %w (%d of %d streams restored, the backup's own)", err, ErrPartway, len(r.Streams), len(m.Streams))
	}
	for _, e := range p.Delete {
		if err := js.DeleteStream(ctx, e.Stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return r, partway(fmt.Errorf("delete stream %s: %w", e.Stream, err))
		}
		r.Deleted = append(r.Deleted, e)
	}
	for _, s := range m.Streams {
		start := time.Now()
		st, err := restoreStreamRetrying(ctx, nc, s.Stream, filepath.Join(dir, s.Dir))
		if err != nil {
			return r, partway(err)
		}
		if st.LastSeq != s.LastSeq || (st.Messages != s.Messages && !expired(ctx, js, s, st)) {
			return r, partway(fmt.Errorf("stream %s came back with %d messages up to sequence %d; the backup holds %d up to %d",
				s.Stream, st.Messages, st.LastSeq, s.Messages, s.LastSeq))
		}
		s.TookMS = time.Since(start).Milliseconds()
		r.Streams = append(r.Streams, s)
		if o.Progress != nil {
			o.Progress(s)
		}
	}
	if err := recordPartitions(ctx, js, m.Partitions); err != nil {
		return r, partway(err)
	}
	r.Took = time.Since(began)
	return r, nil
}

// restoreStreamRetrying is restoreStream, tried again when the server
// lost a race with itself: after a stream is deleted, nats-server removes
// the account's directories in the background if they are empty, and a
// restore that creates the account's first stream in the meantime can find
// its new directory gone ("could not create storage directory"). Such a
// restore failed before it added the stream, so nothing is left to undo.
func restoreStreamRetrying(ctx context.Context, nc *nats.Conn, stream, dir string) (streamState, error) {
	const tries = 5
	for try := 1; ; try++ {
		st, err := restoreStream(ctx, nc, stream, dir)
		if err == nil || try == tries || !storageDirGone(err) {
			return st, err
		}
		select {
		case <-ctx.Done():
			return st, err
		case <-time.After(time.Duration(try) * 100 * time.Millisecond):
		}
	}
}

// storageDirGone reports whether err is the server's answer when a
// directory it had just made was removed under it (restoreStreamRetrying).
func storageDirGone(err error) bool {
	var e *apiError
	return errors.As(err, &e) && e.ErrCode == errRestoreFailed &&
		strings.Contains(e.Description, "could not create storage directory") &&
		strings.Contains(e.Description, "no such file or directory")
}

// expired reports whether a stream restored with fewer messages than its
// backup holds (st against s) may have lost them to their own TTLs: it
// allows per-message TTLs (the tasks stream, for its dispatchers'
// keepers), and messages whose time passed between the backup and the
// restore are dropped as it loads.
func expired(ctx context.Context, js jetstream.JetStream, s Snapshot, st streamState) bool {
	if st.Messages > s.Messages {
		return false
	}
	stream, err := js.Stream(ctx, s.Stream)
	return err == nil && stream.CachedInfo().Config.AllowMsgTTL
}

// memberLooks is how long a restore looks for running dispatchers in the
// dispatchers bucket, every memberLookEvery, before it takes it that none
// runs: two TTLs of a member's key (renewed every quarter TTL), so that
// one whose renewals come late is seen.
const (
	memberLooks     = 2 * partition.DefaultTTL
	memberLookEvery = partition.DefaultTTL / 4
)

// target looks at what the server holds of the streams of m, the read
// models and the recorded number of partitions.
func target(ctx context.Context, js jetstream.JetStream, m Manifest) (Target, error) {
	var t Target
	names := []string{bus.BucketStream(bus.BucketExecutions)}
	for _, s := range m.Streams {
		names = append(names, s.Stream)
	}
	for _, name := range names {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return t, fmt.Errorf("restore: look up stream %s: %w", name, err)
		}
		n := s.CachedInfo().State.Msgs
		if name == bus.StreamTasks && n > 0 {
			// The dispatchers' keepers are in nobody's way: they expire.
			keepers, err := s.Info(ctx, jetstream.WithSubjectFilter(bus.TasksKeeperSubject))
			if err != nil {
				return t, fmt.Errorf("restore: look up stream %s: %w", name, err)
			}
			n -= min(n, keepers.State.Subjects[bus.TasksKeeperSubject])
		}
		t.Streams = append(t.Streams, Existing{Stream: name, Messages: n})
	}
	kv, err := js.KeyValue(ctx, bus.BucketDispatchers)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
	case err != nil:
		return t, fmt.Errorf("restore: look up bucket %s: %w", bus.BucketDispatchers, err)
	default:
		// A member's key lives a second past its last renewal, and a
		// starved dispatcher renews late: its key may be missing at one
		// look. So when a member's key changed lately (a put, or the
		// marker of its expiry), the members are listed again for
		// memberLooks, until one is seen; otherwise once.
		deadline := time.Now()
		last, err := bus.LeaderGet(ctx, js, bus.BucketStream(bus.BucketDispatchers),
			bus.MsgQuery{LastBySubject: bus.BucketSubject(bus.BucketDispatchers, partition.MemberKey(">"))})
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return t, fmt.Errorf("restore: look up the dispatchers' last change: %w", err)
		case time.Since(last.Time) < memberLooks:
			deadline = deadline.Add(memberLooks)
		}
		seen := map[string]bool{}
		for len(seen) == 0 {
			members, err := kv.ListKeysFiltered(ctx, partition.MemberKey(">"))
			if err != nil {
				return t, fmt.Errorf("restore: list the dispatchers: %w", err)
			}
			for k := range members.Keys() {
				seen[strings.TrimPrefix(k, partition.MemberKey(""))] = true
			}
			if len(seen) > 0 || !time.Now().Before(deadline) {
				break
			}
			select {
			case <-ctx.Done():
				return t, ctx.Err()
			case <-time.After(memberLookEvery):
			}
		}
		t.Dispatchers = slices.Sorted(maps.Keys(seen))
		n, err := partition.Count(ctx, kv)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return t, fmt.Errorf("restore: %w", err)
		default:
			t.Partitions = n
		}
	}
	return t, nil
}

// recordPartitions records n as the deployment's number of partitions,
// making the dispatchers bucket with as many replicas as the restored
// events stream has.
func recordPartitions(ctx context.Context, js jetstream.JetStream, n int) error {
	replicas := 1
	if s, err := js.Stream(ctx, bus.StreamEvents); err == nil {
		replicas = max(replicas, s.CachedInfo().Config.Replicas)
	}
	kv, err := js.KeyValue(ctx, bus.BucketDispatchers)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		for _, kc := range bus.Buckets(bus.Config{Replicas: replicas}) {
			if kc.Bucket == bus.BucketDispatchers {
				kv, err = js.CreateKeyValue(ctx, kc)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("bucket %s: %w", bus.BucketDispatchers, err)
	}
	return partition.SetCount(ctx, kv, n)
}
