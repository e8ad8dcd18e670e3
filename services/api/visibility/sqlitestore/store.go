// Package sqlitestore is the visibility index's embedded store: a SQLite
// database (through modernc.org/sqlite, a translation of SQLite to Go,
// so the api stays one static binary without cgo) in a file, or in
// memory. Each index a query can use is listed in schema, and every
// query names the index it scans (INDEXED BY): a query SQLite could only
// answer by scanning the table fails instead of slowing down.
package sqlitestore

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // the database/sql driver "sqlite"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/visibility"
	"jetflow.dev/services/api/visibility/storeplan"
)

// schemaVersion changes with the schema: a database of another version
// is dropped and fed again (it is a projection), but for version 1,
// which lacked the counts by status: migrate computes them once from the
// rows, a scan of the table instead of a feed from the bucket's start.
const schemaVersion = "2"

// Store is a visibility.Store in SQLite.
type Store struct {
	// w is the writer's connection, r the readers' (the same pool of one
	// connection for a database in memory). With a file, readers see the
	// last committed batch while the next one is written (WAL).
	w, r *sql.DB
	// stmts caches prepared queries by text: their shapes are few.
	stmtsMu sync.Mutex
	stmts   map[string]*sql.Stmt
	// examined counts the index entries queries examined, and budget
	// bounds them per query (visibility.ScanBudget; tests make it smaller).
	examined atomic.Int64
	budget   int
	path     string

	// The writer gives its page cache back (releaseCache) once no batch
	// was applied for releaseAfter (ReleaseAfter): armed by Apply, nil
	// for a database in memory, whose pages are the database.
	releaseMu    sync.Mutex
	release      *time.Timer
	releaseAfter time.Duration
	readerIdle   time.Duration // ReaderIdle
	closed       bool
	released     atomic.Int64 // times the writer gave its cache back
}

var _ visibility.Store = (*Store)(nil)

// DefaultCacheBytes is the page cache of the index's writer (SQLite's
// cache_size), which OpenCache takes; each of its readers keeps a
// quarter of it. At 100,000 executions the writer's is full (the index is
// about 0.9 KB an execution); a smaller one fills a large index more
// slowly (8 MiB: 8-24% fewer rows a second at 200,000, docs/benchmarks.md).
const DefaultCacheBytes = 64 << 20

// ReleaseAfter is how long the writer keeps its page cache once no
// batch comes: then it gives it back (PRAGMA shrink_memory), as an idle
// index's readers close after ReaderIdle. A full cache is DefaultCacheBytes
// of pages (more in the process: each page is an allocation of its own),
// which an api whose executions all wait (a sleep, a signal) would hold
// for nothing; the next batch reads the pages it needs from the file (the
// OS's cache, most of the time) again. nats-server drops its streams'
// block caches after as long.
const ReleaseAfter = 10 * time.Second

// ReaderIdle is how long a reader's connection, and its page cache, is
// kept with no query (database/sql closes idle connections once it is
// past, looking every ReaderIdle: a minute or two).
const ReaderIdle = time.Minute

// MinCacheBytes is the smallest page cache OpenCache takes.
const MinCacheBytes = 1 << 20

// CacheBytes returns the writer's page cache as SQLite has it, in bytes
// (a negative cache_size is in KiB; a positive one, in pages).
func (s *Store) CacheBytes(ctx context.Context) (int, error) {
	var n, page int
	if err := s.w.QueryRowContext(ctx, "PRAGMA cache_size").Scan(&n); err != nil {
		return 0, fmt.Errorf("visibility: cache_size: %w", err)
	}
	if n < 0 {
		return -n << 10, nil
	}
	if err := s.w.QueryRowContext(ctx, "PRAGMA page_size").Scan(&page); err != nil {
		return 0, fmt.Errorf("visibility: page_size: %w", err)
	}
	return n * page, nil
}

// Open opens (or creates) the index at path, a file; "" keeps it in
// memory, empty at every start. Its writer's page cache is
// DefaultCacheBytes.
func Open(path string) (*Store, error) { return OpenCache(path, DefaultCacheBytes) }

