package dispatch

import "sync"

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
// What it holds is bounded by the consumers' MaxAckPending.
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
	jobs []job
	busy bool // a worker handles one of its jobs
}

func newTurns() *turns {
	t := &turns{queues: map[string]*execQueue{}}
	t.ready.L = &t.mu
	return t
}

// add queues j behind its execution's other jobs. It reports false once
// the turns are closed (the job was not queued).
func (t *turns) add(j job) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	q := t.queues[j.key]
	if q == nil {
		q = &execQueue{}
		t.queues[j.key] = q
	}
	q.jobs = append(q.jobs, j)
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
	j := q.jobs[0]
	q.jobs[0] = job{}
	q.jobs = q.jobs[1:]
	q.busy = true
	return j, true
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

// close refuses new jobs; the workers handle those queued, then next
// reports false.
func (t *turns) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	t.ready.Broadcast()
}
