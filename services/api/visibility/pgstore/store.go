// Package pgstore is the visibility index's external store: PostgreSQL,
// for deployments that outgrow one machine's index (many api replicas
// sharing one, executions in the tens of millions). It keeps the
// semantics of the embedded store (package sqlitestore), held to them by
// the same conformance suite (package storetest): a batch is applied with
// its position in one transaction, rows and deletions are guarded by
// their revisions, lists are index range scans with keyset paging, and
// the counts by status are kept with the rows.
//
// Each namespace has a schema of its own (SchemaFor), so that a
// namespace's tables and indexes hold its rows only (no namespace column
// leading every index), its reset is a TRUNCATE, and it is dropped with
// DROP SCHEMA.
//
// Several apis may feed one schema at once. Apply takes the schema's
// state row FOR UPDATE first, so that batches are applied one after the
// other; updates at or below the stored position are left out (another
// feed applied them), so a feed behind another cannot bring back a
// deleted row, and the position never goes backwards. A Reset by one api
// makes the other's next Apply fail with visibility.ErrReset: its feed
// starts over from the position as it then is.
package pgstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/visibility"
	"jetflow.dev/services/api/visibility/storeplan"
)

// schemaVersion changes with the tables: a schema of another version is
// dropped and made again (the index is a projection: the feed fills it).
const schemaVersion = 1

// SchemaFor is the schema of namespace ns's index.
func SchemaFor(ns string) string { return "jetflow_visibility_" + ns }

// Store is a visibility.Store in a PostgreSQL schema.
type Store struct {
	pool *pgxpool.Pool
	// name is the schema's name, schema the same quoted.
	name, schema string
	// gen is the schema's generation this store last saw (Reset makes a
	// new one): Apply refuses to write into an index another writer reset
	// meanwhile.
	gen      atomic.Int64
	examined atomic.Int64
	budget   int
}

var _ visibility.Store = (*Store)(nil)

// CheckURL reports whether url can be a PostgreSQL connection string,
// without connecting; its error does not repeat the URL (it may hold a
// password).
func CheckURL(url string) error {
	if _, err := pgxpool.ParseConfig(url); err != nil {
		return fmt.Errorf("not a PostgreSQL URL%s: give postgres://user:password@host:5432/database?sslmode=... (percent-encode @, : and / in the user and password, e.g. %%40 for @), or key=value settings", parseReason(err))
	}
	return nil
}

// parseReason is what pgx says is wrong with a connection string, in
// parentheses, or "": its own words only ("invalid port", "cannot parse
// pool_max_conns", "failed to parse as URL"), without the string it
// quotes nor the error it wraps, either of which may repeat part of the
// input, a password included.
func parseReason(err error) string {
	msg := err.Error()
	if !strings.HasPrefix(msg, "cannot parse `") {
		return ""
	}
	i := strings.LastIndex(msg, "`: ")
	if i < 0 {
		return ""
	}
	reason := msg[i+3:]
	if inner := errors.Unwrap(err); inner != nil {
		reason = strings.TrimSuffix(reason, " ("+inner.Error()+")")
	}
	if strings.ContainsAny(reason, "`\"'=@") { // quotes something: not one of pgx's own phrases
		return ""
	}
	return " (" + reason + ")"
}

// Ping connects to the database at url, within 10 s, and disconnects: a
// program tells so, before it starts anything, that the index cannot be
// reached. Its error does not repeat the URL.
func Ping(ctx context.Context, url string) error {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("visibility: the PostgreSQL URL: %w", CheckURL(url))
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig)
	if err != nil {
		return fmt.Errorf("visibility: connect to PostgreSQL: %w", err)
	}
	return conn.Close(ctx)
}

