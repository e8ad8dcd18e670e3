package dispatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/dispatcher/dispatch"
	"jetflow.dev/services/internal/metrics/metricstest"
)

// Local steps (docs/adr/0014) run in the dispatcher: no task is stored,
// one event is appended per step, and the history still shows each
// state of the operation with its time.

// tasksStored counts the messages of the tasks stream.
func tasksStored(t *testing.T, b *testBundle) int {
	t.Helper()
	n := 0
	require.NoError(t, history.ScanReports(t.Context(), b.js, bus.StreamTasks, bus.TasksPrefix+".>", func(events.Event) error {
		n++
		return nil
	}))
	return n
}

func TestLocalStepsRunInTheDispatcher(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var got atomic.Value
	double := operation.HandlerFunc(func(_ context.Context, task operation.Task) (any, error) {
		var in struct {
			N int `json:"n"`
		}
		if err := json.Unmarshal(task.Input, &in); err != nil {
			return nil, err
		}
		got.Store(task)
		return map[string]int{"n": 2 * in.N}, nil
	})
	runDispatcher(t, b.js, dispatch.Config{Workers: 2, LocalHandlers: map[string]operation.Handler{"double": double}})
	b.applyYAML(t, `name: local
steps:
  - {id: a, kind: noop, local: true}
  - {id: b, kind: log, local: true, message: "hello ${input.who}"}
  - {id: c, kind: call, local: true, idempotent: yes, operation: double, input: {n: 21}, output: "${result.n}"}
  - {id: d, kind: noop, local: true}
`)
	b.start(t, "local", "l1")
	s, evs := waitStatus(t, b.js, "local", "l1", projections.StatusSucceeded)

	require.Zero(t, tasksStored(t, b), "a local step publishes no task")
	// execution.started (with a's dispatch), a success per step but the
	// last (each with the next dispatch), execution.succeeded (with the
	// last step's success): one event a step.
	require.Equal(t, []events.Type{events.TypeExecutionStarted, events.TypeStepSucceeded, events.TypeStepSucceeded,
		events.TypeStepSucceeded, events.TypeExecutionSucceeded}, typesOf(evs))
	require.Equal(t, 4, dispatches(evs))
	require.Len(t, s.Steps, 4)
	for _, st := range s.Steps {
		require.Equal(t, projections.OpSucceeded, st.Status, st.ID)
		require.Equal(t, workflow.LocalQueue, st.Queue, st.ID)
		for what, at := range map[string]time.Time{"scheduled": st.ScheduledAt, "sent": st.SentAt, "started": st.StartedAt, "ended": st.EndedAt} {
			require.False(t, at.IsZero(), "step %s has no %s time", st.ID, what)
		}
		require.False(t, st.StartedAt.Before(st.SentAt), st.ID)
		require.False(t, st.EndedAt.Before(st.StartedAt), st.ID)
	}
	require.JSONEq(t, `{"message":"hello test","level":"info"}`, string(stepNamed(s, "b").Output))
	require.JSONEq(t, `42`, string(stepNamed(s, "c").Output))
	task, ok := got.Load().(operation.Task)
	require.True(t, ok, "the call's handler ran")
	require.Equal(t, "l1", task.ExecutionID)
	require.Equal(t, "c", task.StepID)
	require.Equal(t, 1, task.Attempt)
}

// A local call whose handler no dispatcher registered fails at once, for
// good (retrying cannot help), saying what to do.
func TestALocalCallWithoutHandlerFails(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.applyYAML(t, `name: nohandler
steps:
  - {id: c, kind: call, local: true, idempotent: yes, operation: missing, retry: {limit: 3}}
`)
	b.start(t, "nohandler", "n1")
	s, _ := waitStatus(t, b.js, "nohandler", "n1", projections.StatusFailed)
	st := stepNamed(s, "c")
	require.Equal(t, 1, st.Attempt, "a missing handler is not retried")
	require.Contains(t, st.Error, `no local handler for operation "missing"`)
	require.Contains(t, st.Error, "LocalHandlers")
}

