package catalog_test

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/workflow"
)

type testBundle struct {
	js    jetstream.JetStream
	store *catalog.Store
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	store, err := catalog.Open(t.Context(), js)
	require.NoError(t, err)
	return &testBundle{js: js, store: store}
}

func def(name, message string) workflow.Definition {
	return workflow.Definition{Name: name, Description: "says " + message, Steps: []workflow.Step{
		{ID: "hello", Kind: workflow.KindLog, Message: message},
		{ID: "done", Kind: workflow.KindNoop},
	}}
}

func digest(t *testing.T, d workflow.Definition) string {
	t.Helper()
	s, err := d.Digest()
	require.NoError(t, err)
	return s
}

func TestApplyAndGet(t *testing.T) {
	t.Parallel()

	bundle := setup(t)
	ctx := t.Context()
	v1def, v2def := def("greet", "hi"), def("greet", "hello")

	rec1, created, err := bundle.store.Apply(ctx, v1def)
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, 1, rec1.Version)
	require.Equal(t, "greet", rec1.Name)
	require.Equal(t, digest(t, v1def), rec1.Digest)
	require.Equal(t, v1def, rec1.Definition)
	require.False(t, rec1.CreatedAt.IsZero())

	t.Log("applying the same definition again changes nothing")
	again, created, err := bundle.store.Apply(ctx, v1def)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, 1, again.Version)
	require.True(t, rec1.CreatedAt.Equal(again.CreatedAt))

	t.Log("a changed definition is a new version")
	rec2, created, err := bundle.store.Apply(ctx, v2def)
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, 2, rec2.Version)
	require.NotEqual(t, rec1.Digest, rec2.Digest)

	latest, err := bundle.store.Get(ctx, "greet", 0)
	require.NoError(t, err)
	require.Equal(t, 2, latest.Version)
	require.Equal(t, v2def, latest.Definition)

	old, err := bundle.store.Get(ctx, "greet", 1)
	require.NoError(t, err)
	require.Equal(t, 1, old.Version)
	require.Equal(t, v1def, old.Definition)
	require.Equal(t, rec1.Digest, old.Digest)

	_, err = bundle.store.Get(ctx, "greet", 3)
	require.ErrorIs(t, err, catalog.ErrNotFound)

	t.Log("going back to old content is a new version, not a rollback of the number")
	rec3, created, err := bundle.store.Apply(ctx, v1def)
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, 3, rec3.Version)
	require.Equal(t, rec1.Digest, rec3.Digest)

	versions, err := bundle.store.Versions(ctx, "greet")
	require.NoError(t, err)
	require.Len(t, versions, 3)
	for i, r := range versions {
		require.Equal(t, i+1, r.Version)
	}
	require.Equal(t, []string{rec1.Digest, rec2.Digest, rec1.Digest},
		[]string{versions[0].Digest, versions[1].Digest, versions[2].Digest})
}

func TestGetUnknown(t *testing.T) {
	t.Parallel()

	bundle := setup(t)
	ctx := t.Context()
	_, _, err := bundle.store.Apply(ctx, def("known", "x"))
	require.NoError(t, err)

	for _, tt := range []struct {
		name     string
		workflow string
		version  int
	}{
		{"UnknownName", "unknown", 0},
		{"UnknownNameVersion", "unknown", 1},
		{"UnknownVersion", "known", 2},
		{"InvalidName", "not.a.name", 0},
		{"EmptyName", "", 0},
		{"WildcardName", "*", 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			_, err := bundle.store.Get(ctx, tt.workflow, tt.version)
			require.ErrorIs(t, err, catalog.ErrNotFound)
		})
	}

	_, err = bundle.store.Versions(ctx, "unknown")
	require.ErrorIs(t, err, catalog.ErrNotFound)
}

