package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
)

// ErrKilled is the error of an operation terminated because an operator
// killed its execution.
var ErrKilled = errors.New("terminated: an operator killed the execution")

// kills tracks the running operations by execution, so that a kill notice
// terminates them (exec processes get SIGTERM, then SIGKILL after
// KillGrace; Go handlers see their context cancelled), and the executions
// killed, so that a task of one does not start.
type kills struct {
	mu      sync.Mutex
	killed  map[string]killNotice // by execution
	running map[string]map[uint64]context.CancelFunc
	next    uint64
}

// killNotice is a kill notice followed: when it came, and its sequence in
// the kill notices stream.
type killNotice struct {
	at  time.Time
	seq uint64
}

func newKills() *kills {
	return &kills{killed: map[string]killNotice{}, running: map[string]map[uint64]context.CancelFunc{}}
}

// start registers a running operation of execID. It returns the context
// to run it in and the function to call when it ends, or ok false if the
// execution was killed.
func (k *kills) start(parent context.Context, execID string) (ctx context.Context, done func(), ok bool) {
	return k.startLifted(parent, execID, 0)
}

// startLifted is start for an execution whose kill the stream shows lifted
// at sequence lifted, before this agent has followed the lift: a kill
// noticed at or before that sequence does not refuse the operation, a
// later one does.
func (k *kills) startLifted(parent context.Context, execID string, lifted uint64) (ctx context.Context, done func(), ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if n, dead := k.killed[execID]; dead && (lifted == 0 || n.seq > lifted) {
		return nil, func() {}, false
	}
	ctx, cancel := context.WithCancelCause(parent)
	k.next++
	id := k.next
	if k.running[execID] == nil {
		k.running[execID] = map[uint64]context.CancelFunc{}
	}
	k.running[execID][id] = func() { cancel(ErrKilled) }
	return ctx, func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		delete(k.running[execID], id)
		if len(k.running[execID]) == 0 {
			delete(k.running, execID)
		}
		cancel(nil)
	}, true
}

// kill terminates the running operations of execID and refuses its later
// tasks, for the notice at stream sequence seq. It returns how many were
// running. Notices older than a day are forgotten (the stream keeps them
// that long).
func (k *kills) kill(execID string, seq uint64, now time.Time) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	for id, n := range k.killed {
		if now.Sub(n.at) > 25*time.Hour {
			delete(k.killed, id)
		}
	}
	k.killed[execID] = killNotice{at: now, seq: seq}
	for _, cancel := range k.running[execID] {
		cancel()
	}
	return len(k.running[execID])
}

// killsCatchUp bounds the wait for the kill notices kept in the stream
// when an agent starts.
const killsCatchUp = 30 * time.Second

// lift forgets that execID was killed: it was resumed.
func (k *kills) lift(execID string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.killed, execID)
}

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
		p, ok := ev.Data.(*events.KillOperations)
		if err != nil || !ok {
			a.log.Warn().Err(err).Str("subject", m.Subject()).Msg("ignore malformed kill notice")
			return
		}
		if p.Lift {
			a.kills.lift(p.ExecutionID)
			return
		}
		if n := a.kills.kill(p.ExecutionID, seq, time.Now()); n > 0 {
			a.log.Info().Str("execution_id", p.ExecutionID).Int("operations", n).Dur("grace", a.cfg.KillGrace).
				Msg("terminating the operations of a killed execution")
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
