package sqlitestore

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"modernc.org/libc"
	sqlite3 "modernc.org/sqlite/lib"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/visibility"
	"jetflow.dev/services/api/visibility/storeplan"
	"jetflow.dev/services/api/visibility/storetest"
)

var t0 = storetest.T0

func openTemp(t testing.TB) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "default.db"))
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// TestStore: the conformance suite, on a file and in memory.
func TestStore(t *testing.T) {
	t.Parallel()
	for _, mem := range []bool{false, true} {
		name := map[bool]string{false: "File", true: "Memory"}[mem]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			storetest.Run(t, func(t testing.TB, budget int) visibility.Store {
				var s *Store
				if mem {
					var err error
					s, err = Open("")
					require.NoError(t, err)
					t.Cleanup(func() { s.Close() })
				} else {
					s = openTemp(t)
				}
				if budget > 0 {
					s.budget = budget
				}
				return s
			})
		})
	}
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
			p, err := storeplan.New(q, maxID)
			require.NoError(t, err)
			for _, r := range p.Ranges {
				st := newRangeStmt(r)
				rows, err := s.r.QueryContext(ctx, "EXPLAIN QUERY PLAN "+st.q, st.argsFor(p.Bounds, 10)...)
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
				if r.Timed() {
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
	rows := storetest.Dataset(100, 3)
	storetest.Fill(t, s, rows)
	require.NoError(t, s.Apply(ctx, visibility.Batch{Position: visibility.Position{Revision: 142}}))
	require.NoError(t, s.Close())
	s, err = Open(path)
	require.NoError(t, err)
	defer s.Close()
	n, err := s.Count(ctx)
	require.NoError(t, err)
	require.Equal(t, len(rows), n)
	pos, err := s.Position(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(142), pos.Revision)
}

// TestMigratesVersion1: a database of schema version 1 (without the
// counts) keeps its rows and position, and gets its counts computed once
// from the rows, instead of being fed again from the bucket's start.
func TestMigratesVersion1(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "v1.db")
	s, err := Open(path)
	require.NoError(t, err)
	rows := storetest.Dataset(300, 5)
	storetest.Fill(t, s, rows)
	want, err := s.Counts(ctx, "")
	require.NoError(t, err)
	wantAlpha, err := s.Counts(ctx, "alpha")
	require.NoError(t, err)
	pos, err := s.Position(ctx)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	// Make it a version 1 database: no counts tables.
	db, err := sql.Open("sqlite", "file:"+path)
	require.NoError(t, err)
	for _, q := range []string{`DROP TABLE counts`, `DROP TABLE status_counts`, `UPDATE meta SET value = '1' WHERE key = 'schema'`} {
		_, err := db.ExecContext(ctx, q)
		require.NoError(t, err)
	}
	require.NoError(t, db.Close())

	s, err = Open(path)
	require.NoError(t, err)
	defer s.Close()
	got, err := s.Counts(ctx, "")
	require.NoError(t, err)
	require.Equal(t, want, got)
	gotAlpha, err := s.Counts(ctx, "alpha")
	require.NoError(t, err)
	require.Equal(t, wantAlpha, gotAlpha)
	n, err := s.Count(ctx)
	require.NoError(t, err)
	require.Equal(t, len(rows), n)
	p, err := s.Position(ctx)
	require.NoError(t, err)
	require.Equal(t, pos, p, "the position is kept: no feed from the start")
}

// TestOpenCacheBoundsThePageCaches: the writer's page cache is the size
// given (SQLite's cache_size, negative: in KiB), each reader's a quarter
// of it, on a file and in memory; Open keeps DefaultCacheBytes; a cache
// below MinCacheBytes is refused, naming the least.
func TestOpenCacheBoundsThePageCaches(t *testing.T) {
	t.Parallel()
	cacheSize := func(db *sql.DB) int {
		t.Helper()
		var n int
		require.NoError(t, db.QueryRowContext(t.Context(), "PRAGMA cache_size").Scan(&n))
		return n
	}
	for name, path := range map[string]string{"file": filepath.Join(t.TempDir(), "default.db"), "memory": ""} {
		s, err := OpenCache(path, 8<<20)
		require.NoError(t, err, name)
		require.Equal(t, -8192, cacheSize(s.w), "%s: the writer's", name)
		if path != "" {
			require.Equal(t, -2048, cacheSize(s.r), "%s: a reader's", name)
		}
		require.NoError(t, s.Close())
	}
	s := openTemp(t)
	require.Equal(t, -(DefaultCacheBytes >> 10), cacheSize(s.w))
	require.Equal(t, -(DefaultCacheBytes >> 12), cacheSize(s.r))

	_, err := OpenCache(filepath.Join(t.TempDir(), "small.db"), 64<<10)
	require.ErrorContains(t, err, "give at least 1048576")
}

