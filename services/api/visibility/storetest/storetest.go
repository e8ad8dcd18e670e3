// Package storetest is the conformance suite of visibility.Store: every
// store (the embedded SQLite one, the PostgreSQL one) runs [Run], so that
// each lists, pages, counts and guards revisions the same way.
package storetest

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/visibility"
)

// Factory opens an empty store for a test, closed when the test ends.
// budget, if not 0, is the store's scan budget in place of
// visibility.ScanBudget (tests of partial pages use a small one).
type Factory func(t testing.TB, budget int) visibility.Store

// Examiner is a store that counts the index entries its queries examined.
type Examiner interface {
	Examined() int64
}

// T0 is the time the datasets start at.
var T0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// Run runs the suite on stores newStore opens; the subtests run in
// parallel.
func Run(t *testing.T, newStore Factory) {
	t.Run("QueriesPageLikeTheSlowWay", func(t *testing.T) { t.Parallel(); queriesPageLikeTheSlowWay(t, newStore) })
	t.Run("ScanIsBounded", func(t *testing.T) { t.Parallel(); scanIsBounded(t, newStore) })
	t.Run("RowsRoundTrip", func(t *testing.T) { t.Parallel(); rowsRoundTrip(t, newStore) })
	t.Run("CountsStayExact", func(t *testing.T) { t.Parallel(); countsStayExact(t, newStore) })
	t.Run("LargeBatchesCountExactly", func(t *testing.T) { t.Parallel(); largeBatchesCountExactly(t, newStore) })
	t.Run("PositionNeverGoesBack", func(t *testing.T) { t.Parallel(); positionNeverGoesBack(t, newStore) })
}

// Dataset is rows of several workflows, statuses and times, some with
// the same start (ties, ordered by id), some damaged, some with
// attributes; their revisions are 1 to n, in no order of id.
func Dataset(n int, seed uint64) []visibility.Row {
	rnd := rand.New(rand.NewPCG(seed, 1))
	rows := make([]visibility.Row, n)
	for i := range rows {
		st := visibility.Statuses[2+rnd.IntN(6)]
		r := visibility.Row{
			ID:        fmt.Sprintf("x-%05d", rnd.IntN(1_000_000)*10+i%10),
			Workflow:  []string{"alpha", "beta", "gamma"}[rnd.IntN(3)],
			Version:   1 + rnd.IntN(2),
			Status:    st,
			StartedAt: T0.Add(time.Duration(rnd.IntN(n/4+1)) * time.Second), // many ties
			Steps:     rnd.IntN(5), Rev: uint64(i + 1),
		}
		r.Done = r.Steps / 2
		r.UpdatedAt = r.StartedAt
		if st.Terminal() {
			r.EndedAt = r.StartedAt.Add(time.Duration(rnd.IntN(600)) * time.Second)
			r.UpdatedAt = r.EndedAt
		}
		if st == projections.StatusFailed {
			r.Error = "step b: exit status 1"
		}
		if rnd.IntN(20) == 0 {
			r.Damaged = &projections.Damage{Seq: uint64(i), Type: "io.jetflow.x", Reason: "unknown event type"}
		}
		if rnd.IntN(3) > 0 {
			r.Attrs = map[string]string{"customer": []string{"acme", "globex", "initech"}[rnd.IntN(3)]}
			if rnd.IntN(2) == 0 {
				r.Attrs["tier"] = []string{"gold", "silver"}[rnd.IntN(2)]
			}
		}
		rows[i] = r
	}
	// Ids are unique.
	slices.SortFunc(rows, func(a, b visibility.Row) int { return cmp.Compare(a.ID, b.ID) })
	return slices.CompactFunc(rows, func(a, b visibility.Row) bool { return a.ID == b.ID })
}

// Fill applies rows as a feed would: in order of revision, in batches,
// each with the position of its last row.
func Fill(t testing.TB, s visibility.Store, rows []visibility.Row) {
	t.Helper()
	rows = slices.Clone(rows)
	slices.SortFunc(rows, func(a, b visibility.Row) int { return cmp.Compare(a.Rev, b.Rev) })
	for chunk := range slices.Chunk(rows, 300) {
		pos := visibility.Position{Revision: chunk[len(chunk)-1].Rev}
		require.NoError(t, s.Apply(context.Background(), visibility.Batch{Puts: chunk, Position: pos}))
	}
}

