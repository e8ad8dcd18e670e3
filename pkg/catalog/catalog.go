// Package catalog stores versioned workflow definitions in a KV bucket.
// Versions are immutable and numbered from 1; applying a definition equal
// to the latest version is a no-op. Keys: def.<name>.<version> holds a
// [Record]; latest.<name> names the latest version, the one a start by
// name takes: an apply moves it once the version is stored, and a version
// stored by an apply that stopped before that is the next apply's to
// complete (or to count), not a reader's.
package catalog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/startcheck"
	"jetflow.dev/pkg/workflow"
)

// ErrNotFound means no such workflow or version.
var ErrNotFound = errors.New("catalog: workflow not found")

// ErrVersionTaken means a definition names a version that holds another
// definition.
var ErrVersionTaken = errors.New("catalog: version already holds another definition")

// ErrNoVersionLeft means a definition names no version and the workflow
// holds workflow.MaxVersion: the registry numbers past the highest
// version, and there is none past it.
var ErrNoVersionLeft = errors.New("catalog: the workflow holds the highest version number")

// Record is one stored version.
type Record struct {
	Name       string              `json:"name"`
	Version    int                 `json:"version"`
	Digest     string              `json:"digest"`
	CreatedAt  time.Time           `json:"created_at"`
	Definition workflow.Definition `json:"definition"`
}

// Store is the definitions bucket.
type Store struct {
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	now func() time.Time
	// stored keeps version records as read (each Get decodes its own copy:
	// callers may change what they get): one read of a version is enough.
	stored versionCache[[]byte]
	// prepared keeps the versions starts were checked against, prepared
	// and shared (StartDefinition).
	prepared versionCache[*startcheck.Definition]
	// lone says whether the bucket's stream is alone (loneStream), as
	// last checked (alone): asked is when the check began that found one,
	// checked when the last check began.
	lone struct {
		sync.Mutex
		checked, asked time.Time
		one            bool
	}
}

// loneCheckEvery is how often a Store asks the bucket's stream whether it
// is alone (alone); a finding that it is counts for twice that at most.
const loneCheckEvery = time.Second

// cacheBytes and cacheEntries bound what each of a Store's caches keeps:
// far more than the workflow versions started at once.
const (
	cacheBytes   = 8 << 20
	cacheEntries = 512
)

// versionCache keeps values by version key. A version is created once and
// never changed, so what is kept is right for ever; when full (past
// cacheEntries, or cacheBytes by size) it forgets what it held first (a
// version is read again at its next start), and a value over a quarter of
// cacheBytes is not kept.
type versionCache[V any] struct {
	size func(V) int

	mu    sync.Mutex
	kept  map[string]V
	bytes int
}

func (c *versionCache[V]) get(key string) (V, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.kept[key]
	return v, ok
}

