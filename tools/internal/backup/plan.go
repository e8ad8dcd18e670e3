// Package backup takes and restores a backup of a jetflow deployment:
// a snapshot of each JetStream stream and KV bucket that holds the truth,
// through JetStream's stream snapshot and restore API, with a manifest
// that lets a restore check what it is given (docs/backup.md).
//
// This file holds the decisions, with no I/O: what is backed up, in which
// order and why, and whether a restore may go ahead. backup.go carries
// them out; snapshot.go speaks the JetStream API.
package backup

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
)

// Item is a stream of the topology (a KV bucket is its stream
// KV_<bucket>) and what a backup does with it.
type Item struct {
	// Stream is the JetStream stream.
	Stream string
	// Bucket is the KV bucket the stream holds, "" for a plain stream.
	Bucket string
	// Backup: the stream is in a backup. Otherwise it is safe to lose.
	Backup bool
	// Consumers: its durable consumers (their positions and pending
	// messages) are in the snapshot too, so in-flight work goes on where
	// it was.
	Consumers bool
	// Why it is (or is not) backed up, for the documentation and -v.
	Why string
}

func streamItem(name string, consumers bool, why string) Item {
	return Item{Stream: name, Backup: true, Consumers: consumers, Why: why}
}

func bucketItem(bucket string, why string) Item {
	return Item{Stream: bus.BucketStream(bucket), Bucket: bucket, Backup: true, Why: why}
}

// Plan lists every stream and bucket of the topology: first those a
// backup takes, in the order it takes them, then those it leaves out.
//
// Snapshots are per stream, each at its own instant, not one point in
// time. The order makes every gap between two snapshots look like a crash
// the system already recovers from: a message moves from the stream
// snapshotted first to the one snapshotted after it (commands to the
// inbox, tasks to results, everything into the events), so a message in
// transit is found twice (a duplicate, which every consumer recognises)
// and never missed. The work queues come before the events; the records
// an execution writes before its events (its id's claim, its locks) come
// after them, so every history in the backup has its claim. What the
// dispatcher publishes after an event (a task, a timer) may be missing
// for an event taken in the gap: that is the dispatcher stopped between
// its append and its publish, which the janitor's sweep repairs (a lost
// task is failed and retried, an overdue timer re-armed).
func Plan() []Item {
	return []Item{
		streamItem(bus.StreamCommands, true, "commands accepted and not yet checked (the intake's position is kept)"),
		streamItem(bus.StreamInbox, true, "commands checked and not yet applied by their partition's dispatcher"),
		streamItem(bus.StreamTimers, true, "durable timers: pending message schedules (sleeps, timeouts, retry backoff) and fired timers not yet handled"),
		streamItem(bus.StreamTasks, true, "operations queued for agents, and those delivered but not yet acknowledged (run again after the restore: at least once)"),
		streamItem(bus.StreamResults, true, "agents' reports not yet applied (and the last days' reports, which the janitor reads)"),
		streamItem(bus.StreamAdvisories, true, "max-deliveries advisories the janitor has not handled yet"),
		streamItem(bus.StreamEvents, false, "the executions' histories: the truth (its projector consumer is made anew by the bootstrap, which re-projects every read model)"),
		bucketItem(bus.BucketExecutionIDs, "every execution id ever claimed: ids stay unique forever"),
		bucketItem(bus.BucketLocks, "lock holders and waiters"),
		bucketItem(bus.BucketDefinitions, "workflow definitions, every version"),
		bucketItem(bus.BucketAPIKeys, "the api's keys (their hashes): callers keep their tokens"),
		streamItem(bus.StreamRejections, false, "why commands were rejected (an audit trail; clients read their verdicts there)"),
		{Stream: bus.BucketStream(bus.BucketExecutions), Bucket: bus.BucketExecutions,
			Why: "read models: rebuilt from the events by the projector (jetflow projections rebuild)"},
		{Stream: bus.BucketStream(bus.BucketDispatchers), Bucket: bus.BucketDispatchers,
			Why: "dispatchers' leases, which expire anyway; the number of partitions is in the manifest and restored"},
		{Stream: bus.StreamKills, Why: "kill notices for the agents running at the time, which a restore does not bring back"},
	}
}

