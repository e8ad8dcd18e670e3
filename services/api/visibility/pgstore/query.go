package pgstore

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"

	"github.com/jackc/pgx/v5"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/visibility"
)

// key is a row's place in an order: its time of the order's key (0 for
// the id order) and its id.
type key struct {
	t  int64
	id string
}

func (k key) less(o key) bool { return k.t < o.t || (k.t == o.t && k.id < o.id) }

// Bounds no key reaches: ids are printable ASCII, below U+10FFFF (which
// PostgreSQL's text, UTF-8 compared byte by byte, can hold; a 0xff byte
// it cannot).
var (
	keyMin = key{math.MinInt64, ""}
	keyMax = key{math.MaxInt64, "\U0010FFFF"}
)

// scanned is a row a stream read, with the extra attributes it matches.
type scanned struct {
	row  visibility.Row
	key  key
	more []bool
}

// stream is an index range read in order, a chunk at a time.
type stream struct {
	// q is the query with the lower bound included, qExcl excluded.
	q, qExcl string
	args     []any
	// lo and hi bound what is left to read: [lo, hi), or (lo, hi) with
	// loExcl.
	lo, hi key
	loExcl bool
	// timed: the key has a time (the order is not by id).
	timed bool
	// keyOf is the key of a row read.
	keyOf func(started, ended int64, id string) key
	desc  bool
	chunk int
	buf   []scanned
	done  bool
}

// plan is how a query is answered: the ranges merged, and the filters
// checked row by row.
type plan struct {
	streams []*stream
	keyOf   func(started, ended int64, id string) key
	match   func(scanned) bool
	desc    bool
}

// keyOfRow is r's key in p's order.
func (p *plan) keyOfRow(r visibility.Row) key {
	return p.keyOf(visibility.UnixNano(r.StartedAt), visibility.UnixNano(r.EndedAt), r.ID)
}

// cols are the columns every stream reads, as scanRow reads them.
const cols = `e.id, e.workflow, e.version, e.status, e.started_at, e.ended_at, e.updated_at, e.steps, e.done, e.error, e.damaged, e.attrs, e.rev`

