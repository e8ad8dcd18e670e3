package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/history/historytest"
	"jetflow.dev/pkg/lock"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/agent/agent"
	"jetflow.dev/services/dispatcher/dispatch"
)

// critical records the agent-side enter and exit of lock holders, in the
// order the handlers ran, and keeps the counter of the atomic-increment
// workflow. A holder of the semaphore (workflow sema) stays in its enter
// until two executions entered (itself and another, which is then inside
// with it), or until overlapBy: a semaphore that lets in only one holder
// at a time fails the test instead of passing for a mutex.
type critical struct {
	mu        sync.Mutex
	log       []mark
	counter   int
	overlapBy time.Time
}

type mark struct {
	workflow, execution string
	enter               bool
}

func (c *critical) handlers() map[string]operation.Handler {
	note := func(enter bool) operation.HandlerFunc {
		return func(ctx context.Context, t operation.Task) (any, error) {
			c.mu.Lock()
			c.log = append(c.log, mark{workflow: t.Workflow, execution: t.ExecutionID, enter: enter})
			c.mu.Unlock()
			for enter && t.Workflow == "sema" && c.entered("sema") < 2 && time.Now().Before(c.overlapBy) {
				select {
				case <-ctx.Done():
					return nil, ctx.Err()
				case <-time.After(5 * time.Millisecond):
				}
			}
			return map[string]bool{"ok": true}, nil
		}
	}
	return map[string]operation.Handler{
		"enter": note(true),
		"exit":  note(false),
		// read and write are two steps: without the lock, two executions
		// read the same value and one increment is lost.
		"read": operation.HandlerFunc(func(context.Context, operation.Task) (any, error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			return map[string]int{"value": c.counter}, nil
		}),
		"write": operation.HandlerFunc(func(_ context.Context, t operation.Task) (any, error) {
			var in struct {
				Value int `json:"value"`
			}
			if err := json.Unmarshal(t.Input, &in); err != nil {
				return nil, err
			}
			time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
			c.mu.Lock()
			defer c.mu.Unlock()
			c.counter = in.Value
			return in, nil
		}),
	}
}

// entered returns how many executions of workflow wf have entered.
func (c *critical) entered(wf string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	seen := map[string]bool{}
	for _, m := range c.log {
		if m.workflow == wf && m.enter {
			seen[m.execution] = true
		}
	}
	return len(seen)
}

// maxInside returns, per workflow, the most holders that were between
// their enter and their exit at once.
func (c *critical) maxInside() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maxInside(c.log)
}

// maxInside returns, per workflow, the most executions of log that were
// inside their critical section at once. An execution is inside from its
// first mark to its last: an enter or exit run again (its task delivered
// again after its agent died) while another execution holds the lock
// overlaps with that holder.
func maxInside(log []mark) map[string]int {
	type holder struct{ workflow, execution string }
	last := map[holder]int{}
	for i, m := range log {
		last[holder{m.workflow, m.execution}] = i
	}
	inside := map[string]map[string]bool{}
	most := map[string]int{}
	for i, m := range log {
		if inside[m.workflow] == nil {
			inside[m.workflow] = map[string]bool{}
		}
		inside[m.workflow][m.execution] = true
		most[m.workflow] = max(most[m.workflow], len(inside[m.workflow]))
		if last[holder{m.workflow, m.execution}] == i {
			delete(inside[m.workflow], m.execution)
		}
	}
	return most
}

// crashableDispatcher is a dispatcher on its own connection that the test
// can take down abruptly (its connection closed under it) and start again.
type crashableDispatcher struct {
	t      *testing.T
	srv    interface{ ClientURL() string }
	name   string
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan error
}

func (c *crashableDispatcher) start() {
	c.t.Helper()
	nc, err := nats.Connect(c.srv.ClientURL())
	require.NoError(c.t, err)
	js, err := jetstream.New(nc)
	require.NoError(c.t, err)
	log := zerolog.New(zerolog.NewTestWriter(c.t)).Level(zerolog.WarnLevel).With().Str("dispatcher", c.name).Logger()
	d, err := dispatch.New(context.Background(), dispatch.Config{Workers: 8, Source: "jetflow/" + c.name, AckWait: 2 * time.Second}, js, log)
	require.NoError(c.t, err)
	ctx, cancel := context.WithCancel(context.Background())
	c.nc, c.cancel, c.done = nc, cancel, make(chan error, 1)
	go func() { c.done <- d.Run(ctx) }()
}