// TestResolve: a start's version is the one it gives, else the latest
// as it moves; a workflow never applied is not found.
func TestResolve(t *testing.T) {
	t.Parallel()
	bundle := setup(t)
	ctx := t.Context()
	_, _, err := bundle.store.Apply(ctx, def("moving", "one"))
	require.NoError(t, err)
	v, err := bundle.store.Resolve(ctx, "moving", 0)
	require.NoError(t, err)
	require.Equal(t, 1, v)
	_, _, err = bundle.store.Apply(ctx, def("moving", "two"))
	require.NoError(t, err)
	v, err = bundle.store.Resolve(ctx, "moving", 0)
	require.NoError(t, err)
	require.Equal(t, 2, v, "the latest, read again")
	v, err = bundle.store.Resolve(ctx, "moving", 1)
	require.NoError(t, err)
	require.Equal(t, 1, v, "the version given")
	for _, name := range []string{"unknown", "not.a.name", ""} {
		_, err := bundle.store.Resolve(ctx, name, 0)
		require.ErrorIs(t, err, catalog.ErrNotFound, name)
	}
}

// TestStartDefinition: a start's version is read and prepared once and
// kept for the next starts; a start without a version follows the latest
// as it moves; a version or workflow not registered is not found.
func TestStartDefinition(t *testing.T) {
	t.Parallel()
	bundle := setup(t)
	ctx := t.Context()
	_, _, err := bundle.store.Apply(ctx, def("greet", "one"))
	require.NoError(t, err)
	first, err := bundle.store.StartDefinition(ctx, "greet", 0)
	require.NoError(t, err)
	require.Equal(t, 1, first.Version)
	require.Equal(t, "one", first.Spec.Steps[0].Message)
	again, err := bundle.store.StartDefinition(ctx, "greet", 1)
	require.NoError(t, err)
	require.Same(t, first, again, "kept")

	_, _, err = bundle.store.Apply(ctx, def("greet", "two"))
	require.NoError(t, err)
	latest, err := bundle.store.StartDefinition(ctx, "greet", 0)
	require.NoError(t, err)
	require.Equal(t, 2, latest.Version, "the latest, read again")
	require.Equal(t, "two", latest.Spec.Steps[0].Message)
	older, err := bundle.store.StartDefinition(ctx, "greet", 1)
	require.NoError(t, err)
	require.Same(t, first, older, "the version given")

	for _, c := range []struct {
		name    string
		version int
	}{{"greet", 3}, {"unknown", 0}, {"unknown", 1}, {"not.a.name", 0}} {
		_, err := bundle.store.StartDefinition(ctx, c.name, c.version)
		require.ErrorIs(t, err, catalog.ErrNotFound, "%s v%d", c.name, c.version)
	}
}

// TestStartDefinitionConcurrently: starts of several versions checked at
// once, some of them changing the steps of what they got, share each
// version's prepared definition safely.
func TestStartDefinitionConcurrently(t *testing.T) {
	t.Parallel()
	bundle := setup(t)
	ctx := t.Context()
	for _, m := range []string{"one", "two", "three"} {
		_, _, err := bundle.store.Apply(ctx, def("many", m))
		require.NoError(t, err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				v := (g+i)%3 + 1
				d, err := bundle.store.StartDefinition(ctx, "many", v)
				if !assert.NoError(t, err) || !assert.Equal(t, v, d.Version) {
					return
				}
				assert.Equal(t, []string{"one", "two", "three"}[v-1], d.Spec.Steps[0].Message)
			}
		})
	}
	wg.Wait()
}

func TestApplyInvalid(t *testing.T) {
	t.Parallel()

	bundle := setup(t)
	ctx := t.Context()

	for _, d := range []workflow.Definition{
		{Name: "broken", Steps: []workflow.Step{{ID: "a", Kind: "warp"}}},
		{Name: "broken", Steps: []workflow.Step{{ID: "a", Kind: workflow.KindHTTP, URL: "https://x.test", Body: math.NaN()}}},
	} {
		_, created, err := bundle.store.Apply(ctx, d)
		require.ErrorIs(t, err, workflow.ErrInvalid)
		require.False(t, created)
	}

	_, err := bundle.store.Get(ctx, "broken", 0)
	require.ErrorIs(t, err, catalog.ErrNotFound)
}

