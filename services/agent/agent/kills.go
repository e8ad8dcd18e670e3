package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
)

// ErrKilled is the error of an operation terminated because an operator
// killed its execution.
var ErrKilled = errors.New("terminated: an operator killed the execution")

// ErrEnded is the error of a task refused because its execution ended
// (a force-cancel, a failure while it waited) before it started.
var ErrEnded = errors.New("refused: the execution ended before this task started")

// ErrTerminated is the error of an attempt terminated, or refused,
// because its step gave up on it (its timeout fired).
var ErrTerminated = errors.New("terminated: the step gave up on this attempt")

// kills tracks the running operations by execution, so that a kill notice
// terminates them (exec processes get SIGTERM, then SIGKILL after
// KillGrace; Go handlers see their context cancelled), the executions
// killed or ended, so that a task of one does not start, and the single
// attempts terminated (their step timed out), so that their task does
// not start either. An ended execution's notice names the tokens of its
// tasks out and applies to the tasks that carry one of them only: a
// resumed execution's new tasks carry a new token. A kill applies to
// every task of the execution until a resume lifts it.
type kills struct {
	mu      sync.Mutex
	killed  notices // by execution
	tasks   notices // by task id
	running map[string]map[uint64]runningOp
	next    uint64
}

// runningOp is an operation running: its task, and how to terminate it.
type runningOp struct {
	taskID string
	cancel context.CancelCauseFunc
}

// killNotice is a notice followed: when it came, its sequence in the
// kill notices stream, the tokens of the tasks it is about (none: every
// task), whether it only ends the execution (its running operations go
// on) and, for a single attempt, why.
type killNotice struct {
	at     time.Time
	seq    uint64
	tokens []string
	ended  bool
	reason string
}

// appliesTo reports whether n refuses or terminates a task that carries
// token: one of the notice's, or any if it names none.
func (n killNotice) appliesTo(token string) bool {
	return len(n.tokens) == 0 || slices.Contains(n.tokens, token)
}

// notices is a bounded set of notices by key, forgetting the oldest
// first: those older than killsForgotten, and any beyond maxNotices.
type notices struct {
	byKey map[string]killNotice
	order []noticeKey // in order of arrival; stale entries are skipped
}

type noticeKey struct {
	key string
	at  time.Time
}

// maxNotices bounds the notices remembered of each kind: a forgotten
// one's task, should it come later, runs, and its result is ignored or
// noted after the end, as before notices existed.
const maxNotices = 100_000

// killsForgotten is how long a notice is remembered: the stream keeps
// notices a day.
const killsForgotten = 25 * time.Hour

func (ns *notices) get(key string) (killNotice, bool) {
	n, ok := ns.byKey[key]
	return n, ok
}

func (ns *notices) put(key string, n killNotice) {
	if ns.byKey == nil {
		ns.byKey = map[string]killNotice{}
	}
	for len(ns.order) > 0 {
		first := ns.order[0]
		if len(ns.byKey) < maxNotices && n.at.Sub(first.at) <= killsForgotten {
			break
		}
		if kept, ok := ns.byKey[first.key]; ok && kept.at.Equal(first.at) {
			delete(ns.byKey, first.key)
		}
		ns.order = ns.order[1:]
	}
	ns.byKey[key] = n
	ns.order = append(ns.order, noticeKey{key, n.at})
	if len(ns.order) > 2*maxNotices { // entries of keys put again or removed
		ns.order = slices.DeleteFunc(ns.order, func(o noticeKey) bool {
			kept, ok := ns.byKey[o.key]
			return !ok || !kept.at.Equal(o.at)
		})
	}
}

func (ns *notices) remove(key string) { delete(ns.byKey, key) }

func newKills() *kills {
	return &kills{running: map[string]map[uint64]runningOp{}}
}