// Open connects to the database at url (a PostgreSQL URL or key=value
// string; pool settings such as pool_max_conns may be given in it) and
// makes schema's tables if they are missing.
func Open(ctx context.Context, url, schema string) (*Store, error) {
	if schema == "" || len(schema) > 63 {
		return nil, fmt.Errorf("visibility: schema %q: give 1 to 63 characters", schema)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("visibility: the PostgreSQL URL: %w", CheckURL(url))
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("visibility: connect to PostgreSQL: %w", err)
	}
	s := &Store{pool: pool, name: schema, schema: pgx.Identifier{schema}.Sanitize(), budget: visibility.ScanBudget}
	if err := s.migrate(ctx, schema); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// t is table's qualified name.
func (s *Store) t(table string) string { return s.schema + "." + table }

// tables are made in this order, and dropped in the reverse one.
var tables = []string{"state", "executions", "attrs", "counts", "status_counts"}

// schemaDDL is the tables and indexes (%[1]s is the schema). Ids,
// workflows, statuses and attribute names and values compare byte by
// byte (COLLATE "C"), as the embedded store's do: a cursor names the same
// place in either. The indexes are the embedded store's (see sqlitestore):
// per order (id, start, end), by status, by workflow and status, and the
// damaged rows; per order, the attributes by name and value.
const schemaDDL = `
CREATE TABLE %[1]s.state (
	one boolean PRIMARY KEY DEFAULT true CHECK (one),
	version integer NOT NULL,
	generation bigint NOT NULL,
	revision bigint NOT NULL,
	stream bigint NOT NULL,
	live_at bigint NOT NULL
);
CREATE TABLE %[1]s.executions (
	id text COLLATE "C" PRIMARY KEY,
	workflow text COLLATE "C" NOT NULL,
	version integer NOT NULL,
	status text COLLATE "C" NOT NULL,
	started_at bigint NOT NULL,
	ended_at bigint NOT NULL,
	updated_at bigint NOT NULL,
	steps integer NOT NULL,
	done integer NOT NULL,
	error text NOT NULL,
	damaged text,
	attrs text,
	rev bigint NOT NULL
);
CREATE INDEX ex_status_id ON %[1]s.executions (status, id);
CREATE INDEX ex_workflow_status_id ON %[1]s.executions (workflow, status, id);
CREATE INDEX ex_damaged_id ON %[1]s.executions (id) WHERE damaged IS NOT NULL;
CREATE INDEX ex_status_started ON %[1]s.executions (status, started_at, id);
CREATE INDEX ex_workflow_status_started ON %[1]s.executions (workflow, status, started_at, id);
CREATE INDEX ex_damaged_started ON %[1]s.executions (started_at, id) WHERE damaged IS NOT NULL;
CREATE INDEX ex_status_ended ON %[1]s.executions (status, ended_at, id);
CREATE INDEX ex_workflow_status_ended ON %[1]s.executions (workflow, status, ended_at, id);
CREATE INDEX ex_damaged_ended ON %[1]s.executions (ended_at, id) WHERE damaged IS NOT NULL;
CREATE TABLE %[1]s.attrs (
	id text COLLATE "C" NOT NULL,
	name text COLLATE "C" NOT NULL,
	value text COLLATE "C" NOT NULL,
	started_at bigint NOT NULL,
	ended_at bigint NOT NULL,
	PRIMARY KEY (id, name)
);
CREATE INDEX at_id ON %[1]s.attrs (name, value, id);
CREATE INDEX at_started ON %[1]s.attrs (name, value, started_at, id);
CREATE INDEX at_ended ON %[1]s.attrs (name, value, ended_at, id);
CREATE TABLE %[1]s.counts (
	workflow text COLLATE "C" NOT NULL,
	status text COLLATE "C" NOT NULL,
	n bigint NOT NULL,
	PRIMARY KEY (workflow, status)
);
CREATE TABLE %[1]s.status_counts (
	status text COLLATE "C" PRIMARY KEY,
	n bigint NOT NULL
);
`

// migrate makes the schema's tables, or makes them again for an older
// version. Apis starting together take turns: each holds an advisory lock
// for its whole transaction and looks at the state only while it holds
// it (the one after sees the tables the one before made). It refuses an
// index of a newer version (an older api during an upgrade or a rollback
// must not drop it). A new index gets a generation of the time it was
// made, never one an api still holds for an index dropped since (a
// DROP SCHEMA, or a version made again): that api's next Apply then
// fails with ErrReset.
func (s *Store) migrate(ctx context.Context, schema string) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("visibility: migrate: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "jetflow visibility "+schema); err != nil {
		return fmt.Errorf("visibility: migrate: %w", err)
	}
	// to_regclass answers NULL for a missing schema or table, where a
	// SELECT from it would abort the transaction.
	var exists bool
	if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, s.t("state")).Scan(&exists); err != nil {
		return fmt.Errorf("visibility: migrate: %w", err)
	}
	var version int
	var gen int64
	if exists {
		err = tx.QueryRow(ctx, `SELECT version, generation FROM `+s.t("state")).Scan(&version, &gen)
		switch {
		case err == nil && version == schemaVersion:
			s.gen.Store(gen)
			return tx.Commit(ctx)
		case err == nil && version > schemaVersion:
			return fmt.Errorf("visibility: the index in schema %s is of a newer jetflow (its version %d; this api knows %d): upgrade this api, or give it another schema or database",
				schema, version, schemaVersion)
		case err == nil, errors.Is(err, pgx.ErrNoRows):
		default:
			return fmt.Errorf("visibility: read the index's state: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS `+s.schema); err != nil {
		return fmt.Errorf("visibility: migrate: create schema %s: %w", s.schema, err)
	}
	for _, t := range slices.Backward(tables) {
		if _, err := tx.Exec(ctx, `DROP TABLE IF EXISTS `+s.t(t)); err != nil {
			return fmt.Errorf("visibility: migrate: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, fmt.Sprintf(schemaDDL, s.schema)); err != nil {
		return fmt.Errorf("visibility: migrate: %w", err)
	}
	gen = max(gen+1, time.Now().UnixNano())
	if _, err := tx.Exec(ctx, `INSERT INTO `+s.t("state")+` (version, generation, revision, stream, live_at) VALUES ($1, $2, 0, 0, 0)`,
		schemaVersion, gen); err != nil {
		return fmt.Errorf("visibility: migrate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("visibility: migrate: %w", err)
	}
	s.gen.Store(gen)
	return nil
}

// Close closes the connections.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// stored is a row as Apply finds it: what its counts are.
type stored struct {
	workflow, status string
	rev              int64
}

// countKey is a row of the counts table.
type countKey struct{ workflow, status string }

// Apply implements visibility.Store.
func (s *Store) Apply(ctx context.Context, b visibility.Batch) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("visibility: apply: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// The state row, locked: writers apply their batches one at a time.
	var gen, revision int64
	if err := tx.QueryRow(ctx, `SELECT generation, revision FROM `+s.t("state")+` FOR UPDATE`).Scan(&gen, &revision); err != nil {
		return fmt.Errorf("visibility: read the position: %w", err)
	}
	if gen != s.gen.Load() {
		return visibility.ErrReset
	}
	// What the batch touches, as stored.
	var ids []string
	for _, r := range b.Puts {
		if int64(r.Rev) > revision {
			ids = append(ids, r.ID)
		}
	}
	for _, d := range b.Deletes {
		if int64(d.Rev) > revision {
			ids = append(ids, d.ID)
		}
	}
	before := map[string]*stored{}
	if len(ids) > 0 {
		rows, err := tx.Query(ctx, `SELECT id, workflow, status, rev FROM `+s.t("executions")+` WHERE id = ANY($1)`, ids)
		if err != nil {
			return fmt.Errorf("visibility: read the rows: %w", err)
		}
		for rows.Next() {
			var id string
			var st stored
			if err := rows.Scan(&id, &st.workflow, &st.status, &st.rev); err != nil {
				rows.Close()
				return fmt.Errorf("visibility: read the rows: %w", err)
			}
			before[id] = &st
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("visibility: read the rows: %w", err)
		}
	}
	// What each id becomes: the puts, then the deletions, in order (as
	// the embedded store applies them), each guarded by its revision.
	type outcome struct {
		row     *visibility.Row // nil: deleted
		rev     int64
		changed bool
	}
	after := map[string]*outcome{}
	state := func(id string) *outcome {
		if o, ok := after[id]; ok {
			return o
		}
		o := &outcome{}
		if st := before[id]; st != nil {
			o.row, o.rev = &visibility.Row{}, st.rev // a stored row: only its revision matters here
		}
		after[id] = o
		return o
	}
	for i := range b.Puts {
		r := &b.Puts[i]
		if int64(r.Rev) <= revision {
			continue // applied already
		}
		if o := state(r.ID); o.row == nil || o.rev < int64(r.Rev) {
			o.row, o.rev, o.changed = r, int64(r.Rev), true
		}
	}
	for _, d := range b.Deletes {
		if int64(d.Rev) <= revision {
			continue
		}
		if o := state(d.ID); o.row != nil && o.rev < int64(d.Rev) {
			o.row, o.changed = nil, true
		}
	}
	// Write the outcome: rows replaced or removed (their attributes with
	// them), the counts, the position.
	var gone, put []string
	deltas := map[countKey]int64{}
	var cols struct {
		id, workflow, status, errs []string
		damaged, attrs             []*string
		version, steps, done       []int32
		started, ended, updated    []int64
		rev                        []int64
	}
	var attrID, attrName, attrValue []string
	var attrStarted, attrEnded []int64
	for id, o := range after {
		if !o.changed {
			continue
		}
		if st := before[id]; st != nil {
			deltas[countKey{st.workflow, st.status}]--
			gone = append(gone, id)
		}
		if o.row == nil {
			continue
		}
		r := o.row
		deltas[countKey{r.Workflow, string(r.Status)}]++
		put = append(put, id)
		var damaged, attrs *string
		if r.Damaged != nil {
			d, err := json.Marshal(r.Damaged)
			if err != nil {
				return err
			}
			damaged = ptr(string(d))
		}
		if len(r.Attrs) > 0 {
			a, err := json.Marshal(r.Attrs)
			if err != nil {
				return err
			}
			attrs = ptr(string(a))
		}
		started, ended := visibility.UnixNano(r.StartedAt), visibility.UnixNano(r.EndedAt)
		cols.id = append(cols.id, r.ID)
		cols.workflow = append(cols.workflow, r.Workflow)
		cols.status = append(cols.status, string(r.Status))
		cols.errs = append(cols.errs, r.Error)
		cols.damaged = append(cols.damaged, damaged)
		cols.attrs = append(cols.attrs, attrs)
		cols.version = append(cols.version, int32(r.Version))
		cols.steps = append(cols.steps, int32(r.Steps))
		cols.done = append(cols.done, int32(r.Done))
		cols.started = append(cols.started, started)
		cols.ended = append(cols.ended, ended)
		cols.updated = append(cols.updated, visibility.UnixNano(r.UpdatedAt))
		cols.rev = append(cols.rev, int64(r.Rev))
		for name, v := range r.Attrs {
			attrID, attrName, attrValue = append(attrID, r.ID), append(attrName, name), append(attrValue, v)
			attrStarted, attrEnded = append(attrStarted, started), append(attrEnded, ended)
		}
	}
	var batch pgx.Batch
	if len(gone) > 0 {
		batch.Queue(`DELETE FROM `+s.t("attrs")+` WHERE id = ANY($1)`, gone)
		batch.Queue(`DELETE FROM `+s.t("executions")+` WHERE id = ANY($1)`, gone)
	}
	if len(put) > 0 {
		batch.Queue(`INSERT INTO `+s.t("executions")+` (id, workflow, version, status, started_at, ended_at, updated_at, steps, done, error, damaged, attrs, rev)
			SELECT * FROM unnest($1::text[], $2::text[], $3::int[], $4::text[], $5::bigint[], $6::bigint[], $7::bigint[], $8::int[], $9::int[],
				$10::text[], $11::text[], $12::text[], $13::bigint[])`,
			cols.id, cols.workflow, cols.version, cols.status, cols.started, cols.ended, cols.updated, cols.steps, cols.done,
			cols.errs, cols.damaged, cols.attrs, cols.rev)
	}
	if len(attrID) > 0 {
		batch.Queue(`INSERT INTO `+s.t("attrs")+` (id, name, value, started_at, ended_at)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::bigint[])`,
			attrID, attrName, attrValue, attrStarted, attrEnded)
	}
	// The counts, in a fixed order.
	keys := make([]countKey, 0, len(deltas))
	totals := map[string]int64{}
	for k, n := range deltas {
		if n != 0 {
			keys = append(keys, k)
			totals[k.status] += n
		}
	}
	slices.SortFunc(keys, func(a, b countKey) int {
		return cmp.Or(strings.Compare(a.workflow, b.workflow), strings.Compare(a.status, b.status))
	})
	for _, k := range keys {
		batch.Queue(`INSERT INTO `+s.t("counts")+` AS c (workflow, status, n) VALUES ($1, $2, $3)
			ON CONFLICT (workflow, status) DO UPDATE SET n = c.n + excluded.n`, k.workflow, k.status, deltas[k])
		batch.Queue(`DELETE FROM `+s.t("counts")+` WHERE workflow = $1 AND status = $2 AND n = 0`, k.workflow, k.status)
	}
	statuses := slices.Sorted(maps.Keys(totals))
	for _, st := range statuses {
		if totals[st] == 0 {
			continue
		}
		batch.Queue(`INSERT INTO `+s.t("status_counts")+` AS c (status, n) VALUES ($1, $2)
			ON CONFLICT (status) DO UPDATE SET n = c.n + excluded.n`, st, totals[st])
		batch.Queue(`DELETE FROM `+s.t("status_counts")+` WHERE status = $1 AND n = 0`, st)
	}
	// The position never goes backwards, nor does the time it was last
	// known live (two feeds writing one index: the slower one's tick at
	// the same revision is older).
	p := b.Position
	batch.Queue(`UPDATE `+s.t("state")+` SET revision = $1, stream = $2, live_at = GREATEST(live_at, $3) WHERE revision <= $1`,
		int64(p.Revision), visibility.UnixNano(p.Stream), visibility.UnixNano(p.LiveAt))
	if err := tx.SendBatch(ctx, &batch).Close(); err != nil {
		return fmt.Errorf("visibility: write %d rows: %w", len(put)+len(gone), err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("visibility: commit: %w", err)
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// Position implements visibility.Store. It records the generation it
// read: Apply then refuses to write if another writer resets the index.
func (s *Store) Position(ctx context.Context) (visibility.Position, error) {
	var p visibility.Position
	var gen, rev, stream, liveAt int64
	if err := s.pool.QueryRow(ctx, `SELECT generation, revision, stream, live_at FROM `+s.t("state")).Scan(&gen, &rev, &stream, &liveAt); err != nil {
		return p, fmt.Errorf("visibility: read the position: %w", err)
	}
	s.gen.Store(gen)
	p.Revision, p.Stream, p.LiveAt = uint64(rev), visibility.FromUnixNano(stream), visibility.FromUnixNano(liveAt)
	return p, nil
}

// Reset implements visibility.Store: the tables are emptied and the
// generation changes, so that another writer's next Apply fails with
// visibility.ErrReset instead of writing into the index fed again.
func (s *Store) Reset(ctx context.Context) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("visibility: reset: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM `+s.t("state")+` FOR UPDATE`); err != nil {
		return fmt.Errorf("visibility: reset: %w", err)
	}
	if _, err := tx.Exec(ctx, `TRUNCATE `+s.t("executions")+`, `+s.t("attrs")+`, `+s.t("counts")+`, `+s.t("status_counts")); err != nil {
		return fmt.Errorf("visibility: reset: %w", err)
	}
	var gen int64
	if err := tx.QueryRow(ctx, `UPDATE `+s.t("state")+` SET revision = 0, stream = 0, live_at = 0, generation = generation + 1 RETURNING generation`).
		Scan(&gen); err != nil {
		return fmt.Errorf("visibility: reset: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("visibility: reset: %w", err)
	}
	s.gen.Store(gen)
	return nil
}

// Count implements visibility.Store: the sum of the counts by status (a
// count(*) would read every row).
func (s *Store) Count(ctx context.Context) (int, error) {
	var n int64
	if err := s.pool.QueryRow(ctx, `SELECT coalesce(sum(n), 0)::bigint FROM `+s.t("status_counts")).Scan(&n); err != nil {
		return 0, fmt.Errorf("visibility: count: %w", err)
	}
	return int(n), nil
}

// Counts implements visibility.Store: a row per status, of the
// workflow's counts or of the totals.
func (s *Store) Counts(ctx context.Context, workflow string) (map[projections.Status]int, error) {
	q, args := `SELECT status, n FROM `+s.t("status_counts"), []any{}
	if workflow != "" {
		q, args = `SELECT status, n FROM `+s.t("counts")+` WHERE workflow = $1`, []any{workflow}
	}
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("visibility: counts: %w", err)
	}
	defer rows.Close()
	return storeplan.ScanCounts(rows)
}

// Examined is how many index entries queries examined so far.
func (s *Store) Examined() int64 { return s.examined.Load() }

// Size is the bytes the schema's tables and indexes take.
func (s *Store) Size(ctx context.Context) (int64, error) {
	var n int64
	err := s.pool.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
		JOIN pg_namespace ns ON ns.oid = c.relnamespace WHERE ns.nspname = $1 AND c.relkind = 'r'`, s.name).Scan(&n)
	return n, err
}

// Drop removes the schema and everything in it (tests, and an operator
// moving an index elsewhere).
func (s *Store) Drop(ctx context.Context) error {
	if _, err := s.pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+s.schema+` CASCADE`); err != nil {
		return fmt.Errorf("visibility: drop %s: %w", s.schema, err)
	}
	return nil
}
