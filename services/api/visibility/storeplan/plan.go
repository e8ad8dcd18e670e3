// Package storeplan is how the SQL visibility stores (packages
// sqlitestore and pgstore) answer a visibility.Query, but for the SQL
// itself: the plan (which index ranges a query reads, one per status it
// merges, and what is left to check row by row), the merge of those
// ranges in order with keyset paging a chunk at a time, ScanBudget,
// partial pages and cursors, and the reading of a row.
//
// What differs between the stores is a Reader: the statement of one
// Range (its text, its placeholders, how an excluded lower bound is
// written) and running it. New is pure planning; Query does the I/O,
// through the Readers.
package storeplan

import (
	"fmt"
	"math"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/visibility"
)

// Key is a row's place in an order: its time of the order's key (0 for
// the id order) and its id.
type Key struct {
	T  int64
	ID string
}

// Less reports whether k is before o in ascending order.
func (k Key) Less(o Key) bool { return k.T < o.T || (k.T == o.T && k.ID < o.ID) }

// Bounds are what is left of a range to read: [Lo, Hi), or (Lo, Hi)
// with LoExcl.
type Bounds struct {
	Lo, Hi Key
	LoExcl bool
}

// Index is the index a Range is read from. Each leads with columns equal
// to the range's Eq, then the sort's key (its column and the id).
type Index int

const (
	// ByStatus: executions by status; Eq is the status.
	ByStatus Index = iota
	// ByWorkflowStatus: executions by workflow and status; Eq is the
	// workflow and the status.
	ByWorkflowStatus
	// Damaged: the damaged executions; Eq is empty.
	Damaged
	// ByAttr: the search attributes, by name and value; Eq is the name
	// and the value.
	ByAttr
)

// Range is one index range a plan reads in the plan's order. A store
// makes it a statement that reads Columns, then a boolean column per
// attribute of More, of the rows of the index whose leading columns
// equal Eq and whose key is within the Bounds it is given.
type Range struct {
	Index Index
	Eq    []string
	// Key is the sort's key: "id", "started" or "ended" (see
	// visibility.Sort.Key).
	Key  string
	Desc bool
	// More are further attributes, checked per row, by a column each.
	More []visibility.Attr
}

// Column is the column of r's key beside the id: "" for the id order.
func (r Range) Column() string {
	switch r.Key {
	case "started":
		return "started_at"
	case "ended":
		return "ended_at"
	}
	return ""
}

// Timed reports whether r's key has a time (the order is not by id).
func (r Range) Timed() bool { return r.Column() != "" }

// Columns are the columns of executions e every range reads, as ScanRows
// reads them.
const Columns = `e.id, e.workflow, e.version, e.status, e.started_at, e.ended_at, e.updated_at, e.steps, e.done, e.error, e.damaged, e.attrs, e.rev`

// Plan is how a query is answered: the ranges merged, each first read
// within Bounds, and the filters checked row by row.
type Plan struct {
	Ranges []Range
	Bounds Bounds
	Desc   bool
	sort   visibility.Sort
	limit  int
	keyOf  func(started, ended int64, id string) Key
	// match reports whether a row read passes the filters its range does
	// not apply.
	match func(Scanned) bool
}

// Key is r's key in p's order.
func (p *Plan) Key(r visibility.Row) Key {
	return p.keyOf(visibility.UnixNano(r.StartedAt), visibility.UnixNano(r.EndedAt), r.ID)
}

// New chooses the index ranges for q (see visibility.Query). maxID is
// above every id in the store's order of text (ids are printable ASCII).
func New(q visibility.Query, maxID string) (*Plan, error) {
	k := q.Sort.Key()
	p := &Plan{Desc: q.Sort.Desc(), sort: q.Sort, limit: max(q.Limit, 1)}
	// The bounds of the range a time filter gives, and what is left to
	// check per row.
	lo, hi := Key{math.MinInt64, ""}, Key{math.MaxInt64, maxID}
	loExcl := false
	var after, before [2]int64 // started, ended: the filters not on the key
	after[0], before[0] = visibility.UnixNano(q.StartedAfter), visibility.UnixNano(q.StartedBefore)
	after[1], before[1] = visibility.UnixNano(q.EndedAfter), visibility.UnixNano(q.EndedBefore)
	rangeOn := -1
	switch k {
	case "id":
		p.keyOf = func(_, _ int64, id string) Key { return Key{0, id} }
	case "started":
		rangeOn = 0
		p.keyOf = func(started, _ int64, id string) Key { return Key{started, id} }
	case "ended":
		rangeOn = 1
		p.keyOf = func(_, ended int64, id string) Key { return Key{ended, id} }
		lo = Key{1, ""} // ended executions only
	default:
		return nil, fmt.Errorf("visibility: unknown sort %q", q.Sort)
	}
	if rangeOn >= 0 {
		if a := (Key{after[rangeOn], ""}); after[rangeOn] != 0 && lo.Less(a) {
			lo = a
		}
		if before[rangeOn] != 0 {
			hi = Key{before[rangeOn], ""}
		}
		after[rangeOn], before[rangeOn] = 0, 0 // in the range: not checked per row
	}
	if c := q.After; c != nil {
		ck := Key{c.Time, c.ID}
		if k == "id" {
			ck.T = 0
		}
		if p.Desc {
			if ck.Less(hi) {
				hi = ck
			}
		} else if !ck.Less(lo) {
			lo, loExcl = ck, true
		}
	}
	p.Bounds = Bounds{Lo: lo, Hi: hi, LoExcl: loExcl}
	// The index the ranges are on: that of the damaged, of the first
	// attribute, or of the statuses (ByStatus here stands for
	// ByWorkflowStatus too); further attributes are checked per row, by a
	// column each.
	attrs := q.Attrs
	drive := ByStatus
	switch {
	case q.Damaged:
		drive = Damaged
	case len(attrs) > 0:
		drive = ByAttr
		attrs = attrs[1:]
	}
	add := func(ix Index, eq ...string) {
		p.Ranges = append(p.Ranges, Range{Index: ix, Eq: eq, Key: k, Desc: p.Desc, More: attrs})
	}
	switch drive {
	case Damaged:
		add(Damaged)
	case ByAttr:
		add(ByAttr, q.Attrs[0].Name, q.Attrs[0].Value)
	default:
		statuses := []projections.Status{q.Status}
		if q.Status == "" {
			statuses = visibility.Statuses
		}
		for _, st := range statuses {
			if q.Workflow != "" {
				add(ByWorkflowStatus, q.Workflow, string(st))
			} else {
				add(ByStatus, string(st))
			}
		}
	}
	// What the ranges do not filter.
	checkWorkflow := q.Workflow != "" && drive != ByStatus
	checkStatus := q.Status != "" && drive != ByStatus
	checkDamaged := q.Damaged && drive != Damaged
	p.match = func(s Scanned) bool {
		r := s.Row
		if (checkWorkflow && r.Workflow != q.Workflow) || (checkStatus && r.Status != q.Status) || (checkDamaged && r.Damaged == nil) {
			return false
		}
		for i, t := range [2]int64{visibility.UnixNano(r.StartedAt), visibility.UnixNano(r.EndedAt)} {
			if (after[i] != 0 && t < after[i]) || (before[i] != 0 && t >= before[i]) {
				return false
			}
		}
		for _, m := range s.More {
			if !m {
				return false
			}
		}
		return true
	}
	return p, nil
}
