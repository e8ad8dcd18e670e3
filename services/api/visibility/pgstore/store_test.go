package pgstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/visibility"
	"jetflow.dev/services/api/visibility/storeplan"
	"jetflow.dev/services/api/visibility/storetest"
)

// freshSchema is a schema name no other test uses.
func freshSchema(t testing.TB) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "test_" + strings.ToLower(strings.NewReplacer("/", "_", "-", "_").Replace(t.Name()))[:min(20, len(t.Name()))] + "_" + hex.EncodeToString(b)
}

// openFresh opens a store in a schema of its own, dropped when the test
// ends.
func openFresh(t testing.TB, url, schema string) *Store {
	t.Helper()
	s, err := Open(context.Background(), url, schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, s.Drop(ctx))
		s.Close()
	})
	return s
}

// TestStore: the conformance suite every store runs.
func TestStore(t *testing.T) {
	t.Parallel()
	url := storetest.PostgresURL(t)
	storetest.Run(t, func(t testing.TB, budget int) visibility.Store {
		s := openFresh(t, url, freshSchema(t))
		if budget > 0 {
			s.budget = budget
		}
		return s
	})
}

// TestReopenKeepsRowsAndPosition: a second store on the schema (an api
// restarted, or another replica) sees the rows and position, and the
// tables are not made again.
func TestReopenKeepsRowsAndPosition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := storetest.PostgresURL(t)
	schema := freshSchema(t)
	s := openFresh(t, url, schema)
	rows := storetest.Dataset(200, 3)
	storetest.Fill(t, s, rows)
	s2, err := Open(ctx, url, schema)
	require.NoError(t, err)
	defer s2.Close()
	n, err := s2.Count(ctx)
	require.NoError(t, err)
	require.Equal(t, len(rows), n)
	p, err := s2.Position(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(len(storetest.Dataset(200, 3))), uint64(len(rows)))
	require.NotZero(t, p.Revision)
}

// TestTwoWritersShareAnIndex: two stores on one schema (two apis) write
// batches at once, each from its own position, one behind the other:
// the rows, counts and position are those of one writer alone. A reset
// by one makes the other's next Apply fail with ErrReset, until it reads
// the position again.
func TestTwoWritersShareAnIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := storetest.PostgresURL(t)
	schema := freshSchema(t)
	a := openFresh(t, url, schema)
	b, err := Open(ctx, url, schema)
	require.NoError(t, err)
	defer b.Close()

	// The updates of a bucket: rows put, changed and deleted, by revision.
	var batches []visibility.Batch
	model := map[string]visibility.Row{}
	rev := uint64(0)
	for i := range 30 {
		var bt visibility.Batch
		for j := range 40 {
			rev++
			id := "r-" + string(rune('a'+(i*7+j)%26)) + string(rune('a'+j%13))
			if _, ok := model[id]; ok && j%5 == 0 {
				bt.Deletes = append(bt.Deletes, visibility.Delete{ID: id, Rev: rev})
				delete(model, id)
				continue
			}
			r := visibility.Row{ID: id, Workflow: []string{"w1", "w2"}[j%2], Status: visibility.Statuses[2+(i+j)%6], StartedAt: storetest.T0, Rev: rev}
			bt.Puts = append(bt.Puts, r)
			model[id] = r
		}
		bt.Position = visibility.Position{Revision: rev}
		batches = append(batches, bt)
	}
	// a feeds the whole bucket; b starts once a has written 3 batches,
	// from the position it reads then, as a feed does: from then on each
	// Apply runs while the other's may, and either may be behind.
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	started := make(chan struct{})
	wg.Add(2)
	go func() {
		defer wg.Done()
		for j, bt := range batches {
			if err := a.Apply(ctx, bt); err != nil {
				errs <- err
				return
			}
			if j == 2 {
				close(started)
			}
		}
	}()
	go func() {
		defer wg.Done()
		<-started
		p, err := b.Position(ctx)
		if err != nil {
			errs <- err
			return
		}
		for _, bt := range batches {
			if bt.Position.Revision <= p.Revision {
				continue
			}
			if err := b.Apply(ctx, bt); err != nil {
				errs <- err
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	n, err := a.Count(ctx)
	require.NoError(t, err)
	require.Equal(t, len(model), n)
	want := map[projections.Status]int{}
	for _, r := range model {
		want[r.Status]++
	}
	got, err := b.Counts(ctx, "")
	require.NoError(t, err)
	require.Equal(t, want, got)
	ids, _ := storetest.Pages(t, a, visibility.Query{Sort: visibility.SortID, Limit: 1000})
	require.Len(t, ids, len(model))
	for _, id := range ids {
		require.Contains(t, model, id)
	}
	p, err := b.Position(ctx)
	require.NoError(t, err)
	require.Equal(t, rev, p.Revision)

	// a resets: b's next write is refused until it reads the position.
	require.NoError(t, a.Reset(ctx))
	err = b.Apply(ctx, batches[len(batches)-1])
	require.True(t, errors.Is(err, visibility.ErrReset), "%v", err)
	n, err = a.Count(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing written into the index fed again")
	p, err = b.Position(ctx)
	require.NoError(t, err)
	require.Zero(t, p.Revision)
	require.NoError(t, b.Apply(ctx, batches[0]))
}

// TestOpenRefusesABadURL: a URL that is not one is a clear error.
func TestOpenRefusesABadURL(t *testing.T) {
	t.Parallel()
	_, err := Open(context.Background(), "postgres://[::1", "x")
	require.ErrorContains(t, err, "PostgreSQL URL")
}

// TestCheckURLSaysWhatIsWrong: a bad URL's error says what pgx found
// wrong with it (a bad pool setting is not "not a URL" alone), and never
// the password it holds.
func TestCheckURLSaysWhatIsWrong(t *testing.T) {
	t.Parallel()
	for url, want := range map[string]string{
		"postgres://u:s3cr3t@h/db?pool_max_conns=abc": "cannot parse pool_max_conns",
		"postgres://u:s3cr3t@h:port/db":               "invalid port",
		"host=h password=s3cr3t port=x":               "invalid port",
		"postgres://u:s3cr3t@[::1":                    "not a PostgreSQL URL",
		"postgres://u@h/db?password=s3cr3t&port=x":    "invalid port",
		// pgx's wrapped errors quote the input (an independent review).
		"host=h password=s3cr3t horse dbname=x": "failed to parse as keyword/value",
		"postgres://u@h/db?password=abc&s3cr3t": "failed to parse as URL",
		"host=h password='s3cr3t":               "not a PostgreSQL URL",
	} {
		err := CheckURL(url)
		require.ErrorContains(t, err, want, url)
		require.NotContains(t, err.Error(), "s3cr3t", url)
	}
	require.NoError(t, CheckURL("postgres://u:s3cr3t@h/db?pool_max_conns=4"))
}

// TestEveryQueryIsAnIndexScan: each shape of query is answered by an
// index scan in the order of the list: no scan of a table, no sort of
// what was read.
func TestEveryQueryIsAnIndexScan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := openFresh(t, storetest.PostgresURL(t), freshSchema(t))
	storetest.Fill(t, s, storetest.Dataset(5000, 9))
	_, err := s.pool.Exec(ctx, `ANALYZE `+s.t("executions")+`, `+s.t("attrs"))
	require.NoError(t, err)
	// Plans for any value, as a prepared statement gets after a few runs:
	// the plan must be the index's whatever the status (one with no row
	// is read best from its index, and worst by a scan of the primary
	// key filtered by status).
	conn, err := s.pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	t0 := storetest.T0
	at := []visibility.Attr{{Name: "customer", Value: "acme"}, {Name: "tier", Value: "gold"}}
	for _, sort := range visibility.Sorts {
		for _, q := range []visibility.Query{
			{}, {Workflow: "alpha"}, {Status: projections.StatusStarted}, {Workflow: "alpha", Status: projections.StatusStarted},
			{Damaged: true}, {Attrs: at[:1]}, {Attrs: at}, {StartedAfter: t0, EndedBefore: t0},
		} {
			q.Sort, q.Limit = sort, 10
			p, err := storeplan.New(q, maxID)
			require.NoError(t, err)
			for _, r := range p.Ranges {
				st := s.newRangeStmt(r)
				for _, excl := range []bool{false, true} {
					b := p.Bounds
					b.LoExcl = excl
					text, args := st.textFor(b, 10)
					rows, err := conn.Query(ctx, "EXPLAIN "+text, args...)
					require.NoError(t, err, text)
					var plan []string
					for rows.Next() {
						var line string
						require.NoError(t, rows.Scan(&line))
						plan = append(plan, line)
					}
					rows.Close()
					require.NoError(t, rows.Err())
					all := strings.Join(plan, "\n")
					require.Contains(t, all, "Index", "%s:\n%s", text, all)
					for _, line := range plan {
						l := strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(line), "->"))
						require.False(t, strings.HasPrefix(l, "Seq Scan"), "%s: a table scan:\n%s", text, all)
						require.False(t, strings.HasPrefix(l, "Sort") || strings.HasPrefix(l, "Incremental Sort"), "%s: a sort:\n%s", text, all)
					}
				}
			}
		}
	}
}

