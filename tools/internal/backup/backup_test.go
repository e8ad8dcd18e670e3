package backup_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/tools/internal/backup"
)

type testBundle struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	ctx context.Context
}

// setup starts a server with jetflow's topology (consumers included).
func setup(t *testing.T, partitions int) testBundle {
	t.Helper()
	b := bare(t)
	require.NoError(t, bus.Bootstrap(b.ctx, b.js, bus.Config{Partitions: partitions}, bus.Durables{Partitions: partitions}))
	return b
}

// bare starts a server with nothing on it.
func bare(t *testing.T) testBundle {
	t.Helper()
	s := natstest.RunJetStream(t)
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return testBundle{nc: nc, js: js, ctx: ctx}
}

// fill writes n histories of three messages, their claims, a definition,
// read models and one command taken (acknowledged) by the intake and one
// not.
func fill(t *testing.T, b testBundle, n int) {
	t.Helper()
	for i := range n {
		id := fmt.Sprintf("x%d", i)
		for j := range 3 {
			_, err := b.js.Publish(b.ctx, bus.EventsPrefix+".wf."+id, fmt.Appendf(nil, `{"n":%d}`, j))
			require.NoError(t, err)
		}
		kv, err := b.js.KeyValue(b.ctx, bus.BucketExecutionIDs)
		require.NoError(t, err)
		_, err = kv.Put(b.ctx, id, []byte(`{"command_key":"k","workflow":"wf"}`))
		require.NoError(t, err)
		rm, err := b.js.KeyValue(b.ctx, bus.BucketExecutions)
		require.NoError(t, err)
		_, err = rm.Put(b.ctx, id, []byte(`{}`))
		require.NoError(t, err)
	}
	defs, err := b.js.KeyValue(b.ctx, bus.BucketDefinitions)
	require.NoError(t, err)
	_, err = defs.Put(b.ctx, "wf.1", []byte(`{"name":"wf"}`))
	require.NoError(t, err)
	for _, c := range []string{"first", "second"} {
		_, err := b.js.Publish(b.ctx, bus.SubjectStart, []byte(c))
		require.NoError(t, err)
	}
	cons, err := b.js.Consumer(b.ctx, bus.StreamCommands, bus.ConsumerDispatcherCommands)
	require.NoError(t, err)
	msgs, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	got := 0
	for m := range msgs.Messages() {
		require.NoError(t, m.DoubleAck(b.ctx))
		got++
	}
	require.Equal(t, 1, got)
}

// backUp backs b up into a new directory, which it returns.
func backUp(t *testing.T, b testBundle) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "b")
	_, err := backup.Backup(b.ctx, b.nc, dir, backup.Options{})
	require.NoError(t, err)
	return dir
}

func msgs(t *testing.T, b testBundle, stream string) uint64 {
	t.Helper()
	s, err := b.js.Stream(b.ctx, stream)
	require.NoError(t, err)
	return s.CachedInfo().State.Msgs
}

