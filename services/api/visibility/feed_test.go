package visibility_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/api/visibility"
	"jetflow.dev/services/api/visibility/sqlitestore"
)

// countingStore counts what a feed does to its store.
type countingStore struct {
	visibility.Store
	resets, puts atomic.Int64
}

func (c *countingStore) Reset(ctx context.Context) error {
	c.resets.Add(1)
	return c.Store.Reset(ctx)
}

func (c *countingStore) Apply(ctx context.Context, b visibility.Batch) error {
	c.puts.Add(int64(len(b.Puts)))
	return c.Store.Apply(ctx, b)
}

type env struct {
	js   jetstream.JetStream
	kv   jetstream.KeyValue
	defs *catalog.Store
	t0   time.Time
}

func newEnv(t *testing.T) *env {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	defs, err := catalog.Open(t.Context(), js)
	require.NoError(t, err)
	for _, y := range []string{
		"name: billing\nsearch_attributes: [input.customer, vars.tier]\nsteps:\n  - {id: a, kind: noop}\n",
		"name: shipping\nsearch_attributes: [input.customer]\nsteps:\n  - {id: a, kind: noop}\n",
	} {
		d, err := workflow.Parse([]byte(y))
		require.NoError(t, err)
		_, _, err = defs.Apply(t.Context(), d)
		require.NoError(t, err)
	}
	return &env{js: js, kv: kv, defs: defs, t0: time.Date(2026, 5, 1, 8, 0, 0, 0, time.UTC)}
}

// put stores a read model as the projector would.
func (e *env) put(t *testing.T, x projections.Execution) {
	t.Helper()
	b, err := json.Marshal(x)
	require.NoError(t, err)
	_, err = e.kv.Put(t.Context(), x.ID, b)
	require.NoError(t, err)
}

// model is a read model of workflow wf (version 1) started i minutes
// after t0, in status st.
func (e *env) model(id, wf string, i int, st projections.Status, customer string) projections.Execution {
	x := projections.Execution{ID: id, Workflow: wf, Version: 1, Status: st, StartedAt: e.t0.Add(time.Duration(i) * time.Minute),
		Steps: []projections.Step{{ID: "a", Status: projections.OpSucceeded}}, Input: json.RawMessage(fmt.Sprintf(`{"customer": %q, "n": %d}`, customer, i))}
	x.UpdatedAt = x.StartedAt
	if st.Terminal() {
		x.EndedAt = x.StartedAt.Add(30 * time.Second)
		x.UpdatedAt = x.EndedAt
	}
	return x
}

// run runs a feed of store until the test ends (or stop is called).
func (e *env) run(t *testing.T, store visibility.Store, slow ...bool) (*visibility.Feed, func()) {
	t.Helper()
	f, err := visibility.NewFeed(t.Context(), store, e.js, e.defs, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	f.BatchWait = 5 * time.Millisecond
	if len(slow) > 0 {
		f.BatchWait = time.Hour // only a waiting list makes it write before BatchMax updates
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("the feed did not stop")
		}
	}
	t.Cleanup(stop)
	return f, stop
}

// list pages through q and returns the ids listed.
func list(t *testing.T, s visibility.Store, q visibility.Query) []string {
	t.Helper()
	ids := []string{}
	if q.Limit == 0 {
		q.Limit = 2
	}
	for range 1000 {
		p, err := s.Query(context.Background(), q)
		require.NoError(t, err)
		for _, r := range p.Rows {
			ids = append(ids, r.ID)
		}
		if p.Next == nil {
			return ids
		}
		q.After = p.Next
	}
	t.Fatal("too many pages")
	return nil
}

// rows returns every row, in id order.
func rows(t *testing.T, s visibility.Store) []visibility.Row {
	t.Helper()
	p, err := s.Query(context.Background(), visibility.Query{Sort: visibility.SortID, Limit: 1000})
	require.NoError(t, err)
	require.Nil(t, p.Next)
	return p.Rows
}