// crash stops the dispatcher abruptly: its context ends under whatever it
// is doing, so a handling fails half-way at its next JetStream call (after
// a lock write and before the history append, say) and the message goes to
// the other dispatcher; then its connection is closed.
func (c *crashableDispatcher) crash() {
	c.t.Helper()
	c.cancel()
	select {
	case err := <-c.done:
		// Cut off mid-handling, Run may say so: the crash is the point.
		c.t.Logf("crashed dispatcher stopped: %v", err)
	case <-time.After(30 * time.Second):
		c.t.Fatal("dispatcher did not stop")
	}
	c.nc.Close()
}

// TestLocksUnderDispatcherCrashes runs many executions contending for a
// mutex, a semaphore of 3 and a lock around a read-then-write counter,
// with two dispatchers, one of which is crashed and restarted again and
// again. The agent records when each holder enters and leaves its
// critical section: no two holders of the mutex (no four of the
// semaphore) are ever inside at once, every execution finishes (nobody
// waits forever), and the counter counts every increment.
func TestLocksUnderDispatcherCrashes(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test")
	}
	t.Parallel()
	srv := natstest.RunJetStream(t)
	_, js := natstest.Connect(t, srv)
	applyWorkflows(t, js, `
name: mutex
lock: crit
steps:
  - {id: enter, kind: call, operation: enter}
  - {id: hold, kind: sleep, duration: 15ms}
  - {id: exit, kind: call, operation: exit}
`, `
name: sema
lock: pool
semaphore: 3
steps:
  - {id: enter, kind: call, operation: enter}
  - {id: hold, kind: sleep, duration: 30ms}
  - {id: exit, kind: call, operation: exit}
`, `
name: counter
steps:
  - id: increment
    kind: workflow
    lock: counter-${input.name}
    steps:
      - {id: read, kind: call, operation: read}
      - {id: write, kind: call, operation: write, input: {value: "${steps.read.output.value + 1}"}}
`)

	crit := &critical{overlapBy: time.Now().Add(20 * time.Second)}
	ag, err := agent.New(agent.Config{Name: "lock-agent", AckWait: 2 * time.Second, Concurrency: 16, Handlers: crit.handlers()},
		js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	natstest.Serve(t, ag.Run)
	steady := &crashableDispatcher{t: t, srv: srv, name: "steady"}
	steady.start()
	flaky := &crashableDispatcher{t: t, srv: srv, name: "flaky"}
	flaky.start()
	t.Cleanup(func() { steady.crash(); flaky.crash() })

	const perWorkflow = 12
	ids := startLockExecutions(t, js, perWorkflow)

	// Crash the flaky dispatcher again and again (and once the steady one)
	// while the executions contend.
	for round := range 8 {
		time.Sleep(time.Duration(150+rand.IntN(300)) * time.Millisecond)
		victim := flaky
		if round == 4 {
			victim = steady
		}
		victim.crash()
		time.Sleep(time.Duration(50+rand.IntN(200)) * time.Millisecond)
		victim.start()
	}

	requireLockExecutionsSucceeded(t, js, ids, 60*time.Second)
	most := crit.maxInside()
	require.Equal(t, 1, most["mutex"], "holders of the mutex overlapped")
	require.LessOrEqual(t, most["sema"], 3, "more than 3 holders of the semaphore at once")
	require.GreaterOrEqual(t, most["sema"], 2, "never two holders of the semaphore of 3 at once")
	require.Equal(t, perWorkflow, crit.counter, "an increment was lost: two read-then-write sections overlapped")
}

// applyWorkflows parses and applies workflow definitions.
func applyWorkflows(t *testing.T, js jetstream.JetStream, yamls ...string) {
	t.Helper()
	defs, err := catalog.Open(t.Context(), js)
	require.NoError(t, err)
	for _, y := range yamls {
		d, err := workflow.Parse([]byte(y))
		require.NoError(t, err)
		_, _, err = defs.Apply(t.Context(), d)
		require.NoError(t, err)
	}
}