// Format names a jetflow backup's manifest.
const Format = "jetflow-backup"

// FormatVersion is the version of the backup layout this jetflow writes
// and the highest it restores.
const FormatVersion = 1

// ManifestFile is the manifest's name in a backup directory. It is
// written last: a directory without it is not a finished backup.
const ManifestFile = "manifest.json"

// Manifest describes a backup.
type Manifest struct {
	Format        string `json:"format"`
	FormatVersion int    `json:"format_version"`
	// Jetflow is the version of the jetflow that took it.
	Jetflow string `json:"jetflow_version"`
	// SchemaVersion is the events' schema of that jetflow
	// (events.SchemaVersion): a jetflow reading an older one restores it.
	SchemaVersion int       `json:"schema_version"`
	StartedAt     time.Time `json:"started_at"`
	FinishedAt    time.Time `json:"finished_at"`
	// Partitions is the deployment's number of dispatcher partitions:
	// the results stream and the inbox are partitioned by it.
	Partitions int `json:"partitions"`
	// Streams are the snapshots, in the order they were taken (and are
	// restored).
	Streams []Snapshot `json:"streams"`
	// Skipped are the streams left out, with why they are safe to lose.
	Skipped []Skipped `json:"skipped"`
}

// Snapshot is one stream's snapshot in a backup.
type Snapshot struct {
	Stream string `json:"stream"`
	Bucket string `json:"bucket,omitempty"`
	// Dir is its directory, relative to the backup's.
	Dir       string `json:"dir"`
	Consumers bool   `json:"consumers"`
	// Messages, FirstSeq, LastSeq and Bytes are the stream's state when
	// the snapshot began: a restore must give the same.
	Messages uint64 `json:"messages"`
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	Bytes    uint64 `json:"bytes"`
	// ConsumerCount is how many durable consumers the snapshot holds.
	ConsumerCount int `json:"consumer_count"`
	// SnapshotBytes is the size of the data file.
	SnapshotBytes int64     `json:"snapshot_bytes"`
	TakenAt       time.Time `json:"taken_at"`
	TookMS        int64     `json:"took_ms"`
	// Config is the stream's configuration, as the server gave it (also
	// in the stream's backup.json, which the restore sends).
	Config json.RawMessage `json:"config,omitempty"`
}

// Skipped is a stream a backup leaves out.
type Skipped struct {
	Stream string `json:"stream"`
	Why    string `json:"why"`
}

// ErrNotBackup means the directory holds no finished jetflow backup.
var ErrNotBackup = errors.New("not a jetflow backup")

// ErrRefused means a restore would overwrite stored data, or cannot give
// back what the backup holds: nothing was changed.
var ErrRefused = errors.New("restore refused")

// ErrInTheWay is the refusal of a restore into streams that hold data
// (it wraps ErrRefused): a caller that can replace them says how.
var ErrInTheWay = fmt.Errorf("%w: the server already holds data", ErrRefused)

// ErrPartway is a restore that stopped after it changed the server: the
// streams restored so far are the backup's own. A caller says how to
// finish (jetflow admin restore: again with --replace).
var ErrPartway = errors.New("the restore stopped part-way")

