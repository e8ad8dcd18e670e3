package sqlitestore

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/visibility"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// dataset is rows of several workflows, statuses and times, some with
// the same start (ties, ordered by id), some damaged, some with
// attributes.
func dataset(n int, seed uint64) []visibility.Row {
	rnd := rand.New(rand.NewPCG(seed, 1))
	rows := make([]visibility.Row, n)
	for i := range rows {
		st := visibility.Statuses[2+rnd.IntN(6)]
		r := visibility.Row{
			ID:        fmt.Sprintf("x-%05d", rnd.IntN(1_000_000)*10+i%10),
			Workflow:  []string{"alpha", "beta", "gamma"}[rnd.IntN(3)],
			Version:   1 + rnd.IntN(2),
			Status:    st,
			StartedAt: t0.Add(time.Duration(rnd.IntN(n/4+1)) * time.Second), // many ties
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

func fill(t testing.TB, s *Store, rows []visibility.Row, rev uint64) {
	t.Helper()
	for chunk := range slices.Chunk(rows, 300) {
		require.NoError(t, s.Apply(context.Background(), visibility.Batch{Puts: chunk, Position: visibility.Position{Revision: rev}}))
	}
}

// want is what q must list, worked out the slow way.
func want(rows []visibility.Row, q visibility.Query) []string {
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

// pages follows q's cursors to the end and returns every id listed, and
// how many pages were partial.
func pages(t *testing.T, s *Store, q visibility.Query) ([]string, int) {
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

func openTemp(t testing.TB) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "default.db"))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// TestQueriesPageLikeTheSlowWay: every filter, in every order, paged with
// its cursor at several page sizes, lists exactly the rows a filter over
// all of them sorted lists: no duplicate, no gap.
func TestQueriesPageLikeTheSlowWay(t *testing.T) {
	t.Parallel()
	rows := dataset(800, 7)
	for _, mem := range []bool{false, true} {
		s := openTemp(t)
		if mem {
			var err error
			s, err = Open("")
			require.NoError(t, err)
			t.Cleanup(func() { s.Close() })
		}
		fill(t, s, rows, 1)
		mid, late := t0.Add(200*time.Second), t0.Add(500*time.Second)
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
					if (limit == 1 && len(want(rows, q)) > 30) || (mem && limit != 1000) {
						continue // many pages: the other sizes cover it; in memory, the same code
					}
					got, _ := pages(t, s, q)
					require.Equal(t, want(rows, q), got, "memory %v, %+v", mem, q)
				}
			}
		}
	}
}

// TestScanIsBounded: a query whose filters the range does not cover
// examines at most ScanBudget entries per page, answers partial pages, and
// its cursors still list every match once.
func TestScanIsBounded(t *testing.T) {
	t.Parallel()
	s := openTemp(t)
	s.budget = 500
	var rows []visibility.Row
	for i := range 1200 {
		r := visibility.Row{ID: fmt.Sprintf("n-%05d", i), Workflow: "noise", Status: projections.StatusSucceeded,
			StartedAt: t0.Add(time.Duration(i) * time.Second), Rev: 1}
		r.EndedAt = r.StartedAt.Add(100 * 24 * time.Hour)
		if i%500 == 499 {
			r.EndedAt = r.StartedAt.Add(time.Minute) // two needles, far apart
		}
		rows = append(rows, r)
	}
	fill(t, s, rows, 1)
	q := visibility.Query{Sort: visibility.SortStartedAsc, Limit: 10, EndedBefore: t0.Add(999*time.Second + 2*time.Minute)}
	s.examined.Store(0)
	p, err := s.Query(context.Background(), q)
	require.NoError(t, err)
	require.Equal(t, int64(500), s.examined.Load())
	require.True(t, p.Partial)
	require.Len(t, p.Rows, 1)
	got, partials := pages(t, s, q)
	require.Equal(t, []string{"n-00499", "n-00999"}, got)
	require.Equal(t, 2, partials)

	// A range scan examines the page and one more.
	s.examined.Store(0)
	p, err = s.Query(context.Background(), visibility.Query{Sort: visibility.SortEndedDesc, Limit: 10, Workflow: "noise", Status: projections.StatusSucceeded,
		EndedBefore: t0.Add(100*24*time.Hour + 500*time.Second)})
	require.NoError(t, err)
	require.Len(t, p.Rows, 10)
	require.Equal(t, "n-00498", p.Rows[0].ID, "the latest end before (n-00499, a needle, ended long before)")
	require.LessOrEqual(t, s.examined.Load(), int64(11))
}