func TestApplyConcurrent(t *testing.T) {
	t.Parallel()

	bundle := setup(t)
	ctx := t.Context()

	const n = 5
	defs := make([]workflow.Definition, n)
	for i := range defs {
		defs[i] = def("racy", fmt.Sprintf("message %d", i))
	}
	recs := make([]catalog.Record, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range defs {
		wg.Go(func() {
			<-start
			var created bool
			recs[i], created, errs[i] = bundle.store.Apply(ctx, defs[i])
			if errs[i] == nil && !created {
				errs[i] = fmt.Errorf("apply %d created nothing", i)
			}
		})
	}
	close(start)
	wg.Wait()

	var versions []int
	for i := range defs {
		require.NoError(t, errs[i])
		require.Equal(t, digest(t, defs[i]), recs[i].Digest)
		versions = append(versions, recs[i].Version)
	}
	slices.Sort(versions)
	require.Equal(t, []int{1, 2, 3, 4, 5}, versions)

	stored, err := bundle.store.Versions(ctx, "racy")
	require.NoError(t, err)
	require.Len(t, stored, n)
	for i, r := range stored {
		require.Equal(t, i+1, r.Version)
		owner := slices.IndexFunc(recs, func(x catalog.Record) bool { return x.Version == r.Version })
		require.GreaterOrEqual(t, owner, 0)
		require.Equal(t, defs[owner], r.Definition, "version %d holds what its Apply returned", r.Version)
	}

	latest, err := bundle.store.Get(ctx, "racy", 0)
	require.NoError(t, err)
	require.Equal(t, n, latest.Version)
}

// TestAVersionIsLiveOnceItsApplyMovesThePointer: a version stored by an
// apply that stopped before moving the latest pointer (a crash between
// the two writes) is not what a start by name gets: the apply did not
// complete. It can be read by its number, and the next apply of the
// workflow completes it (the same definition: it is the latest now) or
// counts it (another: the next number).
func TestAVersionIsLiveOnceItsApplyMovesThePointer(t *testing.T) {
	t.Parallel()

	bundle := setup(t)
	ctx := t.Context()
	kv, err := bundle.js.KeyValue(ctx, bus.BucketDefinitions)
	require.NoError(t, err)
	pointer := func(name string) string {
		t.Helper()
		ptr, err := kv.Get(ctx, "latest."+name)
		require.NoError(t, err)
		return string(ptr.Value())
	}
	// stopped stores version v of name as an apply does, and stops before
	// the pointer.
	stopped := func(d workflow.Definition, v int) {
		t.Helper()
		b, err := json.Marshal(catalog.Record{Name: d.Name, Version: v, Digest: digest(t, d), Definition: d})
		require.NoError(t, err)
		_, err = kv.Create(ctx, fmt.Sprintf("def.%s.%d", d.Name, v), b)
		require.NoError(t, err)
	}

	_, _, err = bundle.store.Apply(ctx, def("lag", "one"))
	require.NoError(t, err)
	v2 := def("lag", "two")
	stopped(v2, 2)
	latest, err := bundle.store.Get(ctx, "lag", 0)
	require.NoError(t, err)
	require.Equal(t, 1, latest.Version, "the stopped apply's version is not started by name")
	rec, err := bundle.store.Get(ctx, "lag", 2)
	require.NoError(t, err)
	require.Equal(t, "says two", rec.Definition.Description, "it is read by its number")

	rec, created, err := bundle.store.Apply(ctx, v2)
	require.NoError(t, err)
	require.False(t, created, "v2 already holds this definition")
	require.Equal(t, 2, rec.Version)
	require.Equal(t, "2", pointer("lag"), "the apply again completes it")
	latest, err = bundle.store.Get(ctx, "lag", 0)
	require.NoError(t, err)
	require.Equal(t, 2, latest.Version)

	// Another definition after a stopped apply: the stopped version counts,
	// and is never the latest, not even for a moment.
	watch, err := kv.Watch(ctx, "latest.lag", jetstream.UpdatesOnly())
	require.NoError(t, err)
	defer func() { _ = watch.Stop() }()
	stopped(def("lag", "three"), 3)
	rec, created, err = bundle.store.Apply(ctx, def("lag", "two"))
	require.NoError(t, err)
	require.False(t, created, "the latest holds it: the stopped apply of another is left")
	require.Equal(t, 2, rec.Version)
	rec, created, err = bundle.store.Apply(ctx, def("lag", "four"))
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, 4, rec.Version)
	require.Equal(t, "4", pointer("lag"))
	var named []string
	for len(named) == 0 || named[len(named)-1] != "4" {
		select {
		case e := <-watch.Updates():
			require.NotNil(t, e)
			named = append(named, string(e.Value()))
		case <-time.After(30 * time.Second):
			require.FailNow(t, "the pointer's move to 4 was not seen", "%v", named)
		}
	}
	require.Equal(t, []string{"4"}, named, "the pointer never named the stopped version 3")

	// A pinned version (version: N) whose apply stopped before the pointer:
	// the same file again completes it.
	pinned := def("lag", "five")
	pinned.Version = 7
	stopped(pinned, 7)
	require.Equal(t, "4", pointer("lag"))
	rec, created, err = bundle.store.Apply(ctx, pinned)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, 7, rec.Version)
	require.Equal(t, "7", pointer("lag"), "the pinned apply again completes it")

	// A first apply that stopped before the pointer was made.
	stopped(def("fresh", "one"), 1)
	_, err = bundle.store.Get(ctx, "fresh", 0)
	require.ErrorIs(t, err, catalog.ErrNotFound, "no apply of fresh completed")
	rec, created, err = bundle.store.Apply(ctx, def("fresh", "one"))
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, 1, rec.Version)
	require.Equal(t, "1", pointer("fresh"))
}