// newPlan chooses the index ranges for q (see visibility.Query); t
// qualifies a table's name with the store's schema.
func newPlan(q visibility.Query, t func(string) string) (*plan, error) {
	k := q.Sort.Key()
	p := &plan{desc: q.Sort.Desc()}
	// The sort's key column, the bound of
	// the range a time filter gives, and what is left to check per row.
	var col string
	lo, hi := keyMin, keyMax
	loExcl := false
	var after, before [2]int64 // started, ended: the filters not on the key
	after[0], before[0] = visibility.UnixNano(q.StartedAfter), visibility.UnixNano(q.StartedBefore)
	after[1], before[1] = visibility.UnixNano(q.EndedAfter), visibility.UnixNano(q.EndedBefore)
	rangeOn := -1
	switch k {
	case "id":
		col = ""
		p.keyOf = func(_, _ int64, id string) key { return key{0, id} }
	case "started":
		col, rangeOn = "started_at", 0
		p.keyOf = func(started, _ int64, id string) key { return key{started, id} }
	case "ended":
		col, rangeOn = "ended_at", 1
		p.keyOf = func(_, ended int64, id string) key { return key{ended, id} }
		lo = key{1, ""} // ended executions only
	default:
		return nil, fmt.Errorf("visibility: unknown sort %q", q.Sort)
	}
	if rangeOn >= 0 {
		if a := (key{after[rangeOn], ""}); after[rangeOn] != 0 && lo.less(a) {
			lo = a
		}
		if before[rangeOn] != 0 {
			hi = key{before[rangeOn], ""}
		}
		after[rangeOn], before[rangeOn] = 0, 0 // in the range: not checked per row
	}
	if c := q.After; c != nil {
		ck := key{c.Time, c.ID}
		if k == "id" {
			ck.t = 0
		}
		if p.desc {
			if ck.less(hi) {
				hi = ck
			}
		} else if !ck.less(lo) {
			lo, loExcl = ck, true
		}
	}
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
		if p.desc {
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
	// Further attributes are checked per row, by a column each.
	var more []string
	var moreArgs []any
	attrs := q.Attrs
	drive := "executions"
	switch {
	case q.Damaged:
		drive = "damaged"
	case len(attrs) > 0:
		drive = "attr"
	}
	if drive == "attr" {
		attrs = attrs[1:]
	}
	for _, a := range attrs {
		n := len(moreArgs)
		more = append(more, fmt.Sprintf(`EXISTS (SELECT 1 FROM %s m WHERE m.id = e.id AND m.name = $%d AND m.value = $%d)`, t("attrs"), n+1, n+2))
		moreArgs = append(moreArgs, a.Name, a.Value)
	}
	sel := cols
	for _, m := range more {
		sel += ", " + m
	}
	// add adds a stream of query (with %s where the range goes), whose
	// index leads with the prefix columns, equal to eq.
	add := func(query string, prefix []string, eq ...any) {
		m := len(moreArgs)
		var eqs []string
		for i := range eq {
			eqs = append(eqs, fmt.Sprintf("$%d", m+1+i))
		}
		n := m + len(eq) + 1
		alias := "e"
		if drive == "attr" {
			alias = "a"
		}
		p.streams = append(p.streams, &stream{q: fmt.Sprintf(query, rangeCond(alias, prefix, eqs, n, false)),
			qExcl: fmt.Sprintf(query, rangeCond(alias, prefix, eqs, n, true)),
			args:  append(append([]any{}, moreArgs...), eq...), lo: lo, hi: hi, loExcl: loExcl, desc: p.desc, timed: col != "", keyOf: p.keyOf})
	}
	switch drive {
	case "damaged":
		add(fmt.Sprintf(`SELECT %s FROM %s e WHERE e.damaged IS NOT NULL AND %%s`, sel, t("executions")), nil)
	case "attr":
		add(fmt.Sprintf(`SELECT %s FROM %s a JOIN %s e ON e.id = a.id WHERE %%s`, sel, t("attrs"), t("executions")),
			[]string{"name", "value"}, q.Attrs[0].Name, q.Attrs[0].Value)
	default:
		statuses := []projections.Status{q.Status}
		if q.Status == "" {
			statuses = visibility.Statuses
		}
		for _, st := range statuses {
			if q.Workflow != "" {
				add(fmt.Sprintf(`SELECT %s FROM %s e WHERE %%s`, sel, t("executions")), []string{"workflow", "status"}, q.Workflow, string(st))
			} else {
				add(fmt.Sprintf(`SELECT %s FROM %s e WHERE %%s`, sel, t("executions")), []string{"status"}, string(st))
			}
		}
	}
	// What the ranges do not filter.
	checkWorkflow := q.Workflow != "" && drive != "executions"
	checkStatus := q.Status != "" && drive != "executions"
	checkDamaged := q.Damaged && drive != "damaged"
	p.match = func(s scanned) bool {
		r := s.row
		if (checkWorkflow && r.Workflow != q.Workflow) || (checkStatus && r.Status != q.Status) || (checkDamaged && r.Damaged == nil) {
			return false
		}
		for i, t := range [2]int64{visibility.UnixNano(r.StartedAt), visibility.UnixNano(r.EndedAt)} {
			if (after[i] != 0 && t < after[i]) || (before[i] != 0 && t >= before[i]) {
				return false
			}
		}
		for _, m := range s.more {
			if !m {
				return false
			}
		}
		return true
	}
	return p, nil
}

// Query implements visibility.Store: it merges the plan's ranges in
// order, keeps the rows that match, and stops once the page is full and
// one more match is seen (so next is set only when there is more), or
// the ranges end, or ScanBudget entries were examined.
func (s *Store) Query(ctx context.Context, q visibility.Query) (visibility.Page, error) {
	var page visibility.Page
	p, err := newPlan(q, s.t)
	if err != nil {
		return page, err
	}
	limit := max(q.Limit, 1)
	for _, st := range p.streams {
		st.chunk = min(limit+1, 128)
	}
	examined := 0
	defer func() { s.examined.Add(int64(examined)) }()
	var last key
	// The ranges are read a chunk at a time, each its own statement: a
	// row that moved between two of them meanwhile (its status changed)
	// can be read from both. A page lists an execution once.
	listed := map[string]bool{}
	for {
		next, err := s.pop(ctx, p)
		if err != nil {
			return page, err
		}
		if next == nil {
			return page, nil // the ranges are through: no next
		}
		examined++
		if p.match(*next) && !listed[next.row.ID] {
			if len(page.Rows) == limit {
				c := cursorOf(q.Sort, p.keyOfRow(page.Rows[limit-1]))
				page.Next = &c
				return page, nil
			}
			page.Rows = append(page.Rows, next.row)
			listed[next.row.ID] = true
		}
		last = next.key
		if examined >= s.budget {
			c := cursorOf(q.Sort, last)
			if len(page.Rows) == limit {
				c = cursorOf(q.Sort, p.keyOfRow(page.Rows[limit-1]))
			} else {
				page.Partial = true
			}
			page.Next = &c
			return page, nil
		}
	}
}

func cursorOf(s visibility.Sort, k key) visibility.Cursor {
	return visibility.Cursor{Sort: s, Time: k.t, ID: k.id}
}

// pop returns the next row in the plan's order, nil when every range is
// through.
func (s *Store) pop(ctx context.Context, p *plan) (*scanned, error) {
	var best *stream
	for _, st := range p.streams {
		if len(st.buf) == 0 && !st.done {
			if err := s.fill(ctx, st); err != nil {
				return nil, err
			}
		}
		if len(st.buf) == 0 {
			continue
		}
		if best == nil || (p.desc && best.buf[0].key.less(st.buf[0].key)) || (!p.desc && st.buf[0].key.less(best.buf[0].key)) {
			best = st
		}
	}
	if best == nil {
		return nil, nil
	}
	next := best.buf[0]
	best.buf = best.buf[1:]
	return &next, nil
}

// fill reads st's next chunk, and narrows its range past it.
func (s *Store) fill(ctx context.Context, st *stream) error {
	q := st.q
	if st.loExcl {
		q = st.qExcl
	}
	rows, err := s.pool.Query(ctx, q, st.rangeArgs()...)
	if err != nil {
		return fmt.Errorf("visibility: query: %w", err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		sc, err := scanRow(rows, st.keyOf)
		if err != nil {
			return err
		}
		st.buf = append(st.buf, sc)
		n++
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("visibility: query: %w", err)
	}
	if n < st.chunk {
		st.done = true
	} else if lastKey := st.buf[len(st.buf)-1].key; st.desc {
		st.hi = lastKey
	} else {
		st.lo, st.loExcl = lastKey, true
	}
	st.chunk = min(st.chunk*2, 1024)
	return nil
}

// rangeArgs are the arguments of st's query: the equalities', then the
// bounds and the limit.
func (st *stream) rangeArgs() []any {
	if !st.timed { // bounds on the id alone
		return append(append([]any{}, st.args...), st.lo.id, st.hi.id, st.chunk)
	}
	return append(append([]any{}, st.args...), st.lo.t, st.lo.id, st.hi.t, st.hi.id, st.chunk)
}

// scanRow reads a row of cols, and the extra attributes' columns after
// them; keyOf makes its key.
func scanRow(rows pgx.Rows, keyOf func(started, ended int64, id string) key) (scanned, error) {
	var sc scanned
	var r visibility.Row
	var status string
	var started, ended, updated int64
	var damaged, attrs *string
	var rev int64
	dest := []any{&r.ID, &r.Workflow, &r.Version, &status, &started, &ended, &updated, &r.Steps, &r.Done, &r.Error, &damaged, &attrs, &rev}
	sc.more = make([]bool, len(rows.FieldDescriptions())-len(dest))
	for i := range sc.more {
		dest = append(dest, &sc.more[i])
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
	sc.row, sc.key = r, keyOf(started, ended, r.ID)
	return sc, nil
}