// lockExecution is one execution of the lock tests' workload.
type lockExecution struct{ wf, id string }

// startLockExecutions publishes the start commands of perWorkflow
// executions of each of the workflows mutex, sema and counter, interleaved,
// all with the input {"name": "shared"}.
func startLockExecutions(t *testing.T, js jetstream.JetStream, perWorkflow int) []lockExecution {
	t.Helper()
	var ids []lockExecution
	for i := range perWorkflow {
		for _, wf := range []string{"mutex", "sema", "counter"} {
			id := fmt.Sprintf("%s-%d", wf, i)
			ids = append(ids, lockExecution{wf, id})
			ev := events.New("lock-test", "", "", time.Now(), &events.StartExecution{Workflow: wf, ExecutionID: id,
				Input: json.RawMessage(`{"name":"shared"}`)})
			msg, err := bus.Encode(bus.SubjectStart, ev)
			require.NoError(t, err)
			_, err = js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(ev.ID))
			require.NoError(t, err)
		}
	}
	return ids
}

// requireLockExecutionsSucceeded waits until every execution of ids has
// ended, failing with the lock table and its holders' histories if one has
// not within timeout (it waits forever). Then each must have succeeded
// with a linear history, having acquired its locks and released each one it
// requested, and the lock bucket must be empty.
func requireLockExecutionsSucceeded(t *testing.T, js jetstream.JetStream, ids []lockExecution, timeout time.Duration) {
	t.Helper()
	folded := func(wf, id string) (projections.Execution, []events.Event) {
		evs, err := history.Read(t.Context(), js, bus.ExecutionSubject(wf, id), 0)
		if timedOut(err) { // a starved machine: read again in the next round
			return projections.Execution{}, nil
		}
		require.NoError(t, err)
		x, err := projections.Fold(evs)
		require.NoError(t, err)
		return x, evs
	}
	deadline := time.Now().Add(timeout)
	for _, e := range ids {
		for {
			x, evs := folded(e.wf, e.id)
			if x.Status.Terminal() {
				break
			}
			if time.Now().After(deadline) {
				tb, err := lockTable(t, js)
				require.NoError(t, err)
				all, err := tb.List(t.Context())
				require.NoError(t, err)
				b, _ := json.Marshal(all)
				for _, r := range all {
					for _, h := range r.Holders {
						hx, hevs := folded(h.Workflow, h.ExecutionID)
						t.Logf("holder %s: %s %+v %v", h.ExecutionID, hx.Status, hx.Locks, typesOfEvents(hevs))
					}
				}
				t.Fatalf("%s never finished (it waits forever): %s %+v\nevents %v\nlocks %s", e.id, x.Status, x.Locks, countTypes(evs), b)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, e := range ids {
		x, evs := folded(e.wf, e.id)
		require.Equal(t, projections.StatusSucceeded, x.Status, "%s: %s", e.id, x.Error)
		require.NoError(t, historytest.Linear(evs), e.id)
		require.NotEmpty(t, x.Locks, e.id)
		for _, l := range x.Locks {
			require.Equal(t, projections.LockReleased, l.Status, "%s scope %q", e.id, l.Path)
		}
		counts := countTypes(evs)
		require.GreaterOrEqual(t, counts[string(events.TypeLockAcquired)], 1, e.id)
		require.Equal(t, counts[string(events.TypeLockRequested)], counts[string(events.TypeLockReleased)], e.id)
	}
	tb, err := lockTable(t, js)
	require.NoError(t, err)
	all, err := tb.List(t.Context())
	require.NoError(t, err)
	require.Empty(t, all, "every lock is free once its holders ended")
}

func lockTable(t *testing.T, js jetstream.JetStream) (*lock.Table, error) {
	t.Helper()
	return lock.Open(t.Context(), js, nil)
}

func typesOfEvents(evs []events.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = strings.TrimPrefix(string(ev.Type), "io.jetflow.")
	}
	return out
}