// OpenCache is Open with the writer's page cache bounded to cacheBytes
// (at least MinCacheBytes; 0: DefaultCacheBytes), and each reader's to a
// quarter of it. A database in memory is as large as the index, whatever
// its cache.
func OpenCache(path string, cacheBytes int) (*Store, error) {
	return openCache(path, cacheBytes, ReleaseAfter, ReaderIdle)
}

// openCache is OpenCache with the times after which an idle writer gives
// its page cache back and an idle reader's connection closes (tests
// make them shorter).
func openCache(path string, cacheBytes int, releaseAfter, readerIdle time.Duration) (*Store, error) {
	cacheBytes = cmp.Or(cacheBytes, DefaultCacheBytes)
	if cacheBytes < MinCacheBytes {
		return nil, fmt.Errorf("visibility: a page cache of %d bytes: give at least %d", cacheBytes, MinCacheBytes)
	}
	// cache_size(-N) is N KiB.
	writerCache := fmt.Sprintf("&_pragma=cache_size(-%d)", cacheBytes>>10)
	readerCache := fmt.Sprintf("&_pragma=cache_size(-%d)", cacheBytes>>12)
	s := &Store{stmts: map[string]*sql.Stmt{}, path: path, budget: visibility.ScanBudget, releaseAfter: releaseAfter, readerIdle: readerIdle}
	pragmas := "_pragma=busy_timeout(10000)&_pragma=foreign_keys(0)&_pragma=temp_store(memory)"
	var err error
	if path == "" {
		// One connection: each connection to :memory: is a database of
		// its own. Readers wait for a batch being written (at most
		// BatchMax rows).
		if s.w, err = sql.Open("sqlite", "file::memory:?"+pragmas+writerCache); err != nil {
			return nil, fmt.Errorf("visibility: open: %w", err)
		}
		s.w.SetMaxOpenConns(1)
		s.w.SetMaxIdleConns(1)
		s.w.SetConnMaxLifetime(0)
		s.w.SetConnMaxIdleTime(0)
		s.r = s.w
	} else {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return nil, fmt.Errorf("visibility: %w", err)
		}
		// A projection: synchronous=NORMAL may lose the last batches on a
		// power cut, never the consistency of a batch with its position,
		// and the feed applies them again.
		dsn := "file:" + (&url.URL{Path: path}).EscapedPath() + "?" + pragmas + "&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
		if s.w, err = sql.Open("sqlite", dsn+writerCache+"&_txlock=immediate"); err != nil {
			return nil, fmt.Errorf("visibility: open %s: %w", path, err)
		}
		s.w.SetMaxOpenConns(1)
		// Bounded memory: each reader's page cache is a quarter of the
		// writer's at most.
		if s.r, err = sql.Open("sqlite", dsn+readerCache+"&_pragma=query_only(1)"); err != nil {
			s.w.Close()
			return nil, fmt.Errorf("visibility: open %s: %w", path, err)
		}
		s.r.SetMaxOpenConns(4)
		s.r.SetMaxIdleConns(4)
		s.r.SetConnMaxIdleTime(s.readerIdle)
	}
	if err := s.migrate(context.Background()); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Path is the database's file ("" in memory).
func (s *Store) Path() string { return s.path }