func TestBackupRestore(t *testing.T) {
	t.Parallel()
	src := setup(t, 4)
	fill(t, src, 20)
	dir := filepath.Join(t.TempDir(), "b")
	var seen []string
	m, err := backup.Backup(src.ctx, src.nc, dir, backup.Options{Progress: func(s backup.Snapshot) { seen = append(seen, s.Stream) }})
	require.NoError(t, err)
	require.Equal(t, events.SchemaVersion, m.SchemaVersion)
	require.Equal(t, 4, m.Partitions)
	var planned []string
	for _, it := range backup.Plan() {
		if it.Backup {
			planned = append(planned, it.Stream)
		}
	}
	require.Equal(t, planned, seen, "taken in the plan's order")
	require.NotContains(t, seen, "KV_"+bus.BucketExecutions, "read models are rebuilt, not backed up")
	for _, s := range m.Streams {
		var cfg struct {
			Name string `json:"name"`
		}
		require.NoError(t, json.Unmarshal(s.Config, &cfg))
		require.Equal(t, s.Stream, cfg.Name, "the manifest holds each stream's configuration")
		if s.Stream == bus.StreamEvents {
			require.EqualValues(t, 60, s.Messages)
			require.EqualValues(t, 60, s.LastSeq)
		}
	}

	// Restored onto a server with nothing: the same messages, the same
	// sequences, the partitions recorded, the read models left to the
	// projector, the intake's position kept.
	dst := bare(t)
	r, err := backup.Restore(dst.ctx, dst.nc, dir, false, backup.Options{})
	require.NoError(t, err)
	require.Len(t, r.Streams, len(planned))
	require.Empty(t, r.Deleted)
	for _, s := range m.Streams {
		require.Equal(t, s.Messages, msgs(t, dst, s.Stream), s.Stream)
	}
	ev, err := dst.js.Stream(dst.ctx, bus.StreamEvents)
	require.NoError(t, err)
	last, err := ev.GetLastMsgForSubject(dst.ctx, bus.EventsPrefix+".wf.x19")
	require.NoError(t, err)
	require.EqualValues(t, 60, last.Sequence)
	require.Equal(t, `{"n":2}`, string(last.Data))
	_, err = dst.js.Stream(dst.ctx, "KV_"+bus.BucketExecutions)
	require.ErrorIs(t, err, jetstream.ErrStreamNotFound)
	n, err := bus.Partitions(dst.ctx, dst.js)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	ci, err := dst.js.Consumer(dst.ctx, bus.StreamCommands, bus.ConsumerDispatcherCommands)
	require.NoError(t, err)
	require.EqualValues(t, 1, ci.CachedInfo().NumPending, "the intake goes on after the command it had taken")
	_, err = dst.js.Consumer(dst.ctx, bus.StreamEvents, bus.ConsumerProjector)
	require.ErrorIs(t, err, jetstream.ErrConsumerNotFound, "the bootstrap makes the projector anew: it re-projects from the start")
	// The bootstrap brings the rest (read models, projector) up.
	require.NoError(t, bus.Bootstrap(dst.ctx, dst.js, bus.Config{}, bus.Durables{Partitions: 4}))
	require.EqualValues(t, 60, msgs(t, dst, bus.StreamEvents))

	// Again onto it: refused, nothing changed.
	_, err = backup.Restore(dst.ctx, dst.nc, dir, false, backup.Options{})
	require.ErrorIs(t, err, backup.ErrRefused)
	require.ErrorContains(t, err, bus.StreamEvents+" (60 messages)")
	require.ErrorIs(t, err, backup.ErrInTheWay, "a caller that can replace says how")
	require.EqualValues(t, 60, msgs(t, dst, bus.StreamEvents))

	// With replace, after more was written: the backup's data again.
	_, err = dst.js.Publish(dst.ctx, bus.EventsPrefix+".wf.later", []byte(`{}`))
	require.NoError(t, err)
	r, err = backup.Restore(dst.ctx, dst.nc, dir, true, backup.Options{})
	require.NoError(t, err)
	require.NotEmpty(t, r.Deleted)
	require.EqualValues(t, 60, msgs(t, dst, bus.StreamEvents))
}

func TestRestoreIntoBootstrappedDeployment(t *testing.T) {
	t.Parallel()
	src := setup(t, 0)
	fill(t, src, 2)
	dir := backUp(t, src)

	// A new deployment, bootstrapped (empty streams) before the restore:
	// its empty streams give way without --replace, but not while a
	// dispatcher runs against it.
	dst := setup(t, 0)
	js, err := jetstream.New(dst.nc)
	require.NoError(t, err)
	members, err := js.KeyValue(dst.ctx, bus.BucketDispatchers)
	require.NoError(t, err)
	_, err = members.Put(dst.ctx, partition.MemberKey("running-one"), []byte("{}"))
	require.NoError(t, err)
	_, err = backup.Restore(dst.ctx, dst.nc, dir, true, backup.Options{})
	require.ErrorIs(t, err, backup.ErrRefused)
	require.ErrorContains(t, err, "dispatchers running-one")
	require.NoError(t, members.Delete(dst.ctx, partition.MemberKey("running-one")))
	r, err := backup.Restore(dst.ctx, dst.nc, dir, false, backup.Options{})
	require.NoError(t, err)
	require.NotEmpty(t, r.Deleted)
	for _, d := range r.Deleted {
		require.Zero(t, d.Messages, d.Stream)
	}
	require.EqualValues(t, 6, msgs(t, dst, bus.StreamEvents))

	// One with another number of partitions: refused.
	other := setup(t, 3)
	_, err = backup.Restore(other.ctx, other.nc, dir, false, backup.Options{})
	require.ErrorIs(t, err, backup.ErrRefused)
	require.ErrorContains(t, err, "3 dispatcher partitions and the backup 8")
	require.Zero(t, msgs(t, other, bus.StreamEvents))
}