// put keeps v under key, unless a value is kept there already, and
// returns the one kept (v when none is).
func (c *versionCache[V]) put(key string, v V) V {
	n := c.size(v)
	if n > cacheBytes/4 {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if kept, ok := c.kept[key]; ok {
		return kept
	}
	if c.kept == nil || len(c.kept) >= cacheEntries || c.bytes+n > cacheBytes {
		c.kept, c.bytes = map[string]V{}, 0
	}
	c.kept[key], c.bytes = v, c.bytes+n
	return v
}

// Open binds to the definitions bucket (created by bus.Ensure).
func Open(ctx context.Context, js jetstream.JetStream) (*Store, error) {
	kv, err := js.KeyValue(ctx, bus.BucketDefinitions)
	if err != nil {
		return nil, fmt.Errorf("open definitions bucket: %w", err)
	}
	return &Store{js: js, kv: kv, now: time.Now,
		stored:   versionCache[[]byte]{size: func(b []byte) int { return len(b) }},
		prepared: versionCache[*startcheck.Definition]{size: (*startcheck.Definition).Size}}, nil
}

func defKey(name string, v int) string { return "def." + name + "." + strconv.Itoa(v) }
func latestKey(name string) string     { return "latest." + name }

// Apply stores d as a new version unless it equals the latest one. It
// returns the version that holds d and whether it was created.
func (s *Store) Apply(ctx context.Context, d workflow.Definition) (Record, bool, error) {
	if err := d.Validate(); err != nil {
		return Record{}, false, err
	}
	digest, err := d.Digest()
	if err != nil {
		return Record{}, false, fmt.Errorf("digest definition: %w", err)
	}
	if d.Version > 0 {
		return s.applyVersion(ctx, d, digest)
	}
	for range 20 {
		at, cur, stopped, err := s.current(ctx, d.Name)
		switch {
		case err != nil:
			return Record{}, false, err
		case stopped.Version > 0 && stopped.Digest == digest:
			// An apply of d that stopped before the pointer: complete it.
			if err := s.advanceLatest(ctx, d.Name, stopped.Version); err != nil {
				return Record{}, false, err
			}
			return stopped, false, nil
		case cur.Version > 0 && cur.Digest == digest:
			return cur, false, nil
		}
		// The next number, past a stopped apply's version (which stays
		// readable by its number, and never becomes the latest).
		last := max(at, stopped.Version)
		if last >= workflow.MaxVersion {
			return Record{}, false, fmt.Errorf("%w: %s version %d", ErrNoVersionLeft, d.Name, last)
		}
		rec := Record{Name: d.Name, Version: last + 1, Digest: digest, CreatedAt: s.now().UTC(), Definition: d}
		b, err := json.Marshal(rec)
		if err != nil {
			return Record{}, false, fmt.Errorf("encode definition: %w", err)
		}
		if _, err := s.kv.Create(ctx, defKey(d.Name, rec.Version), b); err != nil {
			if bus.KeyChanged(err) {
				continue // another apply won the race for this number; look again
			}
			return Record{}, false, fmt.Errorf("store definition %s v%d: %w", d.Name, rec.Version, err)
		}
		if err := s.advanceLatest(ctx, d.Name, rec.Version); err != nil {
			return Record{}, false, err
		}
		return rec, true, nil
	}
	return Record{}, false, fmt.Errorf("store definition %s: too much contention", d.Name)
}

// applyVersion stores d under the version it names, once: the same
// definition again is unchanged, another one is refused.
func (s *Store) applyVersion(ctx context.Context, d workflow.Definition, digest string) (Record, bool, error) {
	rec := Record{Name: d.Name, Version: d.Version, Digest: digest, CreatedAt: s.now().UTC(), Definition: d}
	b, err := json.Marshal(rec)
	if err != nil {
		return Record{}, false, fmt.Errorf("encode definition: %w", err)
	}
	if _, err := s.kv.Create(ctx, defKey(d.Name, d.Version), b); err != nil {
		if !bus.KeyChanged(err) {
			return Record{}, false, fmt.Errorf("store definition %s v%d: %w", d.Name, d.Version, err)
		}
		existing, err := s.get(ctx, d.Name, d.Version)
		if err != nil {
			return Record{}, false, err
		}
		if existing.Digest != digest {
			return existing, false, fmt.Errorf("%w: %s version %d", ErrVersionTaken, d.Name, d.Version)
		}
		// The same definition: its apply may have stopped before the
		// pointer; moving it (forward only) completes that apply.
		if err := s.advanceLatest(ctx, d.Name, d.Version); err != nil {
			return Record{}, false, err
		}
		return existing, false, nil
	}
	if err := s.advanceLatest(ctx, d.Name, d.Version); err != nil {
		return Record{}, false, err
	}
	return rec, true, nil
}

// advanceLatest moves the latest pointer forward to v with compare-and-set.
func (s *Store) advanceLatest(ctx context.Context, name string, v int) error {
	for range 20 {
		// From the leader: a replica's older value or revision would only
		// lose the compare-and-set.
		b, rev, err := bus.LeaderKVGet(ctx, s.js, bus.BucketDefinitions, latestKey(name))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			if _, err = s.kv.Create(ctx, latestKey(name), []byte(strconv.Itoa(v))); err == nil || !bus.KeyChanged(err) {
				return wrap(err, "create latest pointer")
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("read latest pointer: %w", err)
		}
		if cur, _ := strconv.Atoi(string(b)); cur >= v {
			return nil
		}
		if _, err = s.kv.Update(ctx, latestKey(name), []byte(strconv.Itoa(v)), rev); err == nil || !bus.KeyChanged(err) {
			return wrap(err, "update latest pointer")
		}
	}
	return fmt.Errorf("update latest pointer of %s: too much contention", name)
}

func wrap(err error, msg string) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", msg, err)
}

