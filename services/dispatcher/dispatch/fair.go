package dispatch

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// turns hands the jobs of many executions to the workers in turns: each
// execution has its own queue (its messages in the order they came), an
// execution with jobs waits in one line of ready executions, and a worker
// handles one job of the execution at the head of the line, then sends it
// to the back if it has more. So an execution's messages are handled one
// at a time and in order, and a huge execution (a fan-out whose reports
// arrive by the hundred) costs every other execution at most one job per
// turn, never a wait behind its backlog.
//
// Adding never blocks: a consumer's callback must not wait for a busy
// execution, or every execution behind it in the stream would wait too.
// A message JetStream delivers again while its first delivery still waits
// here (its ack wait passed in a long backlog) replaces that one instead
// of queueing a second copy, so what the queues hold is bounded by the
// consumers' MaxAckPending, and a backlog never grows by its own
// redeliveries.
type turns struct {
	mu      sync.Mutex
	ready   sync.Cond
	queues  map[string]*execQueue
	line    []string // executions with jobs, none being handled
	head    int      // line[head:] is the line
	closed  bool
	waiting int // workers waiting for a job
}

// execQueue is one execution's jobs.
type execQueue struct {
	jobs []*entry
	busy bool // a worker handles one of its jobs
	// queued finds a queued job by the message it carries.
	queued map[msgKey]*entry
}

// entry is a queued job and its message's key (keyed: it has one).
type entry struct {
	job   job
	key   msgKey
	keyed bool
}

// msgKey names a stored message as a consumer delivers it.
type msgKey struct {
	consumer string
	seq      uint64
}

// keyOf returns the message's key; ok is false for a job without one.
func keyOf(j job) (msgKey, bool) {
	if j.msg == nil {
		return msgKey{}, false
	}
	md, err := j.msg.Metadata()
	if err != nil {
		return msgKey{}, false
	}
	return msgKey{consumer: md.Consumer, seq: md.Sequence.Stream}, true
}

func newTurns() *turns {
	t := &turns{queues: map[string]*execQueue{}}
	t.ready.L = &t.mu
	return t
}

// add queues j behind its execution's other jobs. It reports false once
// the turns are closed (the job was not queued).
func (t *turns) add(j job) bool {
	e := &entry{job: j}
	e.key, e.keyed = keyOf(j) // outside the lock: it parses the reply subject
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	q := t.queues[j.key]
	if q == nil {
		q = &execQueue{queued: map[msgKey]*entry{}}
		t.queues[j.key] = q
	}
	if old := q.queued[e.key]; e.keyed && old != nil {
		// Delivered again while it waits: keep the newest delivery (its
		// acknowledgement is the one that counts, and its holding the
		// current one), in the first one's place.
		old.job.from.done()
		old.job = j
		return true
	}
	q.jobs = append(q.jobs, e)
	if e.keyed {
		q.queued[e.key] = e
	}
	if len(q.jobs) == 1 && !q.busy {
		t.line = append(t.line, j.key)
		if t.waiting > 0 {
			t.ready.Signal()
		}
	}
	return true
}

// next waits for the execution at the head of the line and returns its
// first job; the caller handles it and calls done. It reports false once
// the turns are closed and no job is left.
func (t *turns) next() (job, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for t.head == len(t.line) {
		if t.closed {
			return job{}, false
		}
		t.waiting++
		t.ready.Wait()
		t.waiting--
	}
	key := t.line[t.head]
	t.line[t.head] = ""
	t.head++
	if t.head == len(t.line) { // empty: reuse the array from its start
		t.line, t.head = t.line[:0], 0
	} else if t.head > 1024 && t.head*2 > len(t.line) {
		t.line, t.head = append(t.line[:0], t.line[t.head:]...), 0
	}
	q := t.queues[key]
	e := q.jobs[0]
	q.jobs[0] = nil
	q.jobs = q.jobs[1:]
	if e.keyed {
		delete(q.queued, e.key)
	}
	q.busy = true
	return e.job, true
}

// done ends the turn of j's execution: to the back of the line if it has
// more jobs, forgotten if not.
func (t *turns) done(j job) {
	t.mu.Lock()
	defer t.mu.Unlock()
	q := t.queues[j.key]
	q.busy = false
	if len(q.jobs) == 0 {
		delete(t.queues, j.key)
		return
	}
	t.line = append(t.line, j.key)
	if t.waiting > 0 {
		t.ready.Signal()
	}
}

// withdraw takes out of the queues the jobs that wait for their turn
// (none being handled) and that take says to, and returns them in the
// order they were queued, execution by execution.
func (t *turns) withdraw(take func(job) bool) []job {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []job
	for key, q := range t.queues {
		kept := q.jobs[:0]
		for _, e := range q.jobs {
			if !take(e.job) {
				kept = append(kept, e)
				continue
			}
			out = append(out, e.job)
			if e.keyed {
				delete(q.queued, e.key)
			}
		}
		clear(q.jobs[len(kept):])
		q.jobs = kept
		if len(q.jobs) == 0 && !q.busy {
			delete(t.queues, key)
		}
	}
	// The line holds the executions with jobs and none being handled:
	// those left without a job leave it.
	line := t.line[:0]
	for _, key := range t.line[t.head:] {
		if q := t.queues[key]; q != nil && len(q.jobs) > 0 && !q.busy {
			line = append(line, key)
		}
	}
	clear(t.line[len(line):])
	t.line, t.head = line, 0
	return out
}

// backlog is how many jobs of execution key wait for their turn (the one
// being handled not counted).
func (t *turns) backlog(key string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if q := t.queues[key]; q != nil {
		return len(q.jobs)
	}
	return 0
}

// due returns the messages of the queued jobs whose last sign of life is
// every(job) old or more, and counts them alive from now: the caller
// sends each an in-progress acknowledgement.
func (t *turns) due(now time.Time, every func(job) time.Duration) []jetstream.Msg {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []jetstream.Msg
	for _, q := range t.queues {
		for _, e := range q.jobs {
			if e.job.msg != nil && now.Sub(e.job.alive) >= every(e.job) {
				e.job.alive = now
				out = append(out, e.job.msg)
			}
		}
	}
	return out
}

// close refuses new jobs; the workers handle those queued, then next
// reports false.
func (t *turns) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	t.ready.Broadcast()
}