// Want is what q must list, worked out the slow way.
func Want(rows []visibility.Row, q visibility.Query) []string {
	var out []visibility.Row
	inRange := func(t, after, before time.Time) bool {
		return (after.IsZero() || !t.Before(after)) && (before.IsZero() || t.Before(before))
	}
	for _, r := range rows {
		if (q.Workflow != "" && r.Workflow != q.Workflow) || (q.Status != "" && r.Status != q.Status) || (q.Damaged && r.Damaged == nil) ||
			!inRange(r.StartedAt, q.StartedAfter, q.StartedBefore) || (q.Sort.Key() == "ended" && r.EndedAt.IsZero()) {
			continue
		}
		if (!q.EndedAfter.IsZero() || !q.EndedBefore.IsZero()) && (r.EndedAt.IsZero() || !inRange(r.EndedAt, q.EndedAfter, q.EndedBefore)) {
			continue
		}
		ok := true
		for _, a := range q.Attrs {
			if v, has := r.Attrs[a.Name]; !has || v != a.Value {
				ok = false
			}
		}
		if ok {
			out = append(out, r)
		}
	}
	timeOf := func(r visibility.Row) time.Time {
		switch q.Sort.Key() {
		case "started":
			return r.StartedAt
		case "ended":
			return r.EndedAt
		}
		return time.Time{}
	}
	slices.SortFunc(out, func(a, b visibility.Row) int {
		c := cmp.Or(timeOf(a).Compare(timeOf(b)), cmp.Compare(a.ID, b.ID))
		if q.Sort.Desc() {
			return -c
		}
		return c
	})
	var ids []string
	for _, r := range out {
		ids = append(ids, r.ID)
	}
	return ids
}

// Pages follows q's cursors to the end and returns every id listed, and
// how many pages were partial.
func Pages(t testing.TB, s visibility.Store, q visibility.Query) ([]string, int) {
	t.Helper()
	var ids []string
	partials := 0
	for range 10000 {
		p, err := s.Query(context.Background(), q)
		require.NoError(t, err)
		require.LessOrEqual(t, len(p.Rows), q.Limit)
		for _, r := range p.Rows {
			ids = append(ids, r.ID)
		}
		if p.Partial {
			partials++
		} else if p.Next != nil {
			require.Len(t, p.Rows, q.Limit, "a page that is not partial and has a next is full")
		}
		if p.Next == nil {
			return ids, partials
		}
		// The cursor goes through the api as text.
		c, err := visibility.ParseCursor(q.Sort, p.Next.String())
		require.NoError(t, err)
		q.After = &c
	}
	t.Fatal("too many pages")
	return nil, 0
}

// queriesPageLikeTheSlowWay: every filter, in every order, paged with its
// cursor at several page sizes, lists exactly the rows a filter over all
// of them sorted lists: no duplicate, no gap.
func queriesPageLikeTheSlowWay(t *testing.T, newStore Factory) {
	rows := Dataset(800, 7)
	s := newStore(t, 0)
	Fill(t, s, rows)
	mid, late := T0.Add(200*time.Second), T0.Add(500*time.Second)
	queries := []visibility.Query{
		{},
		{Workflow: "alpha"},
		{Status: projections.StatusSucceeded},
		{Workflow: "beta", Status: projections.StatusFailed},
		{Damaged: true},
		{Damaged: true, Workflow: "gamma"},
		{StartedAfter: mid, StartedBefore: late},
		{Workflow: "alpha", StartedAfter: mid},
		{EndedAfter: mid, EndedBefore: late},
		{Workflow: "gamma", Status: projections.StatusSucceeded, EndedBefore: late},
		{Attrs: []visibility.Attr{{Name: "customer", Value: "acme"}}},
		{Attrs: []visibility.Attr{{Name: "customer", Value: "acme"}, {Name: "tier", Value: "gold"}}, Workflow: "alpha"},
		{Attrs: []visibility.Attr{{Name: "tier", Value: "silver"}}, Status: projections.StatusStarted, StartedAfter: mid},
		{Attrs: []visibility.Attr{{Name: "customer", Value: "nobody"}}},
	}
	for _, q := range queries {
		for _, sort := range visibility.Sorts {
			for _, limit := range []int{1, 19, 1000} {
				q := q
				q.Sort, q.Limit = sort, limit
				if limit == 1 && len(Want(rows, q)) > 30 {
					continue // many pages: the other sizes cover it
				}
				got, _ := Pages(t, s, q)
				require.Equal(t, Want(rows, q), got, "%+v", q)
			}
		}
	}
}