// slowHandlers are a dispatcher's local handlers: "slow" counts its runs
// in runs, then does what run does.
func slowHandlers(runs *atomic.Int32, run operation.HandlerFunc) map[string]operation.Handler {
	return map[string]operation.Handler{"slow": operation.HandlerFunc(func(ctx context.Context, task operation.Task) (any, error) {
		runs.Add(1)
		return run(ctx, task)
	})}
}

// runBlocked runs a dispatcher (cfg) on js whose local operation "slow"
// blocks until its context ends, starts execution id of wf, and returns
// once the operation runs; stop ends that dispatcher and returns Run's
// error.
func runBlocked(t *testing.T, b *testBundle, js jetstream.JetStream, cfg dispatch.Config, wf, id string, runs *atomic.Int32) (stop func() error) {
	t.Helper()
	return runHeld(t, b, js, cfg, wf, id, runs, func(ctx context.Context) { <-ctx.Done() })
}

// runHeld is runBlocked with an operation that returns once hold does.
func runHeld(t *testing.T, b *testBundle, js jetstream.JetStream, cfg dispatch.Config, wf, id string, runs *atomic.Int32,
	hold func(context.Context)) (stop func() error) {
	t.Helper()
	running := make(chan struct{}, 1)
	cfg.LocalHandlers = slowHandlers(runs, func(ctx context.Context, _ operation.Task) (any, error) {
		running <- struct{}{}
		hold(ctx)
		return nil, ctx.Err()
	})
	d, err := dispatch.New(t.Context(), cfg, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	stop = func() error {
		cancel()
		return <-done
	}
	b.start(t, wf, id)
	select {
	case <-running:
	case <-time.After(waitFor):
		_ = stop()
		t.Fatal("the local step did not start")
	}
	return stop
}

// quick is a local operation that succeeds with "done".
func quick(context.Context, operation.Task) (any, error) { return "done", nil }

// A dispatcher that stops while a local step runs leaves it sending in
// the history, and asks the partition's next holder to decide about the
// execution: it runs the step again (at least once) at once, not when
// the janitor finds the execution idle. So too with -split-dispatch,
// where a local step's run is never recorded sent either.
func TestALocalStepRunsAgainAfterItsDispatcherStops(t *testing.T) {
	t.Parallel()
	for _, split := range []bool{false, true} {
		t.Run(map[bool]string{false: "dispatched", true: "split-dispatch"}[split], func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.applyYAML(t, `name: again
steps:
  - {id: slow, kind: call, local: true, idempotent: yes, operation: slow}
  - {id: after, kind: noop, local: true}
`)
			var runs atomic.Int32
			stop := runBlocked(t, b, b.js, dispatch.Config{Workers: 2, SplitDispatch: split}, "again", "a1", &runs)
			require.NoError(t, stop())
			s := foldOf(t, b.js, "again", "a1")
			require.Equal(t, projections.OpSending, stepNamed(s, "slow").Status, "the history shows it sending: it may have run")

			runDispatcher(t, b.js, dispatch.Config{Workers: 2, SplitDispatch: split, LocalHandlers: slowHandlers(&runs, quick)})
			s, evs := waitStatus(t, b.js, "again", "a1", projections.StatusSucceeded) // no janitor: the stop asked
			require.Equal(t, int32(2), runs.Load(), "run once by each dispatcher")
			sendings := dispatches(evs)
			if split {
				sendings = countType(evs, events.TypeStepSending)
			}
			require.Equal(t, 2, sendings, "sent once each: the run again is not a new attempt")
			require.Zero(t, countType(evs, events.TypeStepSent), "a local step's run is never recorded sent")
			require.Equal(t, 1, stepNamed(s, "slow").Attempt)
			require.JSONEq(t, `"done"`, string(stepNamed(s, "slow").Output))
		})
	}
}