// TestRowsRoundTrip: what a row holds comes back as it went in, and a
// row is replaced only by a newer revision; a deletion removes only an
// older one.
func TestRowsRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := openTemp(t)
	r := visibility.Row{ID: "a", Workflow: "w", Version: 3, Status: projections.StatusFailed, StartedAt: t0, EndedAt: t0.Add(time.Second),
		UpdatedAt: t0.Add(time.Second), Steps: 4, Done: 2, Error: "boom", Damaged: &projections.Damage{Seq: 9, Reason: "x"},
		Attrs: map[string]string{"customer": "acme"}, Rev: 5}
	pos := visibility.Position{Revision: 5, Stream: t0, LiveAt: t0.Add(time.Minute)}
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
	require.NoError(t, s.Apply(ctx, visibility.Batch{Puts: []visibility.Row{moved}, Position: pos}))
	require.Equal(t, []visibility.Row{moved}, list(visibility.Query{Status: projections.StatusStarted, Sort: visibility.SortStartedDesc}))
	require.Empty(t, list(visibility.Query{Status: projections.StatusFailed, Sort: visibility.SortStartedDesc}))
	require.Empty(t, list(visibility.Query{Sort: visibility.SortID, Attrs: []visibility.Attr{{Name: "customer", Value: "acme"}}}))
	require.Len(t, list(visibility.Query{Sort: visibility.SortID, Attrs: []visibility.Attr{{Name: "customer", Value: "globex"}}}), 1)

	require.NoError(t, s.Apply(ctx, visibility.Batch{Deletes: []visibility.Delete{{ID: "a", Rev: 7}}, Position: pos}))
	require.Empty(t, list(visibility.Query{Sort: visibility.SortID}))
	require.Empty(t, list(visibility.Query{Sort: visibility.SortID, Attrs: []visibility.Attr{{Name: "customer", Value: "globex"}}}), "its attributes went with it")

	require.NoError(t, s.Reset(ctx))
	got, err = s.Position(ctx)
	require.NoError(t, err)
	require.Zero(t, got)
}

// TestEveryQueryIsAnIndexRangeScan: each shape of query searches an
// index in its order: no table scan, no sort of what it read.
func TestEveryQueryIsAnIndexRangeScan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := openTemp(t)
	at := []visibility.Attr{{Name: "customer", Value: "acme"}, {Name: "tier", Value: "gold"}}
	for _, sort := range visibility.Sorts {
		for _, q := range []visibility.Query{
			{}, {Workflow: "w"}, {Status: projections.StatusStarted}, {Workflow: "w", Status: projections.StatusStarted},
			{Damaged: true}, {Attrs: at[:1]}, {Attrs: at}, {StartedAfter: t0, EndedBefore: t0},
		} {
			q.Sort, q.Limit = sort, 10
			p, err := newPlan(q)
			require.NoError(t, err)
			for _, st := range p.streams {
				args := append(append([]any{}, st.args...), st.lo.t, st.lo.id, st.hi.t, st.hi.id, 10)
				if !st.timed {
					args = append(append([]any{}, st.args...), st.lo.id, st.hi.id, 10)
				}
				rows, err := s.r.QueryContext(ctx, "EXPLAIN QUERY PLAN "+st.q, args...)
				require.NoError(t, err, st.q)
				var plan []string
				for rows.Next() {
					var id, parent, unused int
					var detail string
					require.NoError(t, rows.Scan(&id, &parent, &unused, &detail))
					plan = append(plan, detail)
				}
				require.NoError(t, rows.Close())
				text := strings.Join(plan, "; ")
				require.NotContains(t, text, "TEMP B-TREE", st.q)
				require.True(t, strings.HasPrefix(plan[0], "SEARCH"), "%s: %s", st.q, text)
				bounds := []string{"id>", "id<"}
				if st.timed {
					bounds = []string{"_at,id)>", "_at,id)<"}
				}
				for _, b := range bounds {
					require.Contains(t, plan[0], b, "%s: the range is bounded both ways, by the cursor too: %s", st.q, text)
				}
				for _, step := range plan {
					if strings.Contains(step, " m ") || strings.HasPrefix(step, "CORRELATED") {
						continue // a further attribute, looked up by the row's id
					}
					require.NotContains(t, step, "SCAN", "%s: %s", st.q, text)
				}
			}
		}
	}
}

// TestReopenKeepsRowsAndPosition: a file database keeps its rows and
// position across a restart.
func TestReopenKeepsRowsAndPosition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v.db")
	s, err := Open(path)
	require.NoError(t, err)
	rows := dataset(100, 3)
	fill(t, s, rows, 42)
	require.NoError(t, s.Close())
	s, err = Open(path)
	require.NoError(t, err)
	defer s.Close()
	n, err := s.Count(ctx)
	require.NoError(t, err)
	require.Equal(t, len(rows), n)
	pos, err := s.Position(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(42), pos.Revision)
}