// scanIsBounded: a query whose filters the range does not cover examines
// at most the scan budget's entries per page, answers partial pages, and
// its cursors still list every match once.
func scanIsBounded(t *testing.T, newStore Factory) {
	s := newStore(t, 500)
	var rows []visibility.Row
	for i := range 1200 {
		r := visibility.Row{ID: fmt.Sprintf("n-%05d", i), Workflow: "noise", Status: projections.StatusSucceeded,
			StartedAt: T0.Add(time.Duration(i) * time.Second), Rev: uint64(i + 1)}
		r.EndedAt = r.StartedAt.Add(100 * 24 * time.Hour)
		if i%500 == 499 {
			r.EndedAt = r.StartedAt.Add(time.Minute) // two needles, far apart
		}
		rows = append(rows, r)
	}
	Fill(t, s, rows)
	examined := func() int64 {
		if e, ok := s.(Examiner); ok {
			return e.Examined()
		}
		return 0
	}
	q := visibility.Query{Sort: visibility.SortStartedAsc, Limit: 10, EndedBefore: T0.Add(999*time.Second + 2*time.Minute)}
	before := examined()
	p, err := s.Query(context.Background(), q)
	require.NoError(t, err)
	if _, ok := s.(Examiner); ok {
		require.Equal(t, int64(500), examined()-before)
	}
	require.True(t, p.Partial)
	require.Len(t, p.Rows, 1)
	got, partials := Pages(t, s, q)
	require.Equal(t, []string{"n-00499", "n-00999"}, got)
	require.Equal(t, 2, partials)

	// A range scan examines the page and one more.
	before = examined()
	p, err = s.Query(context.Background(), visibility.Query{Sort: visibility.SortEndedDesc, Limit: 10, Workflow: "noise", Status: projections.StatusSucceeded,
		EndedBefore: T0.Add(100*24*time.Hour + 500*time.Second)})
	require.NoError(t, err)
	require.Len(t, p.Rows, 10)
	require.Equal(t, "n-00498", p.Rows[0].ID, "the latest end before (n-00499, a needle, ended long before)")
	require.LessOrEqual(t, examined()-before, int64(11))
}