// TestApisOpeningTogetherShareOneIndex: apis that open a new index at the
// same moment (the first rollout of several replicas) make it once: each
// row any of them writes stays. And an index of a newer version is
// refused, not dropped.
func TestApisOpeningTogetherShareOneIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := storetest.PostgresURL(t)
	for round := range 5 {
		schema := freshSchema(t)
		const apis = 3
		stores := make([]*Store, apis)
		var wg sync.WaitGroup
		errs := make(chan error, apis)
		for i := range apis {
			wg.Go(func() {
				s, err := Open(ctx, url, schema)
				if err != nil {
					errs <- err
					return
				}
				stores[i] = s
				pos, err := s.Position(ctx)
				if err != nil {
					errs <- err
					return
				}
				errs <- s.Apply(ctx, visibility.Batch{Puts: []visibility.Row{{ID: fmt.Sprintf("r-%d", i), Workflow: "w",
					Status: projections.StatusStarted, StartedAt: storetest.T0, Rev: uint64(i + 1)}}, Position: pos})
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err, "round %d", round)
		}
		n, err := stores[0].Count(ctx)
		require.NoError(t, err)
		require.Equal(t, apis, n, "round %d: every api's row stays", round)
		for _, s := range stores[1:] {
			s.Close()
		}
		drop := stores[0]
		if round == 0 {
			// A newer version's index: refused, and left as it is.
			_, err := drop.pool.Exec(ctx, `UPDATE `+drop.t("state")+` SET version = $1`, schemaVersion+1)
			require.NoError(t, err)
			_, err = Open(ctx, url, schema)
			require.ErrorContains(t, err, "is of a newer jetflow")
			_, err = drop.pool.Exec(ctx, `UPDATE `+drop.t("state")+` SET version = $1`, schemaVersion)
			require.NoError(t, err)
			n, err := drop.Count(ctx)
			require.NoError(t, err)
			require.Equal(t, apis, n, "not dropped")
		}
		require.NoError(t, drop.Drop(ctx))
		drop.Close()
	}
}