func TestList(t *testing.T) {
	t.Parallel()

	bundle := setup(t)
	ctx := t.Context()

	list, err := bundle.store.List(ctx)
	require.NoError(t, err)
	require.Empty(t, list)

	for _, d := range []workflow.Definition{def("zeta", "1"), def("alpha", "1"), def("alpha", "2"), def("mid", "1")} {
		_, _, err := bundle.store.Apply(ctx, d)
		require.NoError(t, err)
	}

	list, err = bundle.store.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 3)
	var names []string
	for _, s := range list {
		names = append(names, s.Name)
	}
	require.Equal(t, []string{"alpha", "mid", "zeta"}, names)
	require.Equal(t, 2, list[0].LatestVersion)
	require.Equal(t, "says 2", list[0].Description)
	require.False(t, list[0].UpdatedAt.IsZero())
	require.Equal(t, 1, list[1].LatestVersion)
	require.Equal(t, 1, list[2].LatestVersion)
}

// TestApplyExplicitVersion: a definition that names its version is stored
// under it once; the same content again is unchanged, other content is
// refused and changes nothing; the latest pointer follows the highest.
func TestApplyExplicitVersion(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	s, err := catalog.Open(t.Context(), js)
	require.NoError(t, err)
	def := func(v int, id string) workflow.Definition {
		return workflow.Definition{Name: "pinned", Version: v, Steps: []workflow.Step{{ID: id, Kind: workflow.KindNoop}}}
	}
	rec, created, err := s.Apply(t.Context(), def(7, "a"))
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, 7, rec.Version)
	_, created, err = s.Apply(t.Context(), def(7, "a"))
	require.NoError(t, err)
	require.False(t, created)
	_, _, err = s.Apply(t.Context(), def(7, "other"))
	require.ErrorIs(t, err, catalog.ErrVersionTaken)
	got, err := s.Get(t.Context(), "pinned", 7)
	require.NoError(t, err)
	require.Equal(t, "a", got.Definition.Steps[0].ID, "a refused apply changes nothing")
	latest, err := s.Get(t.Context(), "pinned", 0)
	require.NoError(t, err)
	require.Equal(t, 7, latest.Version)
	// Without a version the registry goes on from the latest.
	rec, created, err = s.Apply(t.Context(), workflow.Definition{Name: "pinned", Steps: []workflow.Step{{ID: "b", Kind: workflow.KindNoop}}})
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, 8, rec.Version)

	// At the highest version, the registry has no number left: it says
	// so, stores nothing, and a version given still goes in.
	_, _, err = s.Apply(t.Context(), def(workflow.MaxVersion, "top"))
	require.NoError(t, err)
	_, _, err = s.Apply(t.Context(), workflow.Definition{Name: "pinned", Steps: []workflow.Step{{ID: "c", Kind: workflow.KindNoop}}})
	require.ErrorIs(t, err, catalog.ErrNoVersionLeft)
	versions, err := s.Versions(t.Context(), "pinned")
	require.NoError(t, err)
	require.Len(t, versions, 3, "7, 8 and the highest")
	latest, err = s.Get(t.Context(), "pinned", 0)
	require.NoError(t, err)
	require.Equal(t, workflow.MaxVersion, latest.Version)
	rec, created, err = s.Apply(t.Context(), def(9, "c"))
	require.NoError(t, err)
	require.True(t, created)
	require.Equal(t, 9, rec.Version)
}

