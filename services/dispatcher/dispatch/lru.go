package dispatch

import "container/list"

// lru is a small least-recently-used cache of execution states. It is not
// safe for concurrent use; Dispatcher.mu guards it.
type lru struct {
	max   int
	order *list.List
	items map[string]*list.Element
}

type lruEntry struct {
	key string
	val *execState
}

func newLRU(max int) *lru {
	return &lru{max: max, order: list.New(), items: map[string]*list.Element{}}
}

func (c *lru) get(k string) (*execState, bool) {
	if e, ok := c.items[k]; ok {
		c.order.MoveToFront(e)
		return e.Value.(*lruEntry).val, true
	}
	return nil, false
}

func (c *lru) put(k string, v *execState) {
	if e, ok := c.items[k]; ok {
		e.Value.(*lruEntry).val = v
		c.order.MoveToFront(e)
		return
	}
	c.items[k] = c.order.PushFront(&lruEntry{key: k, val: v})
	for c.order.Len() > c.max {
		last := c.order.Back()
		c.order.Remove(last)
		delete(c.items, last.Value.(*lruEntry).key)
	}
}

func (c *lru) remove(k string) {
	if e, ok := c.items[k]; ok {
		c.order.Remove(e)
		delete(c.items, k)
	}
}