// rowsRoundTrip: what a row holds comes back as it went in, and a row is
// replaced only by a newer revision; a deletion removes only an older
// one.
func rowsRoundTrip(t *testing.T, newStore Factory) {
	ctx := context.Background()
	s := newStore(t, 0)
	r := visibility.Row{ID: "a", Workflow: "w", Version: 3, Status: projections.StatusFailed, StartedAt: T0, EndedAt: T0.Add(time.Second),
		UpdatedAt: T0.Add(time.Second), Steps: 4, Done: 2, Error: "boom", Damaged: &projections.Damage{Seq: 9, Reason: "x"},
		Attrs: map[string]string{"customer": "acme"}, Rev: 5}
	pos := visibility.Position{Revision: 5, Stream: T0, LiveAt: T0.Add(time.Minute)}
	require.NoError(t, s.Apply(ctx, visibility.Batch{Puts: []visibility.Row{r}, Position: pos}))
	got, err := s.Position(ctx)
	require.NoError(t, err)
	require.Equal(t, pos, got)
	list := func(q visibility.Query) []visibility.Row {
		q.Limit = 10
		p, err := s.Query(ctx, q)
		require.NoError(t, err)
		return p.Rows
	}
	require.Equal(t, []visibility.Row{r}, list(visibility.Query{Sort: visibility.SortID}))
	require.Equal(t, []visibility.Row{r}, list(visibility.Query{Sort: visibility.SortEndedDesc, Attrs: []visibility.Attr{{Name: "customer", Value: "acme"}}}))

	older := r
	older.Status, older.Rev, older.Attrs = projections.StatusStarted, 4, nil
	require.NoError(t, s.Apply(ctx, visibility.Batch{Puts: []visibility.Row{older}, Position: pos}))
	require.Equal(t, []visibility.Row{r}, list(visibility.Query{Sort: visibility.SortID}), "an older revision changes nothing")
	require.NoError(t, s.Apply(ctx, visibility.Batch{Deletes: []visibility.Delete{{ID: "a", Rev: 5}}, Position: pos}))
	require.Len(t, list(visibility.Query{Sort: visibility.SortID}), 1, "a deletion at the row's revision is older than it")

	moved := r
	moved.Status, moved.Rev, moved.Attrs = projections.StatusStarted, 6, map[string]string{"customer": "globex"}
	pos.Revision = 6
	require.NoError(t, s.Apply(ctx, visibility.Batch{Puts: []visibility.Row{moved}, Position: pos}))
	require.Equal(t, []visibility.Row{moved}, list(visibility.Query{Status: projections.StatusStarted, Sort: visibility.SortStartedDesc}))
	require.Empty(t, list(visibility.Query{Status: projections.StatusFailed, Sort: visibility.SortStartedDesc}))
	require.Empty(t, list(visibility.Query{Sort: visibility.SortID, Attrs: []visibility.Attr{{Name: "customer", Value: "acme"}}}))
	require.Len(t, list(visibility.Query{Sort: visibility.SortID, Attrs: []visibility.Attr{{Name: "customer", Value: "globex"}}}), 1)

	pos.Revision = 7
	require.NoError(t, s.Apply(ctx, visibility.Batch{Deletes: []visibility.Delete{{ID: "a", Rev: 7}}, Position: pos}))
	require.Empty(t, list(visibility.Query{Sort: visibility.SortID}))
	require.Empty(t, list(visibility.Query{Sort: visibility.SortID, Attrs: []visibility.Attr{{Name: "customer", Value: "globex"}}}), "its attributes went with it")

	require.NoError(t, s.Reset(ctx))
	got, err = s.Position(ctx)
	require.NoError(t, err)
	require.Zero(t, got)
}

// countsStayExact: after each of many random batches (new rows, rows
// changing workflow or status, deletions, each batch applied twice, and
// batches a feed behind the index applies late), Counts equals a count of
// the rows listed, by workflow and status, and of all.
func countsStayExact(t *testing.T, newStore Factory) {
	ctx := context.Background()
	s := newStore(t, 0)
	rnd := rand.New(rand.NewPCG(11, 3))
	workflows := []string{"alpha", "beta", "gamma"}
	model := map[string]visibility.Row{} // what the store must hold
	var rev uint64
	var batches []visibility.Batch
	for round := range 40 {
		var b visibility.Batch
		for range 1 + rnd.IntN(60) {
			rev++
			id := fmt.Sprintf("c-%03d", rnd.IntN(150))
			if _, ok := model[id]; ok && rnd.IntN(4) == 0 {
				b.Deletes = append(b.Deletes, visibility.Delete{ID: id, Rev: rev})
				delete(model, id)
				continue
			}
			r := visibility.Row{ID: id, Workflow: workflows[rnd.IntN(len(workflows))], Status: visibility.Statuses[1+rnd.IntN(7)],
				StartedAt: T0.Add(time.Duration(rev) * time.Second), Rev: rev}
			b.Puts = append(b.Puts, r)
			model[id] = r
		}
		b.Position = visibility.Position{Revision: rev}
		require.NoError(t, s.Apply(ctx, b))
		require.NoError(t, s.Apply(ctx, b), "a batch applied again changes nothing")
		if round > 2 && rnd.IntN(3) == 0 {
			// A feed behind the index applies an older batch: left out.
			require.NoError(t, s.Apply(ctx, batches[rnd.IntN(len(batches))]))
		}
		batches = append(batches, b)
		requireCounts(t, s, model, workflows)
	}
	require.NoError(t, s.Reset(ctx))
	all, err := s.Counts(ctx, "")
	require.NoError(t, err)
	require.Empty(t, all, "a reset clears the counts")
	require.NoError(t, s.Apply(ctx, batches[0]))
	all, err = s.Counts(ctx, "")
	require.NoError(t, err)
	n, err := s.Count(ctx)
	require.NoError(t, err)
	require.NotZero(t, n)
	require.Equal(t, n, sum(all), "counted again after a reset")
}