// CheckManifest reports why a restore by this jetflow cannot use m.
func CheckManifest(m Manifest) error {
	switch {
	case m.Format != Format:
		return fmt.Errorf("%w: its %s says format %q", ErrNotBackup, ManifestFile, m.Format)
	case m.FormatVersion < 1 || m.FormatVersion > FormatVersion:
		return fmt.Errorf("%w: backup format %d; this jetflow restores format %d (use the jetflow that took it, %s, or a newer one)",
			ErrRefused, m.FormatVersion, FormatVersion, m.Jetflow)
	case m.SchemaVersion > events.SchemaVersion:
		return fmt.Errorf("%w: its events have schema %d, written by jetflow %s; this jetflow reads up to schema %d: restore with that version or a newer one",
			ErrRefused, m.SchemaVersion, m.Jetflow, events.SchemaVersion)
	case m.SchemaVersion < 1:
		return fmt.Errorf("%w: its %s has no schema version", ErrNotBackup, ManifestFile)
	case m.Partitions < 1:
		return fmt.Errorf("%w: its %s has no number of partitions", ErrNotBackup, ManifestFile)
	case len(m.Streams) == 0:
		return fmt.Errorf("%w: its %s lists no stream", ErrNotBackup, ManifestFile)
	}
	want := map[string]bool{}
	for _, it := range Plan() {
		if it.Backup {
			want[it.Stream] = true
		}
	}
	seen := map[string]bool{}
	for _, s := range m.Streams {
		switch {
		case !want[s.Stream]:
			return fmt.Errorf("%w: it holds stream %q, which is not one jetflow backs up", ErrRefused, s.Stream)
		case seen[s.Stream]:
			return fmt.Errorf("%w: it lists stream %s twice", ErrNotBackup, s.Stream)
		case s.Dir == "" || strings.ContainsAny(s.Dir, `/\`) || s.Dir == "." || s.Dir == "..":
			return fmt.Errorf("%w: stream %s has directory %q", ErrNotBackup, s.Stream, s.Dir)
		}
		seen[s.Stream] = true
	}
	if !seen[bus.StreamEvents] {
		return fmt.Errorf("%w: it holds no %s (the histories)", ErrRefused, bus.StreamEvents)
	}
	return nil
}

// Existing is what the target server holds of one stream.
type Existing struct {
	Stream   string
	Messages uint64
}

// Target is what a restore finds on the server before it changes anything.
type Target struct {
	// Streams that exist, of those the backup holds and the read models'.
	Streams []Existing
	// Partitions recorded in the dispatchers bucket (0: none recorded).
	Partitions int
	// Dispatchers are the members of the dispatchers bucket: the
	// dispatchers running against the server (a member's key lives a
	// second past its last renewal).
	Dispatchers []string
}

// RestorePlan is what a restore does before restoring the snapshots.
type RestorePlan struct {
	// Delete are streams to delete first: empty ones (made by a
	// bootstrap), and with Replace those that hold data, the read models
	// included (they are rebuilt from the restored events).
	Delete []Existing
}

// PlanRestore decides whether m may be restored onto t: never over stored
// data unless replace says so, and never into a deployment with another
// number of partitions. A refusal lists every stream in the way.
func PlanRestore(m Manifest, t Target, replace bool) (RestorePlan, error) {
	var p RestorePlan
	if len(t.Dispatchers) > 0 {
		return p, fmt.Errorf("%w: jetflow services are running against this server (dispatchers %s): stop every jetflow service, "+
			"then restore (jetflow dev --restore DIR restores before its services start)", ErrRefused, strings.Join(t.Dispatchers, ", "))
	}
	if t.Partitions != 0 && t.Partitions != m.Partitions {
		return p, fmt.Errorf("%w: the server's deployment has %d dispatcher partitions and the backup %d; restore into a new deployment (or one with %d)",
			ErrRefused, t.Partitions, m.Partitions, m.Partitions)
	}
	inBackup := map[string]bool{}
	for _, s := range m.Streams {
		inBackup[s.Stream] = true
	}
	readModels := bus.BucketStream(bus.BucketExecutions)
	var inTheWay []string
	for _, e := range t.Streams {
		if !inBackup[e.Stream] && e.Stream != readModels {
			continue
		}
		if e.Messages > 0 && !replace {
			inTheWay = append(inTheWay, fmt.Sprintf("%s (%d messages)", e.Stream, e.Messages))
			continue
		}
		p.Delete = append(p.Delete, e)
	}
	if len(inTheWay) > 0 {
		slices.Sort(inTheWay)
		return RestorePlan{}, fmt.Errorf("%w in %s; restore into an empty deployment",
			ErrInTheWay, strings.Join(inTheWay, ", "))
	}
	return p, nil
}
