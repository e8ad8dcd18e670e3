package storeplan

import (
	"encoding/json"
	"fmt"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/visibility"
)

// Scanned is a row a range read, with the further attributes it matches
// (its More, in order).
type Scanned struct {
	Row  visibility.Row
	More []bool
	key  Key // in the plan's order
}

// Rows are what the stores' rows have in common (*sql.Rows, pgx.Rows):
// whoever ran the statement closes them.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// BoundArgs are the arguments of a range's statement: its own (args),
// then the key's bounds (with the time for a Timed range) and the limit.
// The lower bound is b.Lo whether excluded or not.
func BoundArgs(args []any, r Range, b Bounds, limit int) []any {
	if !r.Timed() { // bounds on the id alone
		return append(append([]any{}, args...), b.Lo.ID, b.Hi.ID, limit)
	}
	return append(append([]any{}, args...), b.Lo.T, b.Lo.ID, b.Hi.T, b.Hi.ID, limit)
}

// ScanRows reads rows of Columns, each followed by more boolean columns
// (a range's More).
func ScanRows(rows Rows, more int) ([]Scanned, error) {
	var out []Scanned
	for rows.Next() {
		sc, err := scanRow(rows, more)
		if err != nil {
			return nil, err
		}
		out = append(out, sc)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("visibility: query: %w", err)
	}
	return out, nil
}

func scanRow(rows Rows, more int) (Scanned, error) {
	var sc Scanned
	var r visibility.Row
	var status string
	var started, ended, updated int64
	var damaged, attrs *string
	var rev int64
	dest := []any{&r.ID, &r.Workflow, &r.Version, &status, &started, &ended, &updated, &r.Steps, &r.Done, &r.Error, &damaged, &attrs, &rev}
	sc.More = make([]bool, more)
	for i := range sc.More {
		dest = append(dest, &sc.More[i])
	}
	if err := rows.Scan(dest...); err != nil {
		return sc, fmt.Errorf("visibility: read a row: %w", err)
	}
	r.Status, r.Rev = projections.Status(status), uint64(rev)
	r.StartedAt, r.EndedAt, r.UpdatedAt = visibility.FromUnixNano(started), visibility.FromUnixNano(ended), visibility.FromUnixNano(updated)
	if damaged != nil {
		r.Damaged = &projections.Damage{}
		if err := json.Unmarshal([]byte(*damaged), r.Damaged); err != nil {
			return sc, fmt.Errorf("visibility: row %s: damage: %w", r.ID, err)
		}
	}
	if attrs != nil {
		if err := json.Unmarshal([]byte(*attrs), &r.Attrs); err != nil {
			return sc, fmt.Errorf("visibility: row %s: attributes: %w", r.ID, err)
		}
	}
	sc.Row = r
	return sc, nil
}

// ScanCounts reads rows of a status and its count, leaving out the
// statuses counted 0 (see visibility.Store's Counts).
func ScanCounts(rows Rows) (map[projections.Status]int, error) {
	out := map[projections.Status]int{}
	for rows.Next() {
		var st string
		var n int64
		if err := rows.Scan(&st, &n); err != nil {
			return nil, fmt.Errorf("visibility: counts: %w", err)
		}
		if n != 0 {
			out[projections.Status(st)] = int(n)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("visibility: counts: %w", err)
	}
	return out, nil
}