// TestAVersionReadOnceIsKept: versions are created once and never
// changed, so a store keeps a record it has read, and serves every later
// read of it from memory (a start reads its workflow's record every
// time); each read gets its own copy; a version not stored yet is read
// again until it is; the latest pointer is always read.
func TestAVersionReadOnceIsKept(t *testing.T) {
	t.Parallel()
	bundle := setup(t)
	ctx := t.Context()
	_, _, err := bundle.store.Apply(ctx, def("kept", "one"))
	require.NoError(t, err)
	first, err := bundle.store.Get(ctx, "kept", 1)
	require.NoError(t, err)
	first.Definition.Steps[0].Message = "changed by a caller"

	// Taken away behind the store's back (never done by jetflow): this
	// store still has it, another store does not.
	kv, err := bundle.js.KeyValue(ctx, bus.BucketDefinitions)
	require.NoError(t, err)
	require.NoError(t, kv.Purge(ctx, "def.kept.1"))
	again, err := bundle.store.Get(ctx, "kept", 1)
	require.NoError(t, err)
	require.Equal(t, "one", again.Definition.Steps[0].Message, "a copy of its own")
	other, err := catalog.Open(ctx, bundle.js)
	require.NoError(t, err)
	_, err = other.Get(ctx, "kept", 1)
	require.ErrorIs(t, err, catalog.ErrNotFound)

	_, err = bundle.store.Get(ctx, "kept", 2)
	require.ErrorIs(t, err, catalog.ErrNotFound)
	_, created, err := bundle.store.Apply(ctx, def("kept", "two"))
	require.NoError(t, err)
	require.True(t, created)
	latest, err := bundle.store.Get(ctx, "kept", 0)
	require.NoError(t, err)
	require.Equal(t, 2, latest.Version, "a miss is not kept, and the latest pointer is read again")
	require.Equal(t, "two", latest.Definition.Steps[0].Message)
}

// BenchmarkGetLatest is a start's read of its workflow's latest version
// (the pointer) once the version's record is kept: what a start waits
// for.
func BenchmarkGetLatest(b *testing.B) {
	_, js := natstest.Connect(b, natstest.RunJetStream(b))
	store, err := catalog.Open(b.Context(), js)
	require.NoError(b, err)
	_, _, err = store.Apply(b.Context(), def("bench", "one"))
	require.NoError(b, err)
	for b.Loop() {
		rec, err := store.Get(b.Context(), "bench", 0)
		if err != nil || rec.Version != 1 {
			b.Fatalf("%+v, %v", rec, err)
		}
	}
}