// A dispatcher that dies while it runs a local step cannot ask for it to
// run again: the dispatcher that takes its partition finds the step's
// dispatch in the tail of the events stream, and runs it again, without
// the janitor.
func TestALocalStepRunsAgainAfterItsDispatcherDies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.applyYAML(t, `name: again
steps:
  - {id: slow, kind: call, local: true, idempotent: yes, operation: slow}
  - {id: after, kind: noop, local: true}
`)
	var runs atomic.Int32
	js := b.connect() // its own connection, closed under it: it dies
	stop := runBlocked(t, b, js, dispatch.Config{Workers: 2}, "again", "a1", &runs)
	js.Conn().Close() // no nudge, no release: its leases expire
	_ = stop()

	reg := b.measured(t, dispatch.Config{Workers: 2, LocalHandlers: slowHandlers(&runs, quick)})
	s, _ := waitStatus(t, b.js, "again", "a1", projections.StatusSucceeded) // no janitor runs
	require.Equal(t, int32(2), runs.Load())
	require.JSONEq(t, `"done"`, string(stepNamed(s, "slow").Output))
	requireTaken(t, reg, "expired") // every lease the dead dispatcher held
	// The read of the stream's tail was made on a connection of its own
	// (bus.Beside), closed once read: the nudge came after it.
	require.Eventually(t, func() bool {
		cz, err := b.srv.Connz(&server.ConnzOptions{State: server.ConnClosed})
		if err != nil {
			return false
		}
		for _, c := range cz.Conns {
			if strings.HasSuffix(c.Name, "-rescue") {
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond, "a closed connection named for the rescue")
}

// A dispatcher that stops while a local step's handler ignores the stop
// asks for the step to run again before it gives the partition back, not
// once the handler returns: the next holder, finding the lease given
// back, does not look for local steps left running (and no janitor runs
// here), and runs it at once.
func TestALocalStepWhoseHandlerIgnoresTheStopRunsAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.applyYAML(t, `name: deaf
steps:
  - {id: slow, kind: call, local: true, idempotent: yes, operation: slow}
`)
	var runs atomic.Int32
	deaf := make(chan struct{})
	defer close(deaf)
	stop := runHeld(t, b, b.js, dispatch.Config{Workers: 2}, "deaf", "d1", &runs, func(context.Context) { <-deaf })
	require.NoError(t, stop()) // after waiting 5 s for the handler

	next := b.measured(t, dispatch.Config{Workers: 2, LocalHandlers: slowHandlers(&runs, quick)})
	s, _ := waitStatus(t, b.js, "deaf", "d1", projections.StatusSucceeded)
	require.Equal(t, int32(2), runs.Load())
	require.JSONEq(t, `"done"`, string(stepNamed(s, "slow").Output))
	requireTaken(t, next, "released")
}

// jetflow_dispatcher_local_runs_again_total counts the runs whose step
// runs again, not the steps: a dispatcher that stops with one local step
// in its handler and another waiting for a slot (LocalConcurrency 1)
// counts one. The waiting step never ran; both run at the next holder.
func TestLocalRunsAgainCountsRunsOnly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.applyYAML(t, `name: again
steps:
  - {id: slow, kind: call, local: true, idempotent: yes, operation: slow}
`)
	var runs atomic.Int32
	reg, m := newMetrics(t)
	stop := runBlocked(t, b, b.js, dispatch.Config{Workers: 2, LocalConcurrency: 1, Metrics: m}, "again", "r1", &runs)
	b.start(t, "again", "r2")
	// r2's step is dispatched too, and waits for the one slot.
	natstest.Eventually(t, waitFor, func() bool {
		return stepNamed(foldOf(t, b.js, "again", "r2"), "slow").Status == projections.OpSending
	}, "r2's step dispatched")
	require.NoError(t, stop())
	require.Equal(t, int32(1), runs.Load(), "one handler ran, the other step waited for the slot")
	require.Equal(t, 1.0, metricstest.Value(t, reg, "jetflow_dispatcher_local_runs_again_total"),
		"the run cut short counts; the step that never reached its handler does not")

	// The next dispatcher finds the leases given back and does not look
	// for local steps left running: the one that stopped asked for its
	// steps to run again.
	next := b.measured(t, dispatch.Config{Workers: 2, LocalHandlers: slowHandlers(&runs, quick)})
	waitStatus(t, b.js, "again", "r1", projections.StatusSucceeded)
	waitStatus(t, b.js, "again", "r2", projections.StatusSucceeded)
	require.Equal(t, int32(3), runs.Load(), "a run more than the steps, as counted")
	requireTaken(t, next, "released")
}

