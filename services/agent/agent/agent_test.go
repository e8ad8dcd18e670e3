package agent_test

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/agent/agent"
)

const (
	agentName = "test-agent"
	ackWait   = time.Second
	waitFor   = 15 * time.Second
)

type agentBundle struct {
	js jetstream.JetStream
}

// setupAgent runs an agent with a short AckWait on a fresh server until
// the test ends.
func setupAgent(t *testing.T, handlers map[string]operation.Handler) *agentBundle {
	t.Helper()
	return setupAgentWith(t, agent.Config{Handlers: handlers, Policy: agent.Policy{AllowExec: true}})
}

// setupAgentWith is setupAgent with cfg's policy, secrets, handlers and
// output limit.
func setupAgentWith(t *testing.T, cfg agent.Config) *agentBundle {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	cfg.Name, cfg.AckWait, cfg.Concurrency, cfg.ShutdownGrace, cfg.KillGrace = agentName, ackWait, 4, time.Second, time.Second
	if cfg.StartedAfter == 0 {
		// Every start reported at once, so that the reports a test reads
		// do not depend on how long an operation took on a loaded
		// machine; started_test.go checks the grace.
		cfg.StartedAfter = agent.StartedAtOnce
	}
	a, err := agent.New(cfg, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, a.Run)
	return &agentBundle{js: js}
}

// publishTask puts a task for step on the default queue, as the dispatcher does.
func (b *agentBundle) publishTask(t *testing.T, execID string, step workflow.Step) *events.Task {
	t.Helper()
	return b.publishTaskTo(t, bus.TaskSubject(step.QueueName()), execID, step)
}

// publishTaskTo is publishTask on subject (a lane of the step's queue).
func (b *agentBundle) publishTaskTo(t *testing.T, subject, execID string, step workflow.Step) *events.Task {
	t.Helper()
	return b.publishWith(t, subject, execID, step, nil)
}

// publishWith is publishTaskTo with the task changed by mod (nil: none)
// before it is published.
func (b *agentBundle) publishWith(t *testing.T, subject, execID string, step workflow.Step, mod func(*events.Task)) *events.Task {
	t.Helper()
	spec, err := json.Marshal(step)
	require.NoError(t, err)
	task := &events.Task{TaskID: events.TaskID(execID, step.ID, 1), ExecutionID: execID, Workflow: "wf",
		StepID: step.ID, Attempt: 1, Token: "tok-" + execID, Kind: step.Kind, Queue: step.QueueName(), Spec: spec}
	if mod != nil {
		mod(task)
	}
	ev := events.New("test-dispatcher", execID, "wf", time.Now(), task)
	ev.ID = task.TaskID
	msg, err := bus.Encode(subject, ev)
	require.NoError(t, err)
	ack, err := b.js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(task.TaskID))
	require.NoError(t, err)
	storedAt.Store(task.TaskID, ack.Sequence)
	return task
}

// storedAt holds the stream sequence of each task the tests published.
var storedAt sync.Map

func readResults(t *testing.T, js jetstream.JetStream, execID string) []events.Event {
	t.Helper()
	evs, err := history.ReadStream(t.Context(), js, bus.StreamResults, bus.ExecutionResults(execID), 0, 0)
	require.NoError(t, err)
	return evs
}

func isFinal(ev events.Event) bool {
	return ev.Type == events.TypeOperationSucceeded || ev.Type == events.TypeOperationFailed
}

// waitFinal waits for a final result of the execution's task and returns
// every result reported so far.
func (b *agentBundle) waitFinal(t *testing.T, execID string) []events.Event {
	t.Helper()
	var evs []events.Event
	natstest.Eventually(t, waitFor, func() bool {
		evs = readResults(t, b.js, execID)
		for _, ev := range evs {
			if isFinal(ev) {
				return true
			}
		}
		return false
	}, "final result of %s", execID)
	return evs
}

