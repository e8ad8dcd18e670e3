package dispatch

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
)

// seenTasks is what the dispatcher learned by reading where a task that
// may have been sent would be (findTask): the agents' queue lanes (the
// tasks waiting there) and executions' reports. For each place read, the
// tasks seen and where the reading stopped. A task seen was stored (an
// agent may have taken it since, and then reported first). The look-ups
// of many steps left sending (a takeover after a long outage, a
// fan-out's items) read each place once, and then only what was stored
// since, for seenFor.
type seenTasks struct {
	mu     sync.Mutex
	places map[string]*seenPlace // by stream and filter
}

// seenPlace is what was read of one stream's subjects. Its mutex is held
// while it is read: one read at a time per place, and none holds the
// others up.
type seenPlace struct {
	mu   sync.Mutex
	ids  map[string]seenTask // by task id and token
	next uint64              // the stream sequence the next read starts from
	full bool                // more than seenMax seen: ids are no longer kept
	// read is when it was first read through (Unix ns; 0: not yet).
	read atomic.Int64
}

// seenTask is a task seen: the token it was sent with, where and when it
// was stored.
type seenTask struct {
	token string
	seq   uint64
	at    time.Time
}

const (
	// seenFor is how long what was read of a place is kept.
	seenFor = 10 * time.Second
	// seenMax bounds the tasks kept per place (about 150 bytes each).
	seenMax = 1 << 16
)

// placeReader reads a place from a stream sequence on, handing each
// task it names to fn with the message's stream sequence, until fn says
// stop.
type placeReader func(ctx context.Context, js jetstream.JetStream, from uint64, fn func(id string, t seenTask, seq uint64) (stop bool)) error

// errStop ends a read that found what it looked for.
var errStop = errors.New("found")

// queueReader reads a queue lane of the tasks stream (subject lane).
func queueReader(stream, lane string) placeReader {
	return func(ctx context.Context, js jetstream.JetStream, from uint64, fn func(string, seenTask, uint64) bool) error {
		return history.ScanQueue(ctx, js, stream, lane, from, func(ev events.Event) error {
			if task, ok := ev.Data.(*events.Task); ok && fn(ev.ID, seenTask{token: task.Token, seq: ev.Seq, at: ev.Time}, ev.Seq) {
				return errStop
			}
			return nil
		})
	}
}

// reportsReader reads the reports stored on filter.
func reportsReader(stream, filter string) placeReader {
	return func(ctx context.Context, js jetstream.JetStream, from uint64, fn func(string, seenTask, uint64) bool) error {
		return history.ScanReportsFrom(ctx, js, stream, filter, from, func(ev events.Event) error {
			if ref, ok := events.ResultRef(ev.Data); ok && fn(ref.TaskID, seenTask{token: ref.Token, seq: ref.TaskSeq, at: ref.StoredAt}, ev.Seq) {
				return errStop
			}
			return nil
		})
	}
}

// find reports whether task id, sent with token, was seen at place (a
// name for stream and filter), read with read.
func (c *seenTasks) find(ctx context.Context, js jetstream.JetStream, place string, read placeReader, id, token string) (seenTask, bool, error) {
	p := c.place(place)
	p.mu.Lock()
	defer p.mu.Unlock()
	if t, ok := p.ids[id+"\x00"+token]; ok {
		return t, true, nil
	}
	from := p.next
	if p.full {
		from = 0 // ids are not kept: read it all again, for this id only
	}
	var found *seenTask
	err := read(ctx, js, from, func(seen string, t seenTask, seq uint64) bool {
		if seen == id && t.token == token && found == nil {
			found = &t
		}
		if p.full {
			return found != nil // nothing kept: stop at it
		}
		key := seen + "\x00" + t.token
		if _, ok := p.ids[key]; !ok { // a task's first report says most
			p.ids[key] = t
		}
		p.next = max(p.next, seq+1)
		if len(p.ids) > seenMax {
			p.full, p.ids = true, map[string]seenTask{}
		}
		return false
	})
	if err != nil && !errors.Is(err, errStop) {
		return seenTask{}, false, err
	}
	if !errors.Is(err, errStop) {
		p.read.CompareAndSwap(0, time.Now().UnixNano())
	}
	if found == nil {
		return seenTask{}, false, nil
	}
	return *found, true, nil
}

// place is the place named so, made if it is new; places read more than
// seenFor ago are forgotten.
func (c *seenTasks) place(name string) *seenPlace {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	for n, p := range c.places {
		if at := p.read.Load(); at != 0 && now.Sub(time.Unix(0, at)) > seenFor {
			delete(c.places, n) // one being read keeps its own
		}
	}
	if c.places == nil {
		c.places = map[string]*seenPlace{}
	}
	p := c.places[name]
	if p == nil {
		p = &seenPlace{ids: map[string]seenTask{}}
		c.places[name] = p
	}
	return p
}
