package pgstore

import (
	"context"
	"fmt"
	"strings"

	"jetflow.dev/services/api/visibility"
	"jetflow.dev/services/api/visibility/storeplan"
)

// maxID is above every id: ids are printable ASCII, below U+10FFFF
// (which PostgreSQL's text, UTF-8 compared byte by byte, can hold; a
// 0xff byte it cannot).
const maxID = "\U0010FFFF"

// Query implements visibility.Store (see package storeplan).
func (s *Store) Query(ctx context.Context, q visibility.Query) (visibility.Page, error) {
	page, examined, err := storeplan.Query(ctx, q, maxID, s.budget, func(r storeplan.Range) storeplan.Reader {
		return reader{s, s.newRangeStmt(r)}
	})
	s.examined.Add(int64(examined))
	return page, err
}

// rangeStmt is the statement of a range: its text with the lower bound
// included (q) and excluded (qExcl), and its arguments before the
// bounds.
type rangeStmt struct {
	r        storeplan.Range
	q, qExcl string
	args     []any
}

// newRangeStmt is r's statement, with the tables in s's schema.
func (s *Store) newRangeStmt(r storeplan.Range) rangeStmt {
	col := r.Column()
	// The range on the index, for table alias a: its leading columns
	// (prefix, each equal to the placeholder of the same index in eqs),
	// then the key; the key's bounds are $n on (the limit after them);
	// excl: the lower bound excluded. The leading columns are part of the
	// row comparisons and of the ORDER BY, rather than equalities of
	// their own: the order is then that of one index only, and the planner
	// cannot take another that gives the key's order once the equalities
	// are applied (the primary key, read whole for a rare status, when it
	// plans for any status).
	rangeCond := func(a string, prefix, eqs []string, n int, excl bool) string {
		op := ">="
		if excl {
			op = ">"
		}
		dir := " ASC"
		if r.Desc {
			dir = " DESC"
		}
		var keyCols, lower, upper, orderBy []string
		for i, c := range prefix {
			keyCols = append(keyCols, a+"."+c)
			lower, upper = append(lower, eqs[i]), append(upper, eqs[i])
		}
		if col != "" {
			keyCols = append(keyCols, a+"."+col)
			lower, upper = append(lower, fmt.Sprintf("$%d", n)), append(upper, fmt.Sprintf("$%d", n+2))
		}
		keyCols = append(keyCols, a+".id")
		if col != "" {
			lower, upper = append(lower, fmt.Sprintf("$%d", n+1)), append(upper, fmt.Sprintf("$%d", n+3))
		} else {
			lower, upper = append(lower, fmt.Sprintf("$%d", n)), append(upper, fmt.Sprintf("$%d", n+1))
		}
		for _, c := range keyCols {
			orderBy = append(orderBy, c+dir)
		}
		limit := n + 2
		if col != "" {
			limit = n + 4
		}
		return fmt.Sprintf("(%s) %s (%s) AND (%s) < (%s) ORDER BY %s LIMIT $%d",
			strings.Join(keyCols, ", "), op, strings.Join(lower, ", "), strings.Join(keyCols, ", "), strings.Join(upper, ", "),
			strings.Join(orderBy, ", "), limit)
	}
	st := rangeStmt{r: r}
	sel := storeplan.Columns
	for _, a := range r.More {
		n := len(st.args)
		sel += fmt.Sprintf(`, EXISTS (SELECT 1 FROM %s m WHERE m.id = e.id AND m.name = $%d AND m.value = $%d)`, s.t("attrs"), n+1, n+2)
		st.args = append(st.args, a.Name, a.Value)
	}
	// The statement (with %s where the range goes), the alias of the
	// index's table, and the index's leading columns, equal to r.Eq.
	var query, alias string
	var prefix []string
	switch r.Index {
	case storeplan.Damaged:
		query, alias = fmt.Sprintf(`SELECT %s FROM %s e WHERE e.damaged IS NOT NULL AND %%s`, sel, s.t("executions")), "e"
	case storeplan.ByAttr:
		query, alias = fmt.Sprintf(`SELECT %s FROM %s a JOIN %s e ON e.id = a.id WHERE %%s`, sel, s.t("attrs"), s.t("executions")), "a"
		prefix = []string{"name", "value"}
	case storeplan.ByWorkflowStatus:
		query, alias = fmt.Sprintf(`SELECT %s FROM %s e WHERE %%s`, sel, s.t("executions")), "e"
		prefix = []string{"workflow", "status"}
	default:
		query, alias = fmt.Sprintf(`SELECT %s FROM %s e WHERE %%s`, sel, s.t("executions")), "e"
		prefix = []string{"status"}
	}
	var eqs []string
	for _, v := range r.Eq {
		st.args = append(st.args, v)
		eqs = append(eqs, fmt.Sprintf("$%d", len(st.args)))
	}
	n := len(st.args) + 1
	st.q = fmt.Sprintf(query, rangeCond(alias, prefix, eqs, n, false))
	st.qExcl = fmt.Sprintf(query, rangeCond(alias, prefix, eqs, n, true))
	return st
}

// textFor is st's text and arguments for rows within b, at most limit.
func (st rangeStmt) textFor(b storeplan.Bounds, limit int) (string, []any) {
	q := st.q
	if b.LoExcl {
		q = st.qExcl
	}
	return q, storeplan.BoundArgs(st.args, st.r, b, limit)
}

// reader reads a range.
type reader struct {
	s  *Store
	st rangeStmt
}

// Read implements storeplan.Reader.
func (rd reader) Read(ctx context.Context, b storeplan.Bounds, limit int) ([]storeplan.Scanned, error) {
	q, args := rd.st.textFor(b, limit)
	rows, err := rd.s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("visibility: query: %w", err)
	}
	defer rows.Close()
	return storeplan.ScanRows(rows, len(rd.st.r.More))
}