// largeBatchesCountExactly: batches of more rows than a store looks up
// at once (the SQLite store reads 500 stored rows a query), each row
// changed once or twice, deleted once or twice, put and deleted, or new,
// keep the counts exact.
func largeBatchesCountExactly(t *testing.T, newStore Factory) {
	ctx := context.Background()
	s := newStore(t, 0)
	rnd := rand.New(rand.NewPCG(5, 8))
	workflows := []string{"alpha", "beta"}
	model := map[string]visibility.Row{}
	var rev uint64
	put := func(b *visibility.Batch, id string) {
		rev++
		r := visibility.Row{ID: id, Workflow: workflows[rnd.IntN(len(workflows))], Status: visibility.Statuses[1+rnd.IntN(7)],
			StartedAt: T0.Add(time.Duration(rev) * time.Second), Rev: rev}
		b.Puts = append(b.Puts, r)
		model[id] = r
	}
	var first visibility.Batch
	for i := range 1300 {
		put(&first, fmt.Sprintf("l-%04d", i))
	}
	first.Position = visibility.Position{Revision: rev}
	require.NoError(t, s.Apply(ctx, first))
	requireCounts(t, s, model, workflows)

	var second visibility.Batch
	del := func(id string) {
		rev++
		second.Deletes = append(second.Deletes, visibility.Delete{ID: id, Rev: rev})
		delete(model, id)
	}
	for i := range 1700 { // 400 new
		id := fmt.Sprintf("l-%04d", i)
		switch _, stored := model[id]; {
		case stored && i%10 == 0:
			del(id)
			del(id) // twice: gone once
		case stored && rnd.IntN(5) == 0:
			del(id)
		case i%7 == 0:
			put(&second, id)
			del(id) // put, then deleted in the same batch (puts apply first)
		case rnd.IntN(4) == 0:
			put(&second, id)
			put(&second, id) // twice in the batch: counted once, as the last
		default:
			put(&second, id)
		}
	}
	second.Position = visibility.Position{Revision: rev}
	require.NoError(t, s.Apply(ctx, second))
	requireCounts(t, s, model, workflows)
	require.NoError(t, s.Apply(ctx, second), "a batch applied again changes nothing")
	requireCounts(t, s, model, workflows)
}

// requireCounts checks s's counts against model's rows and against what
// s lists.
func requireCounts(t *testing.T, s visibility.Store, model map[string]visibility.Row, workflows []string) {
	t.Helper()
	ctx := context.Background()
	want := map[string]map[projections.Status]int{"": {}}
	for _, w := range workflows {
		want[w] = map[projections.Status]int{}
	}
	for _, r := range model {
		want[""][r.Status]++
		want[r.Workflow][r.Status]++
	}
	for w, byStatus := range want {
		got, err := s.Counts(ctx, w)
		require.NoError(t, err)
		require.Equal(t, byStatus, got, "workflow %q", w)
		// The brute-force count: the rows the store lists.
		listed := map[projections.Status]int{}
		for _, st := range visibility.Statuses[1:] { // StatusNone is no filter: the dataset has none
			ids, _ := Pages(t, s, visibility.Query{Workflow: w, Status: st, Sort: visibility.SortID, Limit: 1000})
			if len(ids) > 0 {
				listed[st] = len(ids)
			}
		}
		require.Equal(t, listed, got, "workflow %q: the counts are the rows listed", w)
	}
	n, err := s.Count(ctx)
	require.NoError(t, err)
	require.Equal(t, len(model), n)
	require.Equal(t, len(model), sum(want[""]))
}