// requireRef checks that a result names the task, this agent and delivery 1.
func requireRef(t *testing.T, task *events.Task, ref events.TaskRef) {
	t.Helper()
	t.Log("a report says where and when its task was stored")
	seq, _ := storedAt.Load(task.TaskID)
	require.Equal(t, seq, ref.TaskSeq)
	require.WithinDuration(t, time.Now(), ref.StoredAt, time.Minute)
	ref.TaskSeq, ref.StoredAt = 0, time.Time{}
	require.Equal(t, task.Ref(agentName, 1), ref)
}

// requireStartedThen checks the results are a started report followed by
// one final report of type final, and returns the final one.
func requireStartedThen(t *testing.T, task *events.Task, evs []events.Event, final events.Type) events.Event {
	t.Helper()
	types := make([]events.Type, len(evs))
	for i, ev := range evs {
		types[i] = ev.Type
	}
	require.Len(t, evs, 2, "results: %v", types)
	st, ok := evs[0].Data.(*events.OperationStarted)
	require.True(t, ok, "first result is %s", evs[0].Type)
	requireRef(t, task, st.TaskRef)
	require.Equal(t, final, evs[1].Type)
	began := startedAt(evs[1])
	require.False(t, began.IsZero(), "the final report says when the operation started")
	require.False(t, began.After(evs[1].Time), "started %s, reported %s", began, evs[1].Time)
	// The started report says when it began too, not when it was sent
	// (after the agent's -report-started-after): the same instant.
	require.True(t, st.StartedAt.Equal(began), "started report: %s, final report: %s", st.StartedAt, began)
	require.False(t, st.StartedAt.After(evs[0].Time), "started %s, reported %s", st.StartedAt, evs[0].Time)
	for _, ev := range evs {
		require.Equal(t, task.ExecutionID, ev.Subject)
		require.Equal(t, task.Workflow, ev.Workflow)
		require.Equal(t, "jetflow/agent/"+agentName, ev.Source)
	}
	return evs[1]
}

// startedAt returns when a final report says its operation started.
func startedAt(ev events.Event) time.Time {
	switch p := ev.Data.(type) {
	case *events.OperationSucceeded:
		return p.StartedAt
	case *events.OperationFailed:
		return p.StartedAt
	}
	return time.Time{}
}

// waitQueueEmpty waits until the default queue holds no task: every task
// was acknowledged.
func (b *agentBundle) waitQueueEmpty(t *testing.T) {
	t.Helper()
	natstest.Eventually(t, waitFor, func() bool {
		stream, err := b.js.Stream(t.Context(), bus.StreamTasks)
		require.NoError(t, err)
		info, err := stream.Info(t.Context())
		require.NoError(t, err)
		return info.State.Msgs == 0
	}, "tasks acknowledged")
}

func TestAgentRunsTask(t *testing.T) {
	t.Parallel()

	b := setupAgent(t, nil)

	t.Run("Noop", func(t *testing.T) {
		task := b.publishTask(t, "x-noop", workflow.Step{ID: "nothing", Kind: workflow.KindNoop})
		final := requireStartedThen(t, task, b.waitFinal(t, "x-noop"), events.TypeOperationSucceeded)
		ok := final.Data.(*events.OperationSucceeded)
		requireRef(t, task, ok.TaskRef)
		require.Empty(t, ok.Output)
		require.Equal(t, task.TaskID+".done.1", final.ID)
	})

	t.Run("Exec", func(t *testing.T) {
		task := b.publishTask(t, "x-exec", workflow.Step{ID: "greet", Kind: workflow.KindExec, Command: "sh",
			Args: []string{"-c", `echo "hello $JETFLOW_STEP_ID"`}})
		final := requireStartedThen(t, task, b.waitFinal(t, "x-exec"), events.TypeOperationSucceeded)
		require.JSONEq(t, `{"stdout":"hello greet\n","stderr":"","exit_code":0}`,
			string(final.Data.(*events.OperationSucceeded).Output))
	})

	t.Run("ExecFails", func(t *testing.T) {
		task := b.publishTask(t, "x-exit", workflow.Step{ID: "check", Kind: workflow.KindExec, Command: "sh",
			Args: []string{"-c", `echo disk is full >&2; exit 3`}})
		final := requireStartedThen(t, task, b.waitFinal(t, "x-exit"), events.TypeOperationFailed)
		failed := final.Data.(*events.OperationFailed)
		requireRef(t, task, failed.TaskRef)
		require.Contains(t, failed.Error, "exit status 3")
		require.JSONEq(t, `{"stdout":"","stderr":"disk is full\n","exit_code":3}`, string(failed.Output))
	})

	b.waitQueueEmpty(t)
}