// start registers a running operation of execID whose task carries token. It returns
// the context to run it in and the function to call when it ends, or the
// error refusing it (ErrKilled, ErrEnded, ErrTerminated) if that run was
// killed or ended, or the attempt terminated.
func (k *kills) start(parent context.Context, execID, taskID, token string) (ctx context.Context, done func(), refused error) {
	return k.startLifted(parent, execID, taskID, token, 0)
}

// startLifted is start for an execution whose kill the stream shows lifted
// at sequence lifted, before this agent has followed the lift: a kill
// noticed at or before that sequence does not refuse the operation, a
// later one does.
func (k *kills) startLifted(parent context.Context, execID, taskID, token string, lifted uint64) (ctx context.Context, done func(), refused error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if n, gone := k.tasks.get(taskID); gone && taskID != "" {
		return nil, func() {}, taskError(n)
	}
	if n, dead := k.killed.get(execID); dead && n.appliesTo(token) && (lifted == 0 || n.seq > lifted) {
		if n.ended {
			return nil, func() {}, ErrEnded
		}
		return nil, func() {}, ErrKilled
	}
	ctx, cancel := context.WithCancelCause(parent)
	k.next++
	id := k.next
	if k.running[execID] == nil {
		k.running[execID] = map[uint64]runningOp{}
	}
	k.running[execID][id] = runningOp{taskID: taskID, cancel: cancel}
	return ctx, func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		delete(k.running[execID], id)
		if len(k.running[execID]) == 0 {
			delete(k.running, execID)
		}
		cancel(nil)
	}, nil
}

// taskError is the error of an attempt terminated by n.
func taskError(n killNotice) error {
	if n.reason == "" {
		return ErrTerminated
	}
	return fmt.Errorf("%w (%s)", ErrTerminated, n.reason)
}

// kill terminates the running operations of execID and refuses its later
// tasks, for the notice at stream sequence seq. It returns how many were
// running.
func (k *kills) kill(execID string, seq uint64, now time.Time) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.killed.put(execID, killNotice{at: now, seq: seq})
	for _, op := range k.running[execID] {
		op.cancel(ErrKilled)
	}
	return len(k.running[execID])
}

// end refuses the later tasks of execID that carry one of tokens, for
// the notice at stream sequence seq (it ended); its running operations
// go on.
func (k *kills) end(execID string, tokens []string, seq uint64, now time.Time) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.killed.put(execID, killNotice{at: now, seq: seq, tokens: tokens, ended: true})
}

// killTask terminates the attempt taskID of execID if it runs here, and
// refuses its task if it comes later. It returns whether it was running.
func (k *kills) killTask(execID, taskID, reason string, seq uint64, now time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	n := killNotice{at: now, seq: seq, reason: reason}
	k.tasks.put(taskID, n)
	running := false
	for _, op := range k.running[execID] {
		if op.taskID == taskID {
			op.cancel(taskError(n))
			running = true
		}
	}
	return running
}

// killsCatchUp bounds the wait for the kill notices kept in the stream
// when an agent starts.
const killsCatchUp = 30 * time.Second

// lift forgets that execID was killed: it was resumed.
func (k *kills) lift(execID string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.killed.remove(execID)
}

// watchKillsUntil is watchKills tried again, with a pause that doubles
// from killsRetry up to a few seconds, until it succeeds or ctx ends (its
// only error): a JetStream request at start that times out or finds no
// leader (a busy cluster, a node restarting, a stream not made yet) is
// waited out, as the queues' binding waits for the bootstrap, instead of
// stopping the agent.
func (a *Agent) watchKillsUntil(ctx context.Context) (stop func(), err error) {
	for pause := killsRetry; ; pause = min(2*pause, 5*time.Second) {
		stop, err := a.watchKills(ctx)
		if err == nil {
			return stop, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		a.log.Warn().Err(err).Dur("retry_in", pause).Msg("cannot follow the kill notices yet; trying again")
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pause):
		}
	}
}

// killsRetry is the first pause before following the kill notices is
// tried again.
const killsRetry = 200 * time.Millisecond