func sum(m map[projections.Status]int) int {
	n := 0
	for v := range maps.Values(m) {
		n += v
	}
	return n
}

// positionNeverGoesBack: a batch whose position is behind the stored one
// (a second feed, behind the first) records no position and changes no
// row it has applied already: a row the index deleted does not come
// back, a newer row is not replaced.
func positionNeverGoesBack(t *testing.T, newStore Factory) {
	ctx := context.Background()
	s := newStore(t, 0)
	row := func(id string, st projections.Status, rev uint64) visibility.Row {
		return visibility.Row{ID: id, Workflow: "w", Status: st, StartedAt: T0, Rev: rev}
	}
	ahead := visibility.Position{Revision: 10, Stream: T0, LiveAt: T0.Add(time.Hour)}
	require.NoError(t, s.Apply(ctx, visibility.Batch{
		Puts:     []visibility.Row{row("a", projections.StatusStarted, 3), row("b", projections.StatusSucceeded, 9)},
		Deletes:  []visibility.Delete{{ID: "a", Rev: 8}},
		Position: ahead,
	}))
	// The feed behind: "a" at revision 5 (deleted at 8), "b" at 4.
	behind := visibility.Position{Revision: 5, Stream: T0, LiveAt: T0.Add(time.Minute)}
	require.NoError(t, s.Apply(ctx, visibility.Batch{
		Puts:     []visibility.Row{row("a", projections.StatusStarted, 5), row("b", projections.StatusFailed, 4)},
		Position: behind,
	}))
	p, err := s.Position(ctx)
	require.NoError(t, err)
	require.Equal(t, ahead, p)
	page, err := s.Query(ctx, visibility.Query{Sort: visibility.SortID, Limit: 10})
	require.NoError(t, err)
	require.Len(t, page.Rows, 1)
	require.Equal(t, "b", page.Rows[0].ID)
	require.Equal(t, projections.StatusSucceeded, page.Rows[0].Status)
	counts, err := s.Counts(ctx, "w")
	require.NoError(t, err)
	require.Equal(t, map[projections.Status]int{projections.StatusSucceeded: 1}, counts)

	// The same revision with a later LiveAt is recorded (a live feed's
	// tick), and so is a later revision.
	ahead.LiveAt = ahead.LiveAt.Add(time.Minute)
	require.NoError(t, s.Apply(ctx, visibility.Batch{Position: ahead}))
	p, err = s.Position(ctx)
	require.NoError(t, err)
	require.Equal(t, ahead, p)
	// The same revision with an earlier LiveAt (a second, slower feed
	// writing the same index) leaves the later one.
	stale := ahead
	stale.LiveAt = ahead.LiveAt.Add(-30 * time.Second)
	require.NoError(t, s.Apply(ctx, visibility.Batch{Position: stale}))
	p, err = s.Position(ctx)
	require.NoError(t, err)
	require.Equal(t, ahead, p, "live_at went back")
	ahead.Revision = 12
	require.NoError(t, s.Apply(ctx, visibility.Batch{Puts: []visibility.Row{row("a", projections.StatusStarted, 11)}, Position: ahead}))
	p, err = s.Position(ctx)
	require.NoError(t, err)
	require.Equal(t, ahead, p)
	n, err := s.Count(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
}

// PostgresURL is the PostgreSQL server the tests of a PostgreSQL store
// use: JETFLOW_TEST_POSTGRES. Without it the test skips, unless
// JETFLOW_REQUIRE_POSTGRES=1 (CI), when it fails.
func PostgresURL(t testing.TB) string {
	t.Helper()
	url := os.Getenv("JETFLOW_TEST_POSTGRES")
	if url == "" {
		msg := "no PostgreSQL to test against: set JETFLOW_TEST_POSTGRES to a server's URL " +
			"(eval \"$(tools/ci/postgres.sh start)\" starts a throwaway one and prints it)"
		if os.Getenv("JETFLOW_REQUIRE_POSTGRES") == "1" {
			t.Fatal(msg + ", or unset JETFLOW_REQUIRE_POSTGRES")
		}
		t.Skip(msg)
	}
	return url
}