func openStore(t *testing.T, path string) *sqlitestore.Store {
	t.Helper()
	s, err := sqlitestore.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// TestFeedKeepsTheIndex: read models of several workflows, statuses and
// times appear in the index with their search attributes, filters and
// cursors page them in order, an update moves a row, a deletion removes
// it; a feed started again resumes from the revision it stored, and a
// rebuild gives the same rows as the live feed.
func TestFeedKeepsTheIndex(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	path := filepath.Join(t.TempDir(), "default.db")
	store := &countingStore{Store: openStore(t, path)}
	f, stop := e.run(t, store)

	bill := func(id string, i int, st projections.Status, customer, tier string) projections.Execution {
		x := e.model(id, "billing", i, st, customer)
		if tier != "" {
			x.Vars = map[string]json.RawMessage{"tier": json.RawMessage(`"` + tier + `"`)}
		}
		return x
	}
	for _, x := range []projections.Execution{
		bill("b-1", 1, projections.StatusSucceeded, "acme", "gold"),
		bill("b-2", 2, projections.StatusFailed, "globex", ""),
		bill("b-3", 3, projections.StatusStarted, "acme", "silver"),
		bill("b-4", 4, projections.StatusSucceeded, "acme", "gold"),
		e.model("s-1", "shipping", 2, projections.StatusSucceeded, "acme"),
		e.model("s-2", "shipping", 5, projections.StatusStarted, "initech"),
		e.model("u-1", "unregistered", 6, projections.StatusSucceeded, "acme"),
	} {
		e.put(t, x)
	}
	natstest.Eventually(t, 10*time.Second, func() bool { return f.Live() && len(rows(t, store)) == 7 }, "7 rows, live")

	started := func(q visibility.Query) visibility.Query { q.Sort = visibility.SortStartedDesc; return q }
	require.Equal(t, []string{"u-1", "s-2", "b-4", "b-3", "s-1", "b-2", "b-1"}, list(t, store, started(visibility.Query{})),
		"latest start first; ties (b-2 and s-1) by id, descending")
	require.Equal(t, []string{"b-1", "b-2", "s-1", "b-3", "b-4", "s-2", "u-1"}, list(t, store, visibility.Query{Sort: visibility.SortStartedAsc}))
	require.Equal(t, []string{"b-4", "b-1"}, list(t, store, started(visibility.Query{Workflow: "billing", Status: projections.StatusSucceeded})))
	require.Equal(t, []string{"u-1", "b-4", "s-1", "b-2", "b-1"}, list(t, store, visibility.Query{Sort: visibility.SortEndedDesc}),
		"ended ones only, latest end first")
	require.Equal(t, []string{"b-4", "b-3", "b-2"}, list(t, store, started(visibility.Query{
		StartedAfter: e.t0.Add(2 * time.Minute), StartedBefore: e.t0.Add(5 * time.Minute), Workflow: "billing"})))
	require.Equal(t, []string{"b-4", "b-3", "s-1", "b-1"}, list(t, store, started(visibility.Query{Attrs: []visibility.Attr{{Name: "customer", Value: "acme"}}})),
		"attributes of registered workflows only (u-1's workflow names none)")
	require.Equal(t, []string{"b-4", "b-1"}, list(t, store, started(visibility.Query{Attrs: []visibility.Attr{{Name: "customer", Value: "acme"}, {Name: "tier", Value: "gold"}}})))
	require.Equal(t, []string{"b-1", "b-2", "b-3", "b-4", "s-1", "s-2", "u-1"}, list(t, store, visibility.Query{Sort: visibility.SortID}))

	row := rows(t, store)[1]
	require.Equal(t, "b-2", row.ID)
	require.Equal(t, projections.StatusFailed, row.Status)
	require.Equal(t, map[string]string{"customer": "globex"}, row.Attrs, "a variable not set is not indexed")
	require.Equal(t, 1, row.Steps)
	require.Equal(t, 1, row.Done)
	require.Equal(t, e.t0.Add(2*time.Minute+30*time.Second), row.EndedAt)

	// An update moves the row: b-3 ends, and its tier changes.
	b3 := bill("b-3", 3, projections.StatusSucceeded, "acme", "gold")
	e.put(t, b3)
	natstest.Eventually(t, 10*time.Second, func() bool {
		return len(list(t, store, visibility.Query{Status: projections.StatusStarted, Workflow: "billing", Sort: visibility.SortStartedDesc})) == 0
	}, "b-3 no longer started")
	require.Equal(t, []string{"b-4", "b-3", "b-1"}, list(t, store, started(visibility.Query{Workflow: "billing", Status: projections.StatusSucceeded})))
	require.Equal(t, []string{"b-4", "b-3", "b-1"}, list(t, store, started(visibility.Query{Attrs: []visibility.Attr{{Name: "tier", Value: "gold"}}})))
	require.Empty(t, list(t, store, started(visibility.Query{Attrs: []visibility.Attr{{Name: "tier", Value: "silver"}}})))

	// A deletion (the janitor's purge) removes the row and its attributes.
	require.NoError(t, e.kv.Purge(t.Context(), "b-1"))
	require.NoError(t, e.kv.Delete(t.Context(), "s-2"))
	natstest.Eventually(t, 10*time.Second, func() bool { return len(rows(t, store)) == 5 }, "b-1 and s-2 deleted")
	require.Equal(t, []string{"b-4", "b-3"}, list(t, store, started(visibility.Query{Attrs: []visibility.Attr{{Name: "tier", Value: "gold"}}})))
	require.NotContains(t, list(t, store, visibility.Query{Sort: visibility.SortID}), "s-2")

	// Stopped, then started again: it resumes from the revision it
	// stored, writing only what changed meanwhile.
	stop()
	e.put(t, e.model("s-3", "shipping", 7, projections.StatusStarted, "umbrella"))
	require.NoError(t, e.kv.Purge(t.Context(), "b-2"))
	pos, err := store.Position(t.Context())
	require.NoError(t, err)
	require.Positive(t, pos.Revision)
	store.puts.Store(0)
	f, _ = e.run(t, store)
	natstest.Eventually(t, 10*time.Second, f.Live, "live again")
	require.Zero(t, store.resets.Load(), "resumed, not fed again")
	require.Equal(t, int64(1), store.puts.Load(), "only s-3 written again")
	require.Equal(t, []string{"b-3", "b-4", "s-1", "s-3", "u-1"}, list(t, store, visibility.Query{Sort: visibility.SortID}))

	// A rebuild drops the index and feeds it again: the same rows.
	live := rows(t, store)
	require.NoError(t, f.Rebuild(t.Context()))
	require.Equal(t, int64(1), store.resets.Load())
	natstest.Eventually(t, 10*time.Second, f.Live, "live after the rebuild")
	require.Equal(t, live, rows(t, store), "rebuilt rows equal the live ones")

	// A second index fed from the start in memory (another api) agrees.
	mem := openStore(t, "")
	f2, _ := e.run(t, mem)
	natstest.Eventually(t, 10*time.Second, f2.Live, "the other index is live")
	require.Equal(t, live, rows(t, mem))
}

// TestFeedStartsOverWhenItCannotResume: an index that was not live for
// longer than the markers of deletions last, or whose bucket was made
// again, is fed again from the start instead of resumed.
func TestFeedStartsOverWhenItCannotResume(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.put(t, e.model("a-1", "billing", 1, projections.StatusSucceeded, "acme"))
	store := &countingStore{Store: openStore(t, filepath.Join(t.TempDir(), "v.db"))}
	f, stop := e.run(t, store)
	natstest.Eventually(t, 10*time.Second, f.Live, "live")
	stop()
	require.Zero(t, store.resets.Load())

	// A deletion whose marker is gone, while the index was away: a stale
	// row would stay forever if the feed resumed.
	pos, err := store.Position(t.Context())
	require.NoError(t, err)
	gone := visibility.Row{ID: "gone", Workflow: "billing", Status: projections.StatusSucceeded, Rev: 1}
	// The time it was last live never goes back: the index as one left
	// an hour ago is written anew (the inner store's reset, not counted).
	require.NoError(t, store.Store.Reset(t.Context()))
	pos.LiveAt = time.Now().Add(-time.Hour)
	require.NoError(t, store.Apply(t.Context(), visibility.Batch{Puts: []visibility.Row{gone}, Position: pos}))
	f, stop = e.run(t, store)
	natstest.Eventually(t, 10*time.Second, f.Live, "live")
	stop()
	require.Equal(t, int64(1), store.resets.Load(), "an index away for an hour is fed again")
	require.Equal(t, []string{"a-1"}, list(t, store, visibility.Query{Sort: visibility.SortID}))

	// The bucket made again (a restore): its revisions start over.
	pos, err = store.Position(t.Context())
	require.NoError(t, err)
	pos.Stream = pos.Stream.Add(-time.Hour)
	require.NoError(t, store.Apply(t.Context(), visibility.Batch{Puts: []visibility.Row{gone}, Position: pos}))
	f, stop = e.run(t, store)
	natstest.Eventually(t, 10*time.Second, f.Live, "live")
	stop()
	require.Equal(t, int64(2), store.resets.Load(), "an index of another bucket is fed again")
	require.Equal(t, []string{"a-1"}, list(t, store, visibility.Query{Sort: visibility.SortID}))

	// Last live an hour from now (a clock ahead, since set right): the
	// time never goes back, so it cannot tell how long the index was
	// away; fed again.
	pos, err = store.Position(t.Context())
	require.NoError(t, err)
	require.NoError(t, store.Store.Reset(t.Context()))
	pos.LiveAt = time.Now().Add(time.Hour)
	require.NoError(t, store.Apply(t.Context(), visibility.Batch{Puts: []visibility.Row{gone}, Position: pos}))
	f, _ = e.run(t, store)
	natstest.Eventually(t, 10*time.Second, f.Live, "live")
	require.Equal(t, int64(3), store.resets.Load(), "an index last live in the future is fed again")
	require.Equal(t, []string{"a-1"}, list(t, store, visibility.Query{Sort: visibility.SortID}))
}

// lastRevision is the bucket's last revision, as a list asks for it.
func (e *env) lastRevision(t *testing.T) uint64 {
	t.Helper()
	st, err := e.kv.Status(t.Context())
	require.NoError(t, err)
	return st.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq
}

// TestWaitForTheReadModels: a list waits until the index holds what the
// read models held when it was asked, without waiting for the batch to
// fill; a revision the watch never delivers (a deletion marker removed
// since) is not waited for.
func TestWaitForTheReadModels(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	store := openStore(t, filepath.Join(t.TempDir(), "v.db"))
	f, stop := e.run(t, store, true)
	natstest.Eventually(t, 10*time.Second, f.Live, "live")
	wait := func(within time.Duration) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), within)
		defer cancel()
		require.NoError(t, f.WaitFor(ctx, e.lastRevision(t)))
	}
	for i := range 3 {
		e.put(t, e.model(fmt.Sprintf("w-%d", i), "billing", i, projections.StatusStarted, "acme"))
		wait(10 * time.Second)
		require.Len(t, rows(t, store), i+1, "the list after a write shows it")
	}

	// The bucket's last revision is a deletion's marker, removed (by the
	// janitor) while the api was away.
	stop()
	require.NoError(t, e.kv.Delete(t.Context(), "w-2"))
	require.NoError(t, e.kv.PurgeDeletes(t.Context(), jetstream.DeleteMarkersOlderThan(-1)))
	f, _ = e.run(t, store, true)
	natstest.Eventually(t, 10*time.Second, f.Live, "live")
	require.Len(t, rows(t, store), 3, "w-2 is not known to be deleted (a restart resumes)")
	// Waited for, the revision would never come and WaitFor would end with
	// the context (a minute): far more than even a loaded machine takes.
	began := time.Now()
	wait(time.Minute)
	require.Less(t, time.Since(began), 30*time.Second, "a revision that is gone is not waited for")
}