func TestBackupRefusesUsedDirectory(t *testing.T) {
	t.Parallel()
	src := setup(t, 0)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "other"), []byte("x"), 0o600))
	_, err := backup.Backup(src.ctx, src.nc, dir, backup.Options{})
	require.ErrorIs(t, err, backup.ErrDirInUse)
	require.ErrorContains(t, err, "is not empty")
	require.NoFileExists(t, filepath.Join(dir, backup.ManifestFile))
}

func TestReadManifestRefuses(t *testing.T) {
	t.Parallel()
	t.Run("NoManifest", func(t *testing.T) {
		t.Parallel()
		_, err := backup.ReadManifest(t.TempDir())
		require.ErrorIs(t, err, backup.ErrNotBackup)
		require.ErrorContains(t, err, "did not finish")
	})
	t.Run("NoDirectory", func(t *testing.T) {
		t.Parallel()
		_, err := backup.ReadManifest(filepath.Join(t.TempDir(), "none"))
		require.ErrorIs(t, err, backup.ErrNotBackup)
	})
	t.Run("AFile", func(t *testing.T) {
		t.Parallel()
		file := filepath.Join(t.TempDir(), "hello.yaml")
		require.NoError(t, os.WriteFile(file, []byte("name: hello\n"), 0o600))
		_, err := backup.ReadManifest(file)
		require.ErrorIs(t, err, backup.ErrNotBackup)
		require.ErrorContains(t, err, "is a file")
	})
	t.Run("MissingSnapshot", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		m := validManifest()
		b, err := json.Marshal(m)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, backup.ManifestFile), b, 0o600))
		_, err = backup.ReadManifest(dir)
		require.ErrorIs(t, err, backup.ErrNotBackup)
		require.ErrorContains(t, err, "snapshot of "+bus.StreamEvents+" is incomplete")
	})
}

func validManifest() backup.Manifest {
	return backup.Manifest{Format: backup.Format, FormatVersion: backup.FormatVersion, Jetflow: "v1", SchemaVersion: events.SchemaVersion,
		Partitions: 8, Streams: []backup.Snapshot{{Stream: bus.StreamEvents, Dir: bus.StreamEvents, Messages: 3, LastSeq: 3}}}
}

func TestCheckManifest(t *testing.T) {
	t.Parallel()
	require.NoError(t, backup.CheckManifest(validManifest()))
	cases := map[string]struct {
		mod  func(*backup.Manifest)
		want error
		says string
	}{
		"OtherFormat":   {func(m *backup.Manifest) { m.Format = "tar" }, backup.ErrNotBackup, `format "tar"`},
		"NewerLayout":   {func(m *backup.Manifest) { m.FormatVersion = backup.FormatVersion + 1 }, backup.ErrRefused, "backup format 2"},
		"NewerSchema":   {func(m *backup.Manifest) { m.SchemaVersion = events.SchemaVersion + 1 }, backup.ErrRefused, "reads up to schema"},
		"NoSchema":      {func(m *backup.Manifest) { m.SchemaVersion = 0 }, backup.ErrNotBackup, "no schema version"},
		"NoPartitions":  {func(m *backup.Manifest) { m.Partitions = 0 }, backup.ErrNotBackup, "partitions"},
		"NoEvents":      {func(m *backup.Manifest) { m.Streams[0].Stream = bus.StreamTasks }, backup.ErrRefused, "no " + bus.StreamEvents},
		"UnknownStream": {func(m *backup.Manifest) { m.Streams[0].Stream = "OTHER" }, backup.ErrRefused, `"OTHER"`},
		"ReadModels":    {func(m *backup.Manifest) { m.Streams[0].Stream = "KV_" + bus.BucketExecutions }, backup.ErrRefused, "not one jetflow backs up"},
		"EscapingDir":   {func(m *backup.Manifest) { m.Streams[0].Dir = "../x" }, backup.ErrNotBackup, `directory "../x"`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := validManifest()
			c.mod(&m)
			err := backup.CheckManifest(m)
			require.ErrorIs(t, err, c.want)
			require.ErrorContains(t, err, c.says)
		})
	}
}