// Get returns a version of a workflow; version 0 means the latest: the
// version the latest pointer names. A version is live once its apply has
// moved the pointer to it: one stored by an apply that stopped before
// that (a crash in between; the apply returned an error) is not started
// by a name alone until an apply of the workflow completes it (Apply
// looks past the pointer, and moves it). So a start's look-up is the
// pointer's read, and the version's record (read once per process).
func (s *Store) Get(ctx context.Context, name string, version int) (Record, error) {
	if !events.ValidWorkflowName(name) {
		return Record{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if version > 0 {
		return s.get(ctx, name, version)
	}
	v, err := s.pointer(ctx, name)
	if err != nil {
		return Record{}, err
	}
	if v == 0 {
		return Record{}, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return s.get(ctx, name, v)
}

// Resolve returns the version a start of name with version means: version
// itself when it is given (whether it is registered is Get's to say), else
// the latest, read as Get reads it. ErrNotFound: no workflow name.
func (s *Store) Resolve(ctx context.Context, name string, version int) (int, error) {
	if !events.ValidWorkflowName(name) {
		return 0, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	if version > 0 {
		return version, nil
	}
	v, err := s.pointer(ctx, name)
	if err != nil {
		return 0, err
	}
	if v == 0 {
		return 0, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	return v, nil
}

// StartDefinition returns the definition a start of name names (version
// 0: the latest, read as Get reads it, at each call) prepared for
// startcheck.Check: each version is decoded and prepared once, then kept
// (a version never changes), so that a start does not decode its
// version's record and encode its canonical form each time. The result is
// shared: never change it. ErrNotFound: no such workflow or version.
func (s *Store) StartDefinition(ctx context.Context, name string, version int) (*startcheck.Definition, error) {
	v, err := s.Resolve(ctx, name, version)
	if err != nil {
		return nil, err
	}
	k := defKey(name, v)
	if d, ok := s.prepared.get(k); ok {
		return d, nil
	}
	rec, err := s.get(ctx, name, v)
	if err != nil {
		return nil, err
	}
	d, err := startcheck.Prepare(rec.Name, rec.Version, rec.Definition)
	if err != nil { // left to each Check to say, after the start's own problems
		return &startcheck.Definition{Name: rec.Name, Version: rec.Version, Spec: rec.Definition}, nil
	}
	return s.prepared.put(k, d), nil
}

// pointer returns the version the latest pointer of name names, 0 for
// none.
func (s *Store) pointer(ctx context.Context, name string) (int, error) {
	// From the leader: a replica behind it may hold an older pointer,
	// and a start right after an apply would run the version before. A
	// bucket of one replica is its own leader: a direct get says the
	// same, without the JetStream API's request (the server decodes the
	// requester's information for each; priced at 4% of a 10-step local
	// execution's CPU, docs/benchmarks.md).
	var b []byte
	var err error
	if s.alone(ctx) {
		var e jetstream.KeyValueEntry
		if e, err = s.kv.Get(ctx, latestKey(name)); err == nil {
			b = e.Value()
		}
	} else {
		b, _, err = bus.LeaderKVGet(ctx, s.js, bus.BucketDefinitions, latestKey(name))
	}
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("read latest pointer: %w", err)
	}
	v, _ := strconv.Atoi(string(b))
	return v, nil
}

// alone reports whether the bucket's stream is alone (loneStream), asked
// of the stream at most every loneCheckEvery, one asker at a time (the
// others go on with what was found). A finding that it is alone counts for
// 2×loneCheckEvery from when it was asked, then reads go to the leader
// until a check says so again; an answer older than the last one kept is
// dropped; when it cannot tell, it says no.
func (s *Store) alone(ctx context.Context) bool {
	now := s.now()
	s.lone.Lock()
	one := s.lone.one && now.Sub(s.lone.asked) < 2*loneCheckEvery
	due := now.Sub(s.lone.checked) >= loneCheckEvery
	if due {
		s.lone.checked = now
	}
	s.lone.Unlock()
	if !due {
		return one
	}
	stream, err := s.js.Stream(ctx, bus.BucketStream(bus.BucketDefinitions))
	found := err == nil && loneStream(stream.CachedInfo())
	s.lone.Lock()
	defer s.lone.Unlock()
	if !now.Before(s.lone.asked) { // not older than the answer kept
		s.lone.one, s.lone.asked = found, now
	}
	return found
}

// loneStream reports whether a direct get of the stream info describes
// can be answered only by its leader: a stream of one replica on a server
// that is in no cluster. A clustered stream said to have one replica may
// still have followers answering direct gets while it is scaled down or
// moved (the configuration changes first, the peers leave later).
func loneStream(info *jetstream.StreamInfo) bool {
	if info == nil || info.Config.Replicas > 1 {
		return false
	}
	c := info.Cluster
	return c == nil || (c.Name == "" && c.RaftGroup == "" && len(c.Replicas) == 0)
}

// read reads a version's record. In a cluster a read may be answered by
// a replica that has not stored the latest writes yet: a workflow applied
// a moment ago was "not registered" to the start that followed. A record
// a replica says is missing is asked of the leader, which has every
// acknowledged write; one found is as good from any replica (a version
// never changes). The latest pointer, which does change, is always read
// from the leader (pointer).
func (s *Store) read(ctx context.Context, key string) ([]byte, error) {
	e, err := s.kv.Get(ctx, key)
	if err == nil {
		return e.Value(), nil
	}
	if !errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, err
	}
	b, _, err := bus.LeaderKVGet(ctx, s.js, bus.BucketDefinitions, key)
	return b, err
}

// current returns, for Apply, the version the pointer of name names (at,
// 0 for none) and its record (cur; a zero Record if it cannot be found),
// and the newest version stored after it by an apply that stopped before
// moving the pointer (stopped; a zero Record for none).
func (s *Store) current(ctx context.Context, name string) (at int, cur, stopped Record, err error) {
	at, err = s.pointer(ctx, name)
	if err != nil {
		return 0, Record{}, Record{}, err
	}
	if at > 0 {
		if cur, err = s.get(ctx, name, at); err != nil && !errors.Is(err, ErrNotFound) {
			return 0, Record{}, Record{}, err
		}
	}
	for v := at; ; v++ {
		next, err := s.get(ctx, name, v+1)
		if errors.Is(err, ErrNotFound) {
			return at, cur, stopped, nil
		}
		if err != nil {
			return 0, Record{}, Record{}, err
		}
		stopped = next
	}
}

func (s *Store) get(ctx context.Context, name string, v int) (Record, error) {
	k := defKey(name, v)
	raw, cached := s.stored.get(k)
	if !cached {
		b, err := s.read(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return Record{}, fmt.Errorf("%w: %s version %d", ErrNotFound, name, v)
		}
		if err != nil {
			return Record{}, fmt.Errorf("read definition %s v%d: %w", name, v, err)
		}
		raw = b
	}
	var rec Record
	if err := json.Unmarshal(raw, &rec); err != nil {
		return Record{}, fmt.Errorf("decode definition %s v%d: %w", name, v, err)
	}
	if !cached {
		s.stored.put(k, raw) // only a record that decodes
	}
	return rec, nil
}

// Summary describes a workflow in listings.
type Summary struct {
	Name          string    `json:"name"`
	LatestVersion int       `json:"latest_version"`
	Description   string    `json:"description,omitempty"`
	UpdatedAt     time.Time `json:"updated_at"`
}

// List returns every workflow's latest version, sorted by name.
func (s *Store) List(ctx context.Context) ([]Summary, error) {
	lister, err := s.kv.ListKeysFiltered(ctx, "latest.*")
	if err != nil {
		return nil, fmt.Errorf("list workflows: %w", err)
	}
	var out []Summary
	for k := range lister.Keys() {
		name := strings.TrimPrefix(k, "latest.")
		rec, err := s.Get(ctx, name, 0)
		if err != nil {
			continue // deleted or racing; listing is best effort
		}
		out = append(out, Summary{Name: name, LatestVersion: rec.Version, Description: rec.Definition.Description, UpdatedAt: rec.CreatedAt})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Versions returns every stored version of a workflow, oldest first
// (versions need not start at 1 nor follow each other: a definition may
// name its version).
func (s *Store) Versions(ctx context.Context, name string) ([]Record, error) {
	if !events.ValidWorkflowName(name) {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	lister, err := s.kv.ListKeysFiltered(ctx, "def."+name+".*")
	if err != nil {
		return nil, fmt.Errorf("list versions of %s: %w", name, err)
	}
	var nums []int
	for k := range lister.Keys() {
		if v, err := strconv.Atoi(strings.TrimPrefix(k, "def."+name+".")); err == nil {
			nums = append(nums, v)
		}
	}
	if len(nums) == 0 {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, name)
	}
	sort.Ints(nums)
	out := make([]Record, 0, len(nums))
	for _, v := range nums {
		rec, err := s.get(ctx, name, v)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}

// Settings are system-wide values that services other than their owner
// show (not configuration: each service keeps its own), kept beside the
// definitions under setting.<name>.
const (
	// SettingRetentionDefault is the janitor's system retention rule.
	SettingRetentionDefault = "retention-default"
)

func settingKey(name string) string { return "setting." + name }

// PutSetting records a setting's value (a no-op when it has it already).
func (s *Store) PutSetting(ctx context.Context, name, value string) error {
	if e, err := s.kv.Get(ctx, settingKey(name)); err == nil && string(e.Value()) == value {
		return nil
	}
	if _, err := s.kv.Put(ctx, settingKey(name), []byte(value)); err != nil {
		return fmt.Errorf("record setting %s: %w", name, err)
	}
	return nil
}

// Setting returns a setting's value, and false if it was never recorded.
func (s *Store) Setting(ctx context.Context, name string) (string, bool, error) {
	e, err := s.kv.Get(ctx, settingKey(name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("read setting %s: %w", name, err)
	}
	return string(e.Value()), true, nil
}
