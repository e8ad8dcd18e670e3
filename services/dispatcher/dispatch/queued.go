package dispatch

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
)

// queuedTasks is what the dispatcher learned of the tasks waiting in the
// agents' queues by reading them (findTask): for each lane, the task ids
// it saw and where it stopped. A task seen was stored (an agent may have
// taken it since, and then reported first). The look-ups of many steps
// left sending (a takeover after a long outage, a fan-out's items) read
// each lane once, and then only what was stored since, for queuedFor.
type queuedTasks struct {
	mu    sync.Mutex
	lanes map[string]*laneTasks
}

type laneTasks struct {
	ids  map[string]storedTask
	next uint64    // the sequence the next read starts from
	read time.Time // when the lane was first read
	full bool      // more than queuedMax seen: ids are no longer kept
}

// storedTask is where and when a task was stored.
type storedTask struct {
	seq uint64
	at  time.Time
}

const (
	// queuedFor is how long what was read of a lane is kept.
	queuedFor = 10 * time.Second
	// queuedMax bounds the ids kept per lane (about 100 bytes each).
	queuedMax = 1 << 17
)

// find reports whether task id is stored in lane (a task subject), and
// where.
func (q *queuedTasks) find(ctx context.Context, js jetstream.JetStream, lane, id string) (storedTask, bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	for name, l := range q.lanes {
		if now.Sub(l.read) > queuedFor {
			delete(q.lanes, name)
		}
	}
	if q.lanes == nil {
		q.lanes = map[string]*laneTasks{}
	}
	l := q.lanes[lane]
	if l == nil {
		l = &laneTasks{ids: map[string]storedTask{}, read: now}
		q.lanes[lane] = l
	}
	if t, ok := l.ids[id]; ok {
		return t, true, nil
	}
	from := l.next
	if l.full {
		from = 0 // ids were not kept: read it all again, for this id only
	}
	var found *storedTask
	err := history.ScanReportsFrom(ctx, js, bus.StreamTasks, lane, from, func(ev events.Event) error {
		t := storedTask{seq: ev.Seq, at: ev.Time}
		if ev.ID == id {
			found = &t
		}
		if !l.full {
			l.ids[ev.ID] = t
			l.next = ev.Seq + 1
			if len(l.ids) > queuedMax {
				l.full, l.ids = true, map[string]storedTask{}
			}
		}
		return nil
	})
	if err != nil || found == nil {
		return storedTask{}, false, err
	}
	return *found, true, nil
}
