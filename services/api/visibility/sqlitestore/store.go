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
	"sync"
	"sync/atomic"

	_ "modernc.org/sqlite" // the database/sql driver "sqlite"

	"jetflow.dev/services/api/visibility"
)

// schemaVersion changes with the schema: a database of another version
// is dropped and fed again (it is a projection).
const schemaVersion = "1"

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
}

var _ visibility.Store = (*Store)(nil)

// Open opens (or creates) the index at path, a file; "" keeps it in
// memory, empty at every start.
func Open(path string) (*Store, error) {
	s := &Store{stmts: map[string]*sql.Stmt{}, path: path, budget: visibility.ScanBudget}
	pragmas := "_pragma=busy_timeout(10000)&_pragma=foreign_keys(0)&_pragma=temp_store(memory)"
	var err error
	if path == "" {
		// One connection: each connection to :memory: is a database of
		// its own. Readers wait for a batch being written (at most
		// BatchMax rows).
		if s.w, err = sql.Open("sqlite", "file::memory:?"+pragmas+"&_pragma=cache_size(-65536)"); err != nil {
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
		if s.w, err = sql.Open("sqlite", dsn+"&_pragma=cache_size(-65536)&_txlock=immediate"); err != nil {
			return nil, fmt.Errorf("visibility: open %s: %w", path, err)
		}
		s.w.SetMaxOpenConns(1)
		// Bounded memory: each reader's page cache is 16 MiB at most.
		if s.r, err = sql.Open("sqlite", dsn+"&_pragma=cache_size(-16384)&_pragma=query_only(1)"); err != nil {
			s.w.Close()
			return nil, fmt.Errorf("visibility: open %s: %w", path, err)
		}
		s.r.SetMaxOpenConns(4)
		s.r.SetMaxIdleConns(4)
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
}

// migrate makes the schema, or drops a database of another version.
func (s *Store) migrate(ctx context.Context) error {
	var v string
	err := s.w.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = 'schema'`).Scan(&v)
	if err == nil && v == schemaVersion {
		return nil
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("visibility: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	for _, t := range []string{"attrs", "executions", "meta"} {
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
	putMeta     = `INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value`
)

// Apply implements visibility.Store.
func (s *Store) Apply(ctx context.Context, b visibility.Batch) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	prep := func(q string) (*sql.Stmt, error) { return tx.PrepareContext(ctx, q) }
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
	for _, r := range b.Puts {
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
		res, err := upsert.ExecContext(ctx, r.ID, r.Workflow, r.Version, string(r.Status), started, ended,
			visibility.UnixNano(r.UpdatedAt), r.Steps, r.Done, r.Error, damaged, attrs, int64(r.Rev))
		if err != nil {
			return fmt.Errorf("row %s: %w", r.ID, err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			continue // the stored row is as new
		}
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
		res, err := delRow.ExecContext(ctx, d.ID, int64(d.Rev))
		if err != nil {
			return fmt.Errorf("row %s: %w", d.ID, err)
		}
		if n, _ := res.RowsAffected(); n > 0 {
			if _, err := delAttrs.ExecContext(ctx, d.ID); err != nil {
				return err
			}
		}
	}
	p := b.Position
	for k, v := range map[string]string{
		"revision": strconv.FormatUint(p.Revision, 10),
		"stream":   strconv.FormatInt(visibility.UnixNano(p.Stream), 10),
		"live_at":  strconv.FormatInt(visibility.UnixNano(p.LiveAt), 10),
	} {
		if _, err := tx.ExecContext(ctx, putMeta, k, v); err != nil {
			return err
		}
	}
	return tx.Commit()
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
	for _, q := range []string{`DELETE FROM attrs`, `DELETE FROM executions`, `DELETE FROM meta WHERE key <> 'schema'`} {
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
