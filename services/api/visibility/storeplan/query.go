package storeplan

import (
	"context"

	"jetflow.dev/services/api/visibility"
)

// Reader reads one range of a plan, a chunk at a time: what a store does
// its own way (the statement's text and placeholders, how it expresses an
// excluded lower bound, running it).
type Reader interface {
	// Read returns the range's rows within b, in the range's order: limit
	// of them, or fewer when the range is through.
	Read(ctx context.Context, b Bounds, limit int) ([]Scanned, error)
}

// stream is a range read in order, a chunk at a time.
type stream struct {
	r Reader
	// b bounds what is left to read.
	b     Bounds
	chunk int
	buf   []Scanned
	done  bool
}

// Query answers q: it plans it (New, with maxID), reads each range with
// the Reader open makes of it, merges the ranges in order, keeps the rows
// that match, and stops once the page is full and one more match is seen
// (so next is set only when there is more), or the ranges end, or budget
// entries were examined. examined is how many were.
func Query(ctx context.Context, q visibility.Query, maxID string, budget int, open func(Range) Reader) (page visibility.Page, examined int, err error) {
	p, err := New(q, maxID)
	if err != nil {
		return page, 0, err
	}
	streams := make([]*stream, len(p.Ranges))
	for i, r := range p.Ranges {
		streams[i] = &stream{r: open(r), b: p.Bounds, chunk: min(p.limit+1, 128)}
	}
	limit := p.limit
	var last Key
	// The ranges are read a chunk at a time, each its own statement: a
	// row that moved between two of them meanwhile (its status changed)
	// can be read from both. A page lists an execution once.
	listed := map[string]bool{}
	for {
		next, err := p.pop(ctx, streams)
		if err != nil {
			return page, examined, err
		}
		if next == nil {
			return page, examined, nil // the ranges are through: no next
		}
		examined++
		if p.match(*next) && !listed[next.Row.ID] {
			if len(page.Rows) == limit {
				c := p.cursor(p.Key(page.Rows[limit-1]))
				page.Next = &c
				return page, examined, nil
			}
			page.Rows = append(page.Rows, next.Row)
			listed[next.Row.ID] = true
		}
		last = next.key
		if examined >= budget {
			c := p.cursor(last)
			if len(page.Rows) == limit {
				c = p.cursor(p.Key(page.Rows[limit-1]))
			} else {
				page.Partial = true
			}
			page.Next = &c
			return page, examined, nil
		}
	}
}

func (p *Plan) cursor(k Key) visibility.Cursor {
	return visibility.Cursor{Sort: p.sort, Time: k.T, ID: k.ID}
}

// pop returns the next row in p's order, nil when every stream is
// through.
func (p *Plan) pop(ctx context.Context, streams []*stream) (*Scanned, error) {
	var best *stream
	for _, st := range streams {
		if len(st.buf) == 0 && !st.done {
			if err := p.fill(ctx, st); err != nil {
				return nil, err
			}
		}
		if len(st.buf) == 0 {
			continue
		}
		if best == nil || (p.Desc && best.buf[0].key.Less(st.buf[0].key)) || (!p.Desc && st.buf[0].key.Less(best.buf[0].key)) {
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
func (p *Plan) fill(ctx context.Context, st *stream) error {
	rows, err := st.r.Read(ctx, st.b, st.chunk)
	if err != nil {
		return err
	}
	for i := range rows {
		rows[i].key = p.Key(rows[i].Row)
	}
	st.buf = rows
	if len(rows) < st.chunk {
		st.done = true
	} else if lastKey := rows[len(rows)-1].key; p.Desc {
		st.b.Hi = lastKey
	} else {
		st.b.Lo, st.b.LoExcl = lastKey, true
	}
	st.chunk = min(st.chunk*2, 1024)
	return nil
}