func TestPlanRestore(t *testing.T) {
	t.Parallel()
	m := validManifest()
	readModels := "KV_" + bus.BucketExecutions
	empty := backup.Target{Streams: []backup.Existing{{Stream: bus.StreamEvents}, {Stream: readModels}, {Stream: bus.StreamKills, Messages: 4}}}
	p, err := backup.PlanRestore(m, empty, false)
	require.NoError(t, err)
	require.Equal(t, []backup.Existing{{Stream: bus.StreamEvents}, {Stream: readModels}}, p.Delete, "streams not in the backup stay")

	full := backup.Target{Streams: []backup.Existing{{Stream: bus.StreamEvents, Messages: 9}, {Stream: readModels, Messages: 2}}, Partitions: 8}
	_, err = backup.PlanRestore(m, full, false)
	require.ErrorIs(t, err, backup.ErrRefused)
	require.ErrorContains(t, err, bus.StreamEvents+" (9 messages), "+readModels+" (2 messages)")
	p, err = backup.PlanRestore(m, full, true)
	require.NoError(t, err)
	require.Len(t, p.Delete, 2)

	_, err = backup.PlanRestore(m, backup.Target{Partitions: partition.DefaultCount + 1}, true)
	require.ErrorIs(t, err, backup.ErrRefused, "--replace does not change the number of partitions")

	_, err = backup.PlanRestore(m, backup.Target{Dispatchers: []string{"d1", "d2"}}, true)
	require.ErrorIs(t, err, backup.ErrRefused, "--replace under running services")
	require.ErrorContains(t, err, "dispatchers d1, d2")
}

// TestTimersFireAfterRestore: the pending message schedules in the timers
// stream fire after the restore, at once for one that fell due while the
// deployment was down.
func TestTimersFireAfterRestore(t *testing.T) {
	t.Parallel()
	src := setup(t, 0)
	schedule := func(id string, due time.Time) {
		m := nats.NewMsg(bus.SchedulesPrefix + "." + id)
		m.Header.Set("Nats-Schedule", "@at "+due.UTC().Format(time.RFC3339Nano))
		m.Header.Set("Nats-Schedule-Target", bus.TimersPrefix+".0."+id)
		m.Data = []byte(id)
		_, err := src.js.PublishMsg(src.ctx, m)
		require.NoError(t, err)
	}
	schedule("overdue", time.Now().Add(time.Second))
	schedule("later", time.Now().Add(4*time.Second))
	dir := backUp(t, src)
	// Restored elsewhere after the first fell due (the old server is
	// not looked at again).
	time.Sleep(1500 * time.Millisecond)

	dst := bare(t)
	_, err := backup.Restore(dst.ctx, dst.nc, dir, false, backup.Options{})
	require.NoError(t, err)
	restored := time.Now()
	fired := map[string]time.Time{}
	natstest.Eventually(t, 20*time.Second, func() bool {
		for _, id := range []string{"overdue", "later"} {
			if _, ok := fired[id]; ok {
				continue
			}
			s, err := dst.js.Stream(dst.ctx, bus.StreamTimers)
			if err != nil {
				return false
			}
			if m, err := s.GetLastMsgForSubject(dst.ctx, bus.TimersPrefix+".0."+id); err == nil && string(m.Data) == id {
				fired[id] = time.Now()
			}
		}
		return len(fired) == 2
	}, "both timers fire after the restore")
	t.Logf("overdue fired %s after the restore, later %s", fired["overdue"].Sub(restored), fired["later"].Sub(restored))
	require.Less(t, fired["overdue"].Sub(restored), 5*time.Second, "the overdue timer fires soon after the restore")
}