// requireTaken waits for the dispatcher measured in reg to have taken
// every partition, and checks that it found every lease as lease says
// (jetflow_dispatcher_partitions_taken_total). A take told after the
// holding was taken back (a loaded machine let its lease lapse) counts
// as expired, whatever the take found (partition.Table.Vacancy): as
// many takes as retakes may count so.
func requireTaken(t *testing.T, reg prometheus.Gatherer, lease string) {
	t.Helper()
	n := metricstest.Value(t, reg, "jetflow_dispatcher_partitions")
	require.Positive(t, n)
	natstest.Eventually(t, waitFor, func() bool {
		return metricstest.Value(t, reg, "jetflow_dispatcher_partitions_taken_total") >= n
	}, "every partition taken")
	found := metricstest.Value(t, reg, "jetflow_dispatcher_partitions_taken_total", "lease", lease)
	retaken := metricstest.Value(t, reg, "jetflow_dispatcher_partition_retakes_total")
	if retaken > 0 {
		t.Logf("%v of %v leases found %s, %v retakes", found, n, lease, retaken)
	}
	require.GreaterOrEqual(t, found, n-retaken, "every lease found %s, but for takes told after a retake", lease)
}

// Local steps in a foreach and in parallel branches each run once, and
// at most LocalConcurrency registered handlers run at once.
func TestLocalStepsInAFanOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var runs, now, most atomic.Int32
	h := operation.HandlerFunc(func(_ context.Context, task operation.Task) (any, error) {
		runs.Add(1)
		n := now.Add(1)
		defer now.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(time.Millisecond)
		return map[string]any{"id": task.StepID}, nil
	})
	reg := b.measured(t, dispatch.Config{Workers: 3, LocalConcurrency: 4, LocalHandlers: map[string]operation.Handler{"h": h}})
	b.applyYAML(t, `name: fan
steps:
  - id: each
    kind: foreach
    items: "${[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30]}"
    concurrency: 10
    steps:
      - {id: c, kind: call, local: true, idempotent: yes, operation: h, input: {n: "${item}"}}
      - {id: n, kind: noop, local: true}
  - id: par
    kind: parallel
    branches:
      - {id: b1, steps: [{id: p1, kind: call, local: true, idempotent: yes, operation: h}]}
      - {id: b2, steps: [{id: p2, kind: log, local: true, message: hi}]}
      - {id: b3, steps: [{id: p3, kind: call, local: true, idempotent: yes, operation: h}]}
`)
	ids := []string{"f1", "f2", "f3"}
	for _, id := range ids {
		b.start(t, "fan", id)
	}
	for i, id := range ids {
		wait := waitFor
		if i == 0 {
			wait = 4 * waitFor // a loaded machine: the others run meanwhile
		}
		waitStatusWithin(t, wait, b.js, "fan", id, projections.StatusSucceeded)
	}
	// Each call ran once, but for the runs left to run again: where a
	// partition's lease was not valid here when a run ended (a loaded
	// machine starved the dispatcher past the TTL), its result is not
	// recorded and the step runs again (at least once).
	again := int32(metricstest.Value(t, reg, "jetflow_dispatcher_local_runs_again_total"))
	require.GreaterOrEqual(t, runs.Load(), int32(3*(30+2)), "each call ran at least once")
	require.LessOrEqual(t, runs.Load(), int32(3*(30+2))+again, "each call ran once, but for the %d left to run again", again)
	if again > 0 {
		t.Logf("%d runs left to run again (leases taken back: %v): %d runs for %d calls", again,
			metricstest.Value(t, reg, "jetflow_dispatcher_partition_retakes_total"), runs.Load(), 3*(30+2))
	}
	require.LessOrEqual(t, most.Load(), int32(4), "LocalConcurrency bounds the handlers running at once")
	require.Zero(t, tasksStored(t, b))
}

