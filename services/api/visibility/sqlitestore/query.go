package sqlitestore

import (
	"context"
	"fmt"

	"jetflow.dev/services/api/visibility"
	"jetflow.dev/services/api/visibility/storeplan"
)

// maxID is above every id: ids are printable ASCII, below 0xff.
const maxID = "\xff"

// Query implements visibility.Store (see package storeplan).
func (s *Store) Query(ctx context.Context, q visibility.Query) (visibility.Page, error) {
	page, examined, err := storeplan.Query(ctx, q, maxID, s.budget, func(r storeplan.Range) storeplan.Reader {
		return reader{s, newRangeStmt(r)}
	})
	s.examined.Add(int64(examined))
	return page, err
}

// rangeStmt is the statement of a range: its text, and its arguments
// before the bounds.
type rangeStmt struct {
	r    storeplan.Range
	q    string
	args []any
}

// newRangeStmt is r's statement: it searches the index r is on, named
// INDEXED BY, within [lo, hi).
func newRangeStmt(r storeplan.Range) rangeStmt {
	col, suffix := r.Column(), r.Key
	// The range condition on the key, for table alias a.
	rangeCond := func(a string) string {
		if col == "" {
			return fmt.Sprintf("%s.id >= ? AND %s.id < ?", a, a)
		}
		return fmt.Sprintf("(%s.%s, %s.id) >= (?, ?) AND (%s.%s, %s.id) < (?, ?)", a, col, a, a, col, a)
	}
	order := func(a string) string {
		dir := " ASC"
		if r.Desc {
			dir = " DESC"
		}
		if col == "" {
			return a + ".id" + dir
		}
		return a + "." + col + dir + ", " + a + ".id" + dir
	}
	st := rangeStmt{r: r}
	sel := storeplan.Columns
	for _, a := range r.More {
		sel += `, EXISTS (SELECT 1 FROM attrs m WHERE m.id = e.id AND m.name = ? AND m.value = ?)`
		st.args = append(st.args, a.Name, a.Value)
	}
	for _, v := range r.Eq {
		st.args = append(st.args, v)
	}
	switch r.Index {
	case storeplan.Damaged:
		st.q = fmt.Sprintf(`SELECT %s FROM executions e INDEXED BY ex_damaged_%s WHERE e.damaged IS NOT NULL AND %s ORDER BY %s LIMIT ?`,
			sel, suffix, rangeCond("e"), order("e"))
	case storeplan.ByAttr:
		st.q = fmt.Sprintf(`SELECT %s FROM attrs a INDEXED BY at_%s CROSS JOIN executions e ON e.id = a.id WHERE a.name = ? AND a.value = ? AND %s ORDER BY %s LIMIT ?`,
			sel, suffix, rangeCond("a"), order("a"))
	case storeplan.ByWorkflowStatus:
		st.q = fmt.Sprintf(`SELECT %s FROM executions e INDEXED BY ex_workflow_status_%s WHERE e.workflow = ? AND e.status = ? AND %s ORDER BY %s LIMIT ?`,
			sel, suffix, rangeCond("e"), order("e"))
	default:
		st.q = fmt.Sprintf(`SELECT %s FROM executions e INDEXED BY ex_status_%s WHERE e.status = ? AND %s ORDER BY %s LIMIT ?`,
			sel, suffix, rangeCond("e"), order("e"))
	}
	return st
}

// argsFor are st's arguments for rows within b, at most limit. An
// excluded lower bound is the smallest key after it: ids are compared
// byte by byte, so the next id is the bound's with a 0 byte appended.
func (st rangeStmt) argsFor(b storeplan.Bounds, limit int) []any {
	if b.LoExcl {
		b.Lo, b.LoExcl = storeplan.Key{T: b.Lo.T, ID: b.Lo.ID + "\x00"}, false
	}
	return storeplan.BoundArgs(st.args, st.r, b, limit)
}

// reader reads a range with its prepared statement.
type reader struct {
	s  *Store
	st rangeStmt
}

// Read implements storeplan.Reader.
func (rd reader) Read(ctx context.Context, b storeplan.Bounds, limit int) ([]storeplan.Scanned, error) {
	stmt, err := rd.s.stmt(ctx, rd.st.q)
	if err != nil {
		return nil, fmt.Errorf("visibility: query: %w", err)
	}
	rows, err := stmt.QueryContext(ctx, rd.st.argsFor(b, limit)...)
	if err != nil {
		return nil, fmt.Errorf("visibility: query: %w", err)
	}
	defer rows.Close()
	return storeplan.ScanRows(rows, len(rd.st.r.More))
}