// watchKills follows the kill notices (all those kept, then new ones). It
// returns once the notices kept when it started are known, so that a task
// of an execution killed before this agent started is refused.
func (a *Agent) watchKills(ctx context.Context) (stop func(), err error) {
	cons, err := a.js.OrderedConsumer(ctx, bus.StreamKills, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{bus.KillsPrefix + ".>"}, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("follow kill notices: %w", err)
	}
	stream, err := a.js.Stream(ctx, bus.StreamKills)
	if err != nil {
		return nil, fmt.Errorf("follow kill notices: %w", err)
	}
	caughtUp := make(chan struct{})
	var once sync.Once
	if stream.CachedInfo().State.Msgs == 0 { // nothing to read first
		once.Do(func() { close(caughtUp) })
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		var seq uint64
		if md, err := m.Metadata(); err == nil {
			seq = md.Sequence.Stream
			if md.NumPending == 0 {
				defer once.Do(func() { close(caughtUp) })
			}
		}
		ev, err := bus.Decode(m.Headers(), m.Data())
		if err != nil {
			a.log.Warn().Err(err).Str("subject", m.Subject()).Msg("ignore malformed kill notice")
			return
		}
		switch p := ev.Data.(type) {
		case *events.KillOperations:
			if p.Lift {
				a.kills.lift(p.ExecutionID)
				return
			}
			if n := a.kills.kill(p.ExecutionID, seq, time.Now()); n > 0 {
				a.log.Info().Str("execution_id", p.ExecutionID).Int("operations", n).Dur("grace", a.cfg.KillGrace).
					Msg("terminating the operations of a killed execution")
			}
		case *events.RefuseTasks:
			a.kills.end(p.ExecutionID, p.Tokens, seq, time.Now())
		case *events.TerminateTask:
			if a.kills.killTask(p.ExecutionID, p.TaskID, p.Reason, seq, time.Now()) {
				a.log.Info().Str("execution_id", p.ExecutionID).Str("task_id", p.TaskID).Str("reason", p.Reason).Dur("grace", a.cfg.KillGrace).
					Msg("terminating an operation its step gave up on")
			}
		default:
			a.log.Warn().Str("type", string(ev.Type)).Str("subject", m.Subject()).Msg("ignore a notice of a type this agent does not know")
		}
	}, bus.Consume()...)
	if err != nil {
		return nil, fmt.Errorf("follow kill notices: %w", err)
	}
	select {
	case <-caughtUp:
	case <-ctx.Done():
		cc.Stop()
		return nil, ctx.Err()
	case <-time.After(killsCatchUp):
		// Notices that expired as they were read: what is left is known.
		a.log.Warn().Dur("waited", killsCatchUp).Msg("kill notices not all read at start; serving tasks anyway")
	}
	return cc.Stop, nil
}

// liftedAt returns the stream sequence of the kill notice kept for
// execID if it is a lift, or 0. The dispatcher stores the lift of a
// resumed execution before it sends the execution's new tasks, but this
// agent follows the notices apart from its tasks: a new task can arrive
// before the lift is read, and the notice kept in the stream decides.
func (a *Agent) liftedAt(ctx context.Context, execID string) (uint64, error) {
	// From the stream's leader: a replica may not have the lift yet
	// (the stream allows direct gets, which any replica answers).
	m, err := bus.LeaderGet(ctx, a.js, bus.StreamKills, bus.MsgQuery{LastBySubject: bus.KillSubject(execID)})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, nil // none kept: the one followed expired, and stands until forgotten
	}
	if err != nil {
		return 0, fmt.Errorf("read the kill notice of %s: %w", execID, err)
	}
	if ev, err := bus.Decode(m.Header, m.Data); err == nil {
		if p, ok := ev.Data.(*events.KillOperations); ok && p.Lift {
			return m.Sequence, nil
		}
	}
	return 0, nil
}