// A kill terminates a local step's handler (its context is cancelled
// with the reason) and the execution ends.
func TestAKillEndsALocalRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ended := make(chan error, 1)
	running := make(chan struct{}, 1)
	h := operation.HandlerFunc(func(ctx context.Context, _ operation.Task) (any, error) {
		running <- struct{}{}
		<-ctx.Done()
		ended <- context.Cause(ctx)
		return nil, ctx.Err()
	})
	runDispatcher(t, b.js, dispatch.Config{Workers: 2, LocalHandlers: map[string]operation.Handler{"h": h}})
	b.applyYAML(t, `name: kill
steps:
  - {id: c, kind: call, local: true, idempotent: yes, operation: h}
`)
	b.start(t, "kill", "k1")
	select {
	case <-running:
	case <-time.After(waitFor):
		t.Fatal("the local step did not start")
	}
	b.act(t, "k1", "kill", "test")
	select {
	case cause := <-ended:
		require.ErrorContains(t, cause, "terminated, its execution was killed or ended")
	case <-time.After(waitFor):
		t.Fatal("the kill did not cancel the handler's context")
	}
	waitStatus(t, b.js, "kill", "k1", projections.StatusCancelled)
}

// A step's timeout ends its local run: the handler's context is
// cancelled, and the attempt fails as timed out.
func TestATimeoutEndsALocalRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.applyYAML(t, `name: timeout
steps:
  - {id: hang, kind: call, local: true, idempotent: yes, operation: hang, timeout: 300ms, retry: {limit: 1}}
`)
	ended := make(chan error, 1)
	hang := operation.HandlerFunc(func(ctx context.Context, _ operation.Task) (any, error) {
		<-ctx.Done()
		ended <- context.Cause(ctx)
		return nil, ctx.Err()
	})
	runDispatcher(t, b.js, dispatch.Config{Workers: 2, LocalHandlers: map[string]operation.Handler{"hang": hang}})
	b.start(t, "timeout", "t1")
	s, _ := waitStatus(t, b.js, "timeout", "t1", projections.StatusFailed)
	require.Contains(t, stepNamed(s, "hang").Error, "attempt 1 timed out after 300ms")
	require.NotContains(t, stepNamed(s, "hang").Error, "agent", "no agent was to start it")
	select {
	case cause := <-ended:
		require.Error(t, cause)
		require.False(t, errors.Is(cause, context.Canceled) && cause.Error() == context.Canceled.Error(), "cancelled with a reason: %v", cause)
	case <-time.After(waitFor):
		t.Fatal("the handler's context was not cancelled")
	}
}

// A local step with a timeout: the timer armed after its dispatch is the
// execution's last event when its dispatcher dies; the dispatcher taking
// the partition still finds the step and runs it again.
func TestALocalStepWithATimeoutRunsAgainAfterItsDispatcherDies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.applyYAML(t, `name: again
steps:
  - {id: slow, kind: call, local: true, idempotent: yes, operation: slow, timeout: 1h}
`)
	var runs atomic.Int32
	js := b.connect()
	stop := runBlocked(t, b, js, dispatch.Config{Workers: 2}, "again", "t1", &runs)
	waitHistory(t, b.js, "again", "t1", "the timeout armed", func(evs []events.Event) bool {
		return len(evs) > 0 && evs[len(evs)-1].Type == events.TypeTimerArmed
	})
	js.Conn().Close()
	_ = stop()

	runDispatcher(t, b.js, dispatch.Config{Workers: 2, LocalHandlers: slowHandlers(&runs, quick)})
	waitStatus(t, b.js, "again", "t1", projections.StatusSucceeded)
	require.Equal(t, int32(2), runs.Load())
}