func TestAgentCustomHandler(t *testing.T) {
	t.Parallel()

	got := make(chan operation.Task, 1)
	b := setupAgent(t, map[string]operation.Handler{
		"greet": operation.HandlerFunc(func(_ context.Context, tk operation.Task) (any, error) {
			got <- tk
			return map[string]string{"hello": tk.StepID}, nil
		}),
	})
	step := workflow.Step{ID: "wave", Kind: "greet"}
	task := b.publishTask(t, "x-custom", step)
	final := requireStartedThen(t, task, b.waitFinal(t, "x-custom"), events.TypeOperationSucceeded)
	require.JSONEq(t, `{"hello":"wave"}`, string(final.Data.(*events.OperationSucceeded).Output))

	tk := <-got
	require.Equal(t, operation.Task{TaskID: task.TaskID, ExecutionID: "x-custom", Workflow: "wf", StepID: "wave",
		Attempt: 1, Delivery: 1, Kind: "greet", Spec: task.Spec}, tk)
	b.waitQueueEmpty(t)
}

func TestAgentReplacesBuiltin(t *testing.T) {
	t.Parallel()

	b := setupAgent(t, map[string]operation.Handler{
		workflow.KindNoop: operation.HandlerFunc(func(context.Context, operation.Task) (any, error) {
			return "replaced", nil
		}),
	})
	task := b.publishTask(t, "x-replaced", workflow.Step{ID: "nothing", Kind: workflow.KindNoop})
	final := requireStartedThen(t, task, b.waitFinal(t, "x-replaced"), events.TypeOperationSucceeded)
	require.JSONEq(t, `"replaced"`, string(final.Data.(*events.OperationSucceeded).Output))
}

func TestAgentUnknownKind(t *testing.T) {
	t.Parallel()

	b := setupAgent(t, nil)
	task := b.publishTask(t, "x-unknown", workflow.Step{ID: "beam", Kind: "teleport"})
	// Nothing ran: the failure is the only report, and says no start.
	evs := b.waitFinal(t, "x-unknown")
	require.Len(t, evs, 1, "no started report for an operation with no handler")
	failed, ok := evs[0].Data.(*events.OperationFailed)
	require.True(t, ok, "result is %s", evs[0].Type)
	require.Zero(t, failed.StartedAt)
	requireRef(t, task, failed.TaskRef)
	require.Contains(t, failed.Error, `"teleport"`)
	require.Contains(t, failed.Error, agentName)
	b.waitQueueEmpty(t)
}

func TestAgentSurvivesPanic(t *testing.T) {
	t.Parallel()

	b := setupAgent(t, map[string]operation.Handler{
		"explode": operation.HandlerFunc(func(context.Context, operation.Task) (any, error) {
			panic("kaboom")
		}),
	})
	task := b.publishTask(t, "x-panic", workflow.Step{ID: "bang", Kind: "explode"})
	final := requireStartedThen(t, task, b.waitFinal(t, "x-panic"), events.TypeOperationFailed)
	failed := final.Data.(*events.OperationFailed)
	requireRef(t, task, failed.TaskRef)
	require.Contains(t, failed.Error, "panicked")
	require.Contains(t, failed.Error, "kaboom")

	t.Log("the agent still runs tasks")
	next := b.publishTask(t, "x-after-panic", workflow.Step{ID: "nothing", Kind: workflow.KindNoop})
	requireStartedThen(t, next, b.waitFinal(t, "x-after-panic"), events.TypeOperationSucceeded)
	b.waitQueueEmpty(t)
}

func TestAgentUnencodableOutput(t *testing.T) {
	t.Parallel()

	b := setupAgent(t, map[string]operation.Handler{
		"chan": operation.HandlerFunc(func(context.Context, operation.Task) (any, error) {
			return make(chan int), nil
		}),
	})
	task := b.publishTask(t, "x-chan", workflow.Step{ID: "c", Kind: "chan"})
	final := requireStartedThen(t, task, b.waitFinal(t, "x-chan"), events.TypeOperationFailed)
	require.Contains(t, final.Data.(*events.OperationFailed).Error, "encode operation output")
}