// schema is the tables and indexes. For each order (id, start, end) a
// list scans one of three indexes: by status, by workflow and status,
// or the damaged executions (a partial index: they are few); a list
// filtered by a search attribute scans the attributes' index for that
// order. A list without a status filter merges the ranges of each status
// (visibility.Statuses), each in order, which spares an index per order
// without the status. The id ends every index, so ties in time are
// ordered, and a cursor (time, id) names a place exactly on every api,
// whose indexes are each their own. The indexes by end hold running
// executions too (ended_at 0), below the range of any list by end: a
// partial index would need its condition in the query, which SQLite
// then takes as the range's lower bound instead of the cursor.
var schema = []string{
	`CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID`,
	`CREATE TABLE executions (
		id TEXT PRIMARY KEY,
		workflow TEXT NOT NULL,
		version INTEGER NOT NULL,
		status TEXT NOT NULL,
		started_at INTEGER NOT NULL,
		ended_at INTEGER NOT NULL,
		updated_at INTEGER NOT NULL,
		steps INTEGER NOT NULL,
		done INTEGER NOT NULL,
		error TEXT NOT NULL,
		damaged TEXT,
		attrs TEXT,
		rev INTEGER NOT NULL
	) WITHOUT ROWID`,
	`CREATE INDEX ex_status_id ON executions (status, id)`,
	`CREATE INDEX ex_workflow_status_id ON executions (workflow, status, id)`,
	`CREATE INDEX ex_damaged_id ON executions (id) WHERE damaged IS NOT NULL`,
	`CREATE INDEX ex_status_started ON executions (status, started_at, id)`,
	`CREATE INDEX ex_workflow_status_started ON executions (workflow, status, started_at, id)`,
	`CREATE INDEX ex_damaged_started ON executions (started_at, id) WHERE damaged IS NOT NULL`,
	`CREATE INDEX ex_status_ended ON executions (status, ended_at, id)`,
	`CREATE INDEX ex_workflow_status_ended ON executions (workflow, status, ended_at, id)`,
	`CREATE INDEX ex_damaged_ended ON executions (ended_at, id) WHERE damaged IS NOT NULL`,
	`CREATE TABLE attrs (
		id TEXT NOT NULL,
		name TEXT NOT NULL,
		value TEXT NOT NULL,
		started_at INTEGER NOT NULL,
		ended_at INTEGER NOT NULL,
		PRIMARY KEY (id, name)
	) WITHOUT ROWID`,
	`CREATE INDEX at_id ON attrs (name, value, id)`,
	`CREATE INDEX at_started ON attrs (name, value, started_at, id)`,
	`CREATE INDEX at_ended ON attrs (name, value, ended_at, id)`,
	countsSchema[0],
	countsSchema[1],
}

// countsSchema keeps the number of rows by workflow and status, and by
// status, which Apply changes with the rows: Counts reads a row per
// status (8 at most), never the rows.
var countsSchema = [2]string{`CREATE TABLE counts (
		workflow TEXT NOT NULL,
		status TEXT NOT NULL,
		n INTEGER NOT NULL,
		PRIMARY KEY (workflow, status)
	) WITHOUT ROWID`,
	`CREATE TABLE status_counts (status TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID`}

// countsOf count the rows, for a database of version 1.
var countsOf = [2]string{
	`INSERT INTO counts (workflow, status, n) SELECT workflow, status, count(*) FROM executions GROUP BY workflow, status`,
	`INSERT INTO status_counts (status, n) SELECT status, count(*) FROM executions GROUP BY status`}