// TestRestoreStoppedPartway: a restore that fails after it began (here a
// damaged snapshot) says how it stopped and how to finish; once the
// snapshot is whole again, the same restore with replace finishes it.
func TestRestoreStoppedPartway(t *testing.T) {
	t.Parallel()
	src := setup(t, 0)
	fill(t, src, 50)
	dir := backUp(t, src)
	data := filepath.Join(dir, bus.StreamEvents, backup.DataFile)
	whole, err := os.ReadFile(data)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(data, whole[:len(whole)/2], 0o600))

	dst := bare(t)
	_, err = backup.Restore(dst.ctx, dst.nc, dir, false, backup.Options{})
	require.Error(t, err)
	require.ErrorContains(t, err, "stopped part-way (6 of 12 streams restored")
	require.ErrorIs(t, err, backup.ErrPartway, "a caller can say how to finish")

	require.NoError(t, os.WriteFile(data, whole, 0o600))
	_, err = backup.Restore(dst.ctx, dst.nc, dir, false, backup.Options{})
	require.ErrorIs(t, err, backup.ErrRefused, "what the first attempt restored is data now")
	_, err = backup.Restore(dst.ctx, dst.nc, dir, true, backup.Options{})
	require.NoError(t, err)
	require.EqualValues(t, 150, msgs(t, dst, bus.StreamEvents))
}

// TestKeepersExpireAcrossARestore: a backup taken while dispatchers run
// holds their keepers (docs/subjects.md, JF_TASKS); by the restore their
// TTL may have passed, and the server drops them as the stream loads.
// The restore takes that for what it is, not for a stream that came back
// short; and a deployment whose tasks stream holds only keepers is empty.
func TestKeepersExpireAcrossARestore(t *testing.T) {
	t.Parallel()
	src := setup(t, 0)
	fill(t, src, 2)
	for range 3 {
		_, err := src.js.Publish(src.ctx, bus.TasksKeeperSubject, nil, jetstream.WithMsgTTL(time.Second))
		require.NoError(t, err)
	}
	_, err := src.js.Publish(src.ctx, bus.TaskSubject("q"), []byte(`{}`)) // a task waiting for an agent
	require.NoError(t, err)
	dir := backUp(t, src)
	m, err := backup.ReadManifest(dir)
	require.NoError(t, err)
	var tasks backup.Snapshot
	for _, s := range m.Streams {
		if s.Stream == bus.StreamTasks {
			tasks = s
		}
	}
	require.EqualValues(t, 4, tasks.Messages, "the keepers are in the backup")

	// A deployment where a dispatcher ran a moment ago: its keepers are
	// in nobody's way.
	dst := setup(t, 0)
	_, err = dst.js.Publish(dst.ctx, bus.TasksKeeperSubject, nil, jetstream.WithMsgTTL(time.Minute))
	require.NoError(t, err)
	time.Sleep(1500 * time.Millisecond) // the backup's keepers' time passes
	r, err := backup.Restore(dst.ctx, dst.nc, dir, false, backup.Options{})
	require.NoError(t, err)
	require.Len(t, r.Streams, len(m.Streams))
	require.EqualValues(t, 1, msgs(t, dst, bus.StreamTasks), "the task, without its expired keepers")
	require.EqualValues(t, 6, msgs(t, dst, bus.StreamEvents))
}

// TestRestoreSeesADispatcherRenewingLate: a dispatcher's member key
// lapses (its renewals late, on a starved machine) just before a restore
// looks, and comes back a moment later: the restore still refuses
// because a service runs, not because it missed it.
func TestRestoreSeesADispatcherRenewingLate(t *testing.T) {
	t.Parallel()
	src := setup(t, 1)
	fill(t, src, 1)
	dir := filepath.Join(t.TempDir(), "b")
	_, err := backup.Backup(src.ctx, src.nc, dir, backup.Options{})
	require.NoError(t, err)

	dst := setup(t, 1)
	kv, err := dst.js.KeyValue(dst.ctx, bus.BucketDispatchers)
	require.NoError(t, err)
	renew := func() {
		_, err := dst.js.Publish(dst.ctx, bus.BucketSubject(bus.BucketDispatchers, partition.MemberKey("late")), []byte("n"),
			jetstream.WithMsgTTL(time.Second))
		require.NoError(t, err)
	}
	renew()
	natstest.Eventually(t, 30*time.Second, func() bool {
		_, err := kv.Get(dst.ctx, partition.MemberKey("late"))
		return errors.Is(err, jetstream.ErrKeyNotFound)
	}, "the member's key did not expire")
	time.AfterFunc(300*time.Millisecond, renew) // the late renewal
	_, err = backup.Restore(dst.ctx, dst.nc, dir, false, backup.Options{})
	require.ErrorIs(t, err, backup.ErrRefused)
	require.ErrorContains(t, err, "jetflow services are running against this server (dispatchers late)")
}
