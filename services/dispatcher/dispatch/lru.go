package dispatch

import (
	"container/list"
	"unsafe"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/interp"
)

// lru is a small least-recently-used cache, bounded by a count of
// entries and, when sizeOf is given, by the bytes they hold (sizeOf of
// each value, taken when it is put). The dispatcher keeps its execution
// states in one (execState.size) and its pinned definitions in another
// (count only). It is not safe for concurrent use: its owner guards it.
type lru[K comparable, V any] struct {
	max      int         // entries
	maxBytes int         // the entries' bytes (with sizeOf)
	sizeOf   func(V) int // nil: bounded by count only
	bytes    int         // the entries' bytes now
	order    *list.List  // of *lruEntry[K, V], most recently used first
	items    map[K]*list.Element
}

type lruEntry[K comparable, V any] struct {
	key  K
	val  V
	size int // sizeOf(val) when it was put
}

func newLRU[K comparable, V any](max, maxBytes int, sizeOf func(V) int) *lru[K, V] {
	return &lru[K, V]{max: max, maxBytes: maxBytes, sizeOf: sizeOf, order: list.New(), items: map[K]*list.Element{}}
}

func (c *lru[K, V]) get(k K) (V, bool) {
	if e, ok := c.items[k]; ok {
		c.order.MoveToFront(e)
		return e.Value.(*lruEntry[K, V]).val, true
	}
	var zero V
	return zero, false
}

// put keeps v under k, or takes its size again if it is kept already (a
// cached state changed in place), and lets the least recently used go
// until both bounds hold. The entry just put is kept even if it alone is
// over the byte bound: the execution being handled is the one most
// likely to be handled next.
func (c *lru[K, V]) put(k K, v V) {
	size := 0
	if c.sizeOf != nil {
		size = c.sizeOf(v)
	}
	if e, ok := c.items[k]; ok {
		ent := e.Value.(*lruEntry[K, V])
		c.bytes += size - ent.size
		ent.val, ent.size = v, size
		c.order.MoveToFront(e)
	} else {
		c.items[k] = c.order.PushFront(&lruEntry[K, V]{key: k, val: v, size: size})
		c.bytes += size
	}
	for c.order.Len() > 1 && (c.order.Len() > c.max || (c.sizeOf != nil && c.bytes > c.maxBytes)) {
		c.drop(c.order.Back())
	}
}

func (c *lru[K, V]) remove(k K) {
	if e, ok := c.items[k]; ok {
		c.drop(e)
	}
}

func (c *lru[K, V]) drop(e *list.Element) {
	ent := e.Value.(*lruEntry[K, V])
	c.order.Remove(e)
	delete(c.items, ent.key)
	c.bytes -= ent.size
}

// len is the number of entries kept.
func (c *lru[K, V]) len() int { return c.order.Len() }

// entryOverhead is what an entry costs the cache itself: its list element,
// its lruEntry, its map slot, and the execState and Memo records.
const entryOverhead = int(unsafe.Sizeof(list.Element{})+unsafe.Sizeof(lruEntry[string, *execState]{})+unsafe.Sizeof(execState{})) + 48

// viewBytesPerStep estimates what the interpreter's view of a large
// execution (its Memo) holds per step instance: its id, its place in the
// maps of positions and frames, at most one list of steps' memo (a list
// has an instance at least: a foreach item's, a branch's), and a foreach
// item's decoded output, counted as twice its JSON.
const viewBytesPerStep = 96 + 64

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