// migrate makes the schema, or drops a database of another version.
func (s *Store) migrate(ctx context.Context) error {
	var v string
	if err := s.w.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'schema'`).Scan(&v); err != nil {
		v = "" // no database yet (or not one of ours)
	}
	if v == schemaVersion {
		return nil
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("visibility: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if v == "1" {
		// Version 1 lacked the counts: count the rows once.
		for _, q := range []string{countsSchema[0], countsSchema[1], countsOf[0], countsOf[1], `UPDATE meta SET value = '` + schemaVersion + `' WHERE key = 'schema'`} {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("visibility: migrate from version 1: %w", err)
			}
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("visibility: migrate from version 1: %w", err)
		}
		return nil
	}
	for _, t := range []string{"status_counts", "counts", "attrs", "executions", "meta"} {
		if _, err := tx.ExecContext(ctx, `DROP TABLE IF EXISTS `+t); err != nil {
			return fmt.Errorf("visibility: migrate: %w", err)
		}
	}
	for _, q := range schema {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("visibility: migrate: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('schema', ?)`, schemaVersion); err != nil {
		return fmt.Errorf("visibility: migrate: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("visibility: migrate: %w", err)
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error {
	s.releaseMu.Lock()
	s.closed = true
	if s.release != nil {
		s.release.Stop()
	}
	s.releaseMu.Unlock()
	s.stmtsMu.Lock()
	for _, st := range s.stmts {
		_ = st.Close()
	}
	s.stmts = nil
	s.stmtsMu.Unlock()
	err := s.w.Close()
	if s.r != s.w {
		err = cmp.Or(err, s.r.Close())
	}
	return err
}

const (
	upsertRow = `INSERT INTO executions (id, workflow, version, status, started_at, ended_at, updated_at, steps, done, error, damaged, attrs, rev)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET workflow = excluded.workflow, version = excluded.version, status = excluded.status,
			started_at = excluded.started_at, ended_at = excluded.ended_at, updated_at = excluded.updated_at, steps = excluded.steps,
			done = excluded.done, error = excluded.error, damaged = excluded.damaged, attrs = excluded.attrs, rev = excluded.rev
		WHERE excluded.rev > executions.rev`
	deleteAttrs = `DELETE FROM attrs WHERE id = ?`
	insertAttr  = `INSERT INTO attrs (id, name, value, started_at, ended_at) VALUES (?, ?, ?, ?, ?)`
	deleteRow   = `DELETE FROM executions WHERE id = ? AND rev < ?`
	addCount    = `INSERT INTO counts (workflow, status, n) VALUES (?, ?, ?) ON CONFLICT (workflow, status) DO UPDATE SET n = n + excluded.n`
	addTotal    = `INSERT INTO status_counts (status, n) VALUES (?, ?) ON CONFLICT (status) DO UPDATE SET n = n + excluded.n`
	putMeta     = `INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`
)

// countKey is a row of the counts table.
type countKey struct{ workflow, status string }

// storedRow is what Apply needs of a stored row: what it counted as, and
// its revision.
type storedRow struct {
	countKey
	rev int64
}

// storedRowsAtOnce is how many ids one query of storedRows looks up
// (SQLite allows 32,766 parameters a statement).
const storedRowsAtOnce = 500

// storedRows reads the stored rows of the executions b changes (those
// after the position's revision stored), storedRowsAtOnce a query: one
// query a row was most of a batch's statements.
func storedRows(ctx context.Context, tx *sql.Tx, b visibility.Batch, stored int64) (map[string]storedRow, error) {
	var ids []any
	seen := map[string]bool{}
	add := func(id string, rev uint64) {
		if int64(rev) > stored && !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	for _, r := range b.Puts {
		add(r.ID, r.Rev)
	}
	for _, d := range b.Deletes {
		add(d.ID, d.Rev)
	}
	out := make(map[string]storedRow, len(ids))
	for len(ids) > 0 {
		n := min(storedRowsAtOnce, len(ids))
		q := `SELECT id, workflow, status, rev FROM executions WHERE id IN (?` + strings.Repeat(", ?", n-1) + `)`
		if err := readStoredRows(ctx, tx, q, ids[:n], out); err != nil {
			return nil, err
		}
		ids = ids[n:]
	}
	return out, nil
}

// readStoredRows runs one query of storedRows into out.
func readStoredRows(ctx context.Context, tx *sql.Tx, q string, ids []any, out map[string]storedRow) error {
	rows, err := tx.QueryContext(ctx, q, ids...)
	if err != nil {
		return fmt.Errorf("visibility: read the stored rows: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var r storedRow
		if err := rows.Scan(&id, &r.workflow, &r.status, &r.rev); err != nil {
			return fmt.Errorf("visibility: read the stored rows: %w", err)
		}
		out[id] = r
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("visibility: read the stored rows: %w", err)
	}
	return nil
}

// Apply implements visibility.Store.
func (s *Store) Apply(ctx context.Context, b visibility.Batch) error {
	defer s.releaseLater()
	// ctx ending (a stop) gives up the wait for the write lock, or rolls
	// the transaction back (database/sql watches it): the batch is applied
	// whole or not at all, and again by the next feed. Its statements run
	// without ctx: for each statement under a context that can end,
	// database/sql and the driver start a goroutine to watch it, three or
	// four a row written.
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	defer func() { _ = tx.Rollback() }()
	var stored int64 // the position's revision: updates up to it are applied
	var v string
	switch err := tx.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'revision'`).Scan(&v); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return fmt.Errorf("visibility: read the position: %w", err)
	default:
		if stored, err = strconv.ParseInt(v, 10, 64); err != nil {
			return fmt.Errorf("visibility: position revision %q: %w", v, err)
		}
	}
	prep := func(q string) (*sql.Stmt, error) { return tx.PrepareContext(ctx, q) }
	rows, err := storedRows(ctx, tx, b, stored)
	if err != nil {
		return err
	}
	upsert, err := prep(upsertRow)
	if err != nil {
		return err
	}
	delAttrs, err := prep(deleteAttrs)
	if err != nil {
		return err
	}
	insAttr, err := prep(insertAttr)
	if err != nil {
		return err
	}
	delRow, err := prep(deleteRow)
	if err != nil {
		return err
	}
	deltas := map[countKey]int{}
	for _, r := range b.Puts {
		if int64(r.Rev) <= stored {
			continue // applied already
		}
		was, ok := rows[r.ID]
		if ok && was.rev >= int64(r.Rev) {
			continue // the stored row is as new
		}
		var damaged, attrs any
		if r.Damaged != nil {
			d, err := json.Marshal(r.Damaged)
			if err != nil {
				return err
			}
			damaged = string(d)
		}
		if len(r.Attrs) > 0 {
			a, err := json.Marshal(r.Attrs)
			if err != nil {
				return err
			}
			attrs = string(a)
		}
		started, ended := visibility.UnixNano(r.StartedAt), visibility.UnixNano(r.EndedAt)
		if _, err := upsert.ExecContext(ctx, r.ID, r.Workflow, r.Version, string(r.Status), started, ended,
			visibility.UnixNano(r.UpdatedAt), r.Steps, r.Done, r.Error, damaged, attrs, int64(r.Rev)); err != nil {
			return fmt.Errorf("row %s: %w", r.ID, err)
		}
		if ok {
			deltas[was.countKey]--
		}
		now := countKey{r.Workflow, string(r.Status)}
		deltas[now]++
		rows[r.ID] = storedRow{now, int64(r.Rev)} // a later update of it in the batch counts from this one
		if _, err := delAttrs.ExecContext(ctx, r.ID); err != nil {
			return err
		}
		for name, v := range r.Attrs {
			if _, err := insAttr.ExecContext(ctx, r.ID, name, v, started, ended); err != nil {
				return fmt.Errorf("row %s: attribute %s: %w", r.ID, name, err)
			}
		}
	}
	for _, d := range b.Deletes {
		if int64(d.Rev) <= stored {
			continue
		}
		was, ok := rows[d.ID]
		if !ok {
			continue
		}
		res, err := delRow.ExecContext(ctx, d.ID, int64(d.Rev))
		if err != nil {
			return fmt.Errorf("row %s: %w", d.ID, err)
		}
		if n, _ := res.RowsAffected(); n > 0 {
			deltas[was.countKey]--
			delete(rows, d.ID)
			if _, err := delAttrs.ExecContext(ctx, d.ID); err != nil {
				return err
			}
		}
	}
	totals := map[string]int{}
	for k, n := range deltas {
		if n == 0 {
			continue
		}
		totals[k.status] += n
		if _, err := tx.ExecContext(ctx, addCount, k.workflow, k.status, n); err != nil {
			return fmt.Errorf("visibility: count: %w", err)
		}
	}
	for st, n := range totals {
		if _, err := tx.ExecContext(ctx, addTotal, st, n); err != nil {
			return fmt.Errorf("visibility: count: %w", err)
		}
	}
	if len(deltas) > 0 {
		for _, q := range []string{`DELETE FROM counts WHERE n = 0`, `DELETE FROM status_counts WHERE n = 0`} {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("visibility: count: %w", err)
			}
		}
	}
	// The position never goes backwards, nor does the time it was last
	// known live (two feeds writing one index: the slower one's tick at
	// the same revision is older).
	if p := b.Position; int64(p.Revision) >= stored {
		liveAt := visibility.UnixNano(p.LiveAt)
		var was string
		if err := tx.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'live_at'`).Scan(&was); err == nil {
			if n, err := strconv.ParseInt(was, 10, 64); err == nil {
				liveAt = max(liveAt, n)
			}
		} else if !errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("visibility: read the position: %w", err)
		}
		for k, v := range map[string]string{
			"revision": strconv.FormatUint(p.Revision, 10),
			"stream":   strconv.FormatInt(visibility.UnixNano(p.Stream), 10),
			"live_at":  strconv.FormatInt(liveAt, 10),
		} {
			if _, err := tx.ExecContext(ctx, putMeta, k, v); err != nil {
				return err
			}
		}
	}
	return tx.Commit()
}

// releaseLater has the writer give its page cache back releaseAfter
// from now, unless another batch comes first.
func (s *Store) releaseLater() {
	if s.r == s.w {
		return // in memory: the pages are the database
	}
	s.releaseMu.Lock()
	defer s.releaseMu.Unlock()
	switch {
	case s.closed:
	case s.release == nil:
		s.release = time.AfterFunc(s.releaseAfter, s.releaseCache)
	default:
		s.release.Reset(s.releaseAfter)
	}
}

// releaseCache frees the writer's page cache (the pages not in use: all
// of them, between batches). A batch that came meanwhile waits for it
// (the writer is one connection) and arms the next release. It can fail
// only with the store closed, or a shrink that outlasts a minute: either
// way the cache stays as bounded as before, and the next batch arms
// another release.
func (s *Store) releaseCache() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := s.w.ExecContext(ctx, "PRAGMA shrink_memory"); err == nil {
		s.released.Add(1)
	}
}