// TestAgentHeartbeats runs an operation for longer than 3×AckWait: the
// agent's heartbeats keep JetStream from giving the task to anyone else.
func TestAgentHeartbeats(t *testing.T) {
	t.Parallel()

	const runFor = 3*ackWait + 500*time.Millisecond
	var (
		calls      atomic.Int32
		mu         sync.Mutex
		deliveries []int
	)
	b := setupAgent(t, map[string]operation.Handler{
		"slow": operation.HandlerFunc(func(ctx context.Context, tk operation.Task) (any, error) {
			calls.Add(1)
			mu.Lock()
			deliveries = append(deliveries, tk.Delivery)
			mu.Unlock()
			select {
			case <-time.After(runFor):
				return "done", nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}),
	})
	task := b.publishTask(t, "x-slow", workflow.Step{ID: "wait", Kind: "slow"})
	began := time.Now()
	evs := b.waitFinal(t, "x-slow")
	require.GreaterOrEqual(t, time.Since(began), runFor)
	b.waitQueueEmpty(t)

	// Without heartbeats JetStream would have redelivered the task every
	// AckWait, and the agent would have run it again.
	require.Equal(t, int32(1), calls.Load(), "the handler ran once")
	mu.Lock()
	require.Equal(t, []int{1}, deliveries)
	mu.Unlock()
	final := requireStartedThen(t, task, evs, events.TypeOperationSucceeded)
	requireRef(t, task, final.Data.(*events.OperationSucceeded).TaskRef)
	require.Len(t, readResults(t, b.js, "x-slow"), 2)
}

func TestNewRejectsShortAckWait(t *testing.T) {
	t.Parallel()

	_, err := agent.New(agent.Config{AckWait: 100 * time.Millisecond}, nil, zerolog.New(zerolog.NewTestWriter(t)))
	require.ErrorContains(t, err, "AckWait")
}

// TestAgentHeartbeatsWhenTheQueueAckWaitIsLowered: an agent that bound
// its queue when the ack wait was 30 s (the earlier default) keeps the
// task it runs when a bootstrap lowers the queue's ack wait to the
// default: it heartbeats at least every third of bus.DefaultTaskAckWait,
// so the task is neither delivered again nor run twice.
func TestAgentHeartbeatsWhenTheQueueAckWaitIsLowered(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	const runFor = bus.DefaultTaskAckWait + 2*time.Second
	var calls atomic.Int32
	var deliveries sync.Map
	cfg := agent.Config{Name: agentName, AckWait: 30 * time.Second, Concurrency: 2, ShutdownGrace: time.Second, KillGrace: time.Second,
		Handlers: map[string]operation.Handler{"slow": operation.HandlerFunc(func(ctx context.Context, tk operation.Task) (any, error) {
			calls.Add(1)
			deliveries.Store(tk.Delivery, true)
			select {
			case <-time.After(runFor):
				return "done", nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})}}
	a, err := agent.New(cfg, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, a.Run)
	c := bus.AgentQueueConsumer(bus.Durables{}, "default")
	natstest.Eventually(t, waitFor, func() bool { // the agent bound its queue with 30 s
		info, err := js.Consumer(t.Context(), c.Stream, c.Config.Durable)
		return err == nil && info.CachedInfo().Config.AckWait == 30*time.Second
	}, "the agent binds its queue")
	// The bootstrap of this release lowers it to the default.
	_, err = js.CreateOrUpdateConsumer(t.Context(), c.Stream, c.Config)
	require.NoError(t, err)

	b := &agentBundle{js: js}
	b.publishTask(t, "x-lowered", workflow.Step{ID: "s", Kind: "slow"})
	b.waitFinal(t, "x-lowered")
	require.EqualValues(t, 1, calls.Load(), "the handler ran once")
	_, again := deliveries.Load(2)
	require.False(t, again, "the task was not delivered again")
}
