package dispatch

import (
	"container/list"
	"unsafe"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/interp"
)

// lru is a small least-recently-used cache of execution states, bounded
// by a count of entries and by an estimate of the bytes they hold
// (execState.size, taken when an entry is put). It is not safe for
// concurrent use; Dispatcher.mu guards it.
type lru struct {
	max      int // entries
	maxBytes int // the entries' estimated bytes
	bytes    int // the entries' estimated bytes now
	order    *list.List
	items    map[string]*list.Element
}

type lruEntry struct {
	key  string
	val  *execState
	size int // val.size() when it was put
}

func newLRU(max, maxBytes int) *lru {
	return &lru{max: max, maxBytes: maxBytes, order: list.New(), items: map[string]*list.Element{}}
}

func (c *lru) get(k string) (*execState, bool) {
	if e, ok := c.items[k]; ok {
		c.order.MoveToFront(e)
		return e.Value.(*lruEntry).val, true
	}
	return nil, false
}

// put keeps v under k, or takes its size again if it is kept already (a
// cached state changed in place), and lets the least recently used go
// until both bounds hold. The entry just put is kept even if it alone is
// over the byte bound: the execution being handled is the one most
// likely to be handled next.
func (c *lru) put(k string, v *execState) {
	size := v.size()
	if e, ok := c.items[k]; ok {
		ent := e.Value.(*lruEntry)
		c.bytes += size - ent.size
		ent.val, ent.size = v, size
		c.order.MoveToFront(e)
	} else {
		c.items[k] = c.order.PushFront(&lruEntry{key: k, val: v, size: size})
		c.bytes += size
	}
	for c.order.Len() > 1 && (c.order.Len() > c.max || c.bytes > c.maxBytes) {
		c.drop(c.order.Back())
	}
}

func (c *lru) remove(k string) {
	if e, ok := c.items[k]; ok {
		c.drop(e)
	}
}

func (c *lru) drop(e *list.Element) {
	ent := e.Value.(*lruEntry)
	c.order.Remove(e)
	delete(c.items, ent.key)
	c.bytes -= ent.size
}

// entryOverhead is what an entry costs the cache itself: its list element,
// its lruEntry, its map slot, and the execState and Memo records.
const entryOverhead = int(unsafe.Sizeof(list.Element{})+unsafe.Sizeof(lruEntry{})+unsafe.Sizeof(execState{})) + 48

// viewBytesPerStep estimates what the interpreter's view of a large
// execution (its Memo) holds per step instance: its id, its place in the
// maps of positions and frames, and a foreach item's decoded output,
// counted as twice its JSON.
const viewBytesPerStep = 96

// size estimates the bytes x holds: the folded state, the interpreter's
// view of it, and the cache entry. The definition is shared with every
// execution of its version (pinnedDefs) and is not counted.
func (x *execState) size() int {
	n := entryOverhead + len(x.id) + len(x.workflow) + projections.SizeEstimate(&x.state)
	if x.memo != nil && len(x.state.Steps) > interp.SmallExecution {
		n += len(x.state.Steps) * viewBytesPerStep
		for i := range x.state.Steps {
			n += 2 * len(x.state.Steps[i].Output)
		}
	}
	return n
}