// Position implements visibility.Store.
func (s *Store) Position(ctx context.Context) (visibility.Position, error) {
	var p visibility.Position
	rows, err := s.w.QueryContext(ctx, `SELECT key, value FROM meta WHERE key IN ('revision', 'stream', 'live_at')`)
	if err != nil {
		return p, fmt.Errorf("visibility: read the position: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return p, err
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return p, fmt.Errorf("visibility: position %s %q: %w", k, v, err)
		}
		switch k {
		case "revision":
			p.Revision = uint64(n)
		case "stream":
			p.Stream = visibility.FromUnixNano(n)
		case "live_at":
			p.LiveAt = visibility.FromUnixNano(n)
		}
	}
	return p, rows.Err()
}

// Reset implements visibility.Store.
func (s *Store) Reset(ctx context.Context) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	for _, q := range []string{`DELETE FROM status_counts`, `DELETE FROM counts`, `DELETE FROM attrs`, `DELETE FROM executions`, `DELETE FROM meta WHERE key <> 'schema'`} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// Count implements visibility.Store.
func (s *Store) Count(ctx context.Context) (int, error) {
	var n int
	err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM executions`).Scan(&n)
	return n, err
}

// Counts implements visibility.Store: a row per status, of the
// workflow's counts or of the totals.
func (s *Store) Counts(ctx context.Context, workflow string) (map[projections.Status]int, error) {
	q, args := `SELECT status, n FROM status_counts`, []any{}
	if workflow != "" {
		q, args = `SELECT status, n FROM counts WHERE workflow = ?`, []any{workflow}
	}
	rows, err := s.r.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("visibility: counts: %w", err)
	}
	defer rows.Close()
	return storeplan.ScanCounts(rows)
}

// Examined is how many index entries queries examined so far (tests
// check that scans are bounded).
func (s *Store) Examined() int64 { return s.examined.Load() }

// Size is the database's size in bytes (pages in use and free).
func (s *Store) Size(ctx context.Context) (int64, error) {
	var pages, size int64
	if err := s.r.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages); err != nil {
		return 0, err
	}
	if err := s.r.QueryRowContext(ctx, `PRAGMA page_size`).Scan(&size); err != nil {
		return 0, err
	}
	return pages * size, nil
}

// stmt returns the prepared statement of q.
func (s *Store) stmt(ctx context.Context, q string) (*sql.Stmt, error) {
	s.stmtsMu.Lock()
	defer s.stmtsMu.Unlock()
	if s.stmts == nil {
		return nil, errors.New("visibility: store closed")
	}
	if st, ok := s.stmts[q]; ok {
		return st, nil
	}
	st, err := s.r.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	s.stmts[q] = st // the shapes of queries are a few hundred at most
	return st, nil
}
