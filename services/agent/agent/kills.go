package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
	killed  map[string]time.Time // execution -> when its notice came
	running map[string]map[uint64]context.CancelFunc
	next    uint64
}

func newKills() *kills {
	return &kills{killed: map[string]time.Time{}, running: map[string]map[uint64]context.CancelFunc{}}
}

// start registers a running operation of execID. It returns the context
// to run it in and the function to call when it ends, or ok false if the
// execution was killed.
func (k *kills) start(parent context.Context, execID string) (ctx context.Context, done func(), ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, dead := k.killed[execID]; dead {
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
// tasks. It returns how many were running. Notices older than a day are
// forgotten (the stream keeps them that long).
func (k *kills) kill(execID string, now time.Time) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	for id, at := range k.killed {
		if now.Sub(at) > 25*time.Hour {
			delete(k.killed, id)
		}
	}
	k.killed[execID] = now
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
	cons, err := a.js.OrderedConsumer(ctx, events.StreamKills, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.KillsPrefix + ".>"}, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("follow kill notices: %w", err)
	}
	stream, err := a.js.Stream(ctx, events.StreamKills)
	if err != nil {
		return nil, fmt.Errorf("follow kill notices: %w", err)
	}
	caughtUp := make(chan struct{})
	var once sync.Once
	if stream.CachedInfo().State.Msgs == 0 { // nothing to read first
		once.Do(func() { close(caughtUp) })
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
			defer once.Do(func() { close(caughtUp) })
		}
		ev, err := events.Decode(m.Headers(), m.Data())
		p, ok := ev.Data.(*events.KillOperations)
		if err != nil || !ok {
			a.log.Warn().Err(err).Str("subject", m.Subject()).Msg("ignore malformed kill notice")
			return
		}
		if p.Lift {
			a.kills.lift(p.ExecutionID)
			return
		}
		if n := a.kills.kill(p.ExecutionID, time.Now()); n > 0 {
			a.log.Info().Str("execution_id", p.ExecutionID).Int("operations", n).Dur("grace", a.cfg.KillGrace).
				Msg("terminating the operations of a killed execution")
		}
	})
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