// TestAnIdleWriterGivesItsPageCacheBack: once no batch comes for
// releaseAfter, the writer frees its page cache (SQLite's memory in use
// is mostly gone), keeps every row, and the next batch arms the next
// release.
func TestAnIdleWriterGivesItsPageCacheBack(t *testing.T) {
	t.Parallel()
	const cache = 2 << 20
	s, err := OpenCache(filepath.Join(t.TempDir(), "release.db"), cache)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	require.Equal(t, ReleaseAfter, s.releaseAfter)
	require.Equal(t, ReaderIdle, s.readerIdle)
	s.releaseMu.Lock()
	s.releaseAfter = time.Hour // not while it fills
	s.releaseMu.Unlock()

	rows := storetest.Dataset(5_000, 7) // about 4.5 MB of index: the cache fills
	storetest.Fill(t, s, rows)
	filled := writerCacheUsed(t, s)
	require.Greater(t, filled, int64(cache/2), "the fill must fill most of the cache for the release to show")
	require.Zero(t, s.released.Load())

	s.releaseMu.Lock()
	s.releaseAfter = 10 * time.Millisecond
	s.releaseMu.Unlock()
	s.releaseLater()
	require.Eventually(t, func() bool { return s.released.Load() == 1 }, time.Minute, 10*time.Millisecond)
	after := writerCacheUsed(t, s)
	require.Less(t, after, filled/8, "the writer's page cache: %d bytes filled, %d released", filled, after)
	t.Logf("the writer's page cache: %d bytes filled, %d released", filled, after)

	n, err := s.Count(t.Context())
	require.NoError(t, err)
	require.Equal(t, len(rows), n)
	last := rows[0].Rev
	for _, r := range rows {
		last = max(last, r.Rev)
	}
	require.NoError(t, s.Apply(t.Context(), visibility.Batch{Position: visibility.Position{Revision: last}}))
	require.Eventually(t, func() bool { return s.released.Load() == 2 }, time.Minute, 10*time.Millisecond, "a batch arms the next release")
}

// writerCacheUsed is the memory the writer's page cache holds
// (sqlite3_db_status, SQLITE_DBSTATUS_CACHE_USED: the driver builds
// SQLite without its process-wide memory statistics). It reaches the
// connection's handle by reflection: a driver that renames it fails here,
// not silently.
func writerCacheUsed(t *testing.T, s *Store) int64 {
	t.Helper()
	c, err := s.w.Conn(t.Context())
	require.NoError(t, err)
	defer c.Close()
	var used int64
	require.NoError(t, c.Raw(func(dc any) error {
		v := reflect.ValueOf(dc)
		if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
			return fmt.Errorf("the driver's connection is a %T", dc)
		}
		db := v.Elem().FieldByName("db")
		if !db.IsValid() || db.Kind() != reflect.Uintptr {
			return fmt.Errorf("the driver's connection %T has no db handle", dc)
		}
		tls := libc.NewTLS()
		defer tls.Close()
		// SQLite writes to memory of its allocator's (outside Go's heap,
		// where the race detector's pointer checks allow its arithmetic).
		p := tls.Alloc(16)
		defer tls.Free(16)
		if rc := sqlite3.Xsqlite3_db_status(tls, uintptr(db.Uint()), sqlite3.SQLITE_DBSTATUS_CACHE_USED, p, p+8, 0); rc != sqlite3.SQLITE_OK {
			return fmt.Errorf("sqlite3_db_status: %d", rc)
		}
		used = int64(*(*int32)(unsafe.Add(unsafe.Pointer(nil), p)))
		return nil
	}))
	return used
}

// TestIdleReadersClose: a reader's connection, and its page cache, is
// closed once it has been idle for readerIdle.
func TestIdleReadersClose(t *testing.T) {
	t.Parallel()
	s, err := openCache(filepath.Join(t.TempDir(), "readers.db"), MinCacheBytes, ReleaseAfter, 50*time.Millisecond)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	storetest.Fill(t, s, storetest.Dataset(100, 3))
	n, err := s.Count(t.Context())
	require.NoError(t, err)
	require.Positive(t, n)
	require.Eventually(t, func() bool {
		st := s.r.Stats()
		return st.MaxIdleTimeClosed > 0 && st.OpenConnections == 0
	}, time.Minute, 10*time.Millisecond, "the reader's connection closed once idle")
}
