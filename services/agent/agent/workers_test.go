package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/agent/agent"
)

// TestQueuedTasksAreNotRedelivered: with one slot and a task lasting
// several AckWaits, tasks waiting for the slot must not sit in the agent
// without a heartbeat (JetStream would redeliver them and they would run
// twice): the agent takes a task only when a slot is free, so they wait
// in the stream. The first task is held while the test watches two
// AckWaits and a half go by: one task with the agent, two in the stream,
// nothing redelivered; then each task runs once.
func TestQueuedTasksAreNotRedelivered(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	var mu sync.Mutex
	runs := map[string][]int{}
	release := make(chan struct{})
	held := operation.HandlerFunc(func(ctx context.Context, tk operation.Task) (any, error) {
		mu.Lock()
		runs[tk.ExecutionID] = append(runs[tk.ExecutionID], tk.Delivery)
		mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-release:
			return "done", nil
		}
	})
	const ackWait = 2 * time.Second // heartbeats every 667 ms: room for a loaded machine
	a, err := agent.New(agent.Config{Name: "one-slot", AckWait: ackWait, Concurrency: 1,
		Handlers: map[string]operation.Handler{"held": held}}, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	b := &agentBundle{js: js}
	for i := range 3 {
		b.publishTask(t, fmt.Sprintf("q%d", i), workflow.Step{ID: "s", Kind: "held"})
	}
	natstest.Serve(t, a.Run)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	ran := func() map[string][]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[string][]int{}
		for k, v := range runs {
			out[k] = append([]int(nil), v...)
		}
		return out
	}
	natstest.Eventually(t, waitFor, func() bool { return len(ran()) == 1 }, "a first task runs")
	cons, err := js.Consumer(t.Context(), bus.StreamTasks, agent.ConsumerName(workflow.DefaultQueue))
	require.NoError(t, err)
	for until := time.Now().Add(ackWait * 5 / 2); time.Now().Before(until); time.Sleep(100 * time.Millisecond) {
		require.Len(t, ran(), 1, "one slot: one task runs at a time, none runs again")
		ci, err := cons.Info(t.Context())
		require.NoError(t, err)
		require.Equal(t, 1, ci.NumAckPending, "only the running task is with the agent")
		require.EqualValues(t, 2, ci.NumPending, "the tasks waiting for the slot wait in the stream")
		require.Zero(t, ci.NumRedelivered, "a task was redelivered while the first one ran")
	}
	close(release)
	for i := range 3 {
		b.waitFinal(t, fmt.Sprintf("q%d", i))
	}
	got := ran()
	for i := range 3 {
		require.Equal(t, []int{1}, got[fmt.Sprintf("q%d", i)], "task q%d ran once, at its first delivery", i)
	}
}

// TestShutdownHonoursGrace: a stop request cancels running tasks after
// ShutdownGrace and starts no new task.
func TestShutdownHonoursGrace(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	started := make(chan string, 10)
	block := operation.HandlerFunc(func(ctx context.Context, tk operation.Task) (any, error) {
		started <- tk.ExecutionID
		<-ctx.Done()
		return nil, ctx.Err()
	})
	a, err := agent.New(agent.Config{Name: "stopper", AckWait: time.Second, Concurrency: 1, ShutdownGrace: 300 * time.Millisecond,
		Handlers: map[string]operation.Handler{"block": block}}, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	b := &agentBundle{js: js}
	b.publishTask(t, "first", workflow.Step{ID: "s", Kind: "block"})
	b.publishTask(t, "second", workflow.Step{ID: "s", Kind: "block"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	require.Equal(t, "first", <-started)
	began := time.Now()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("agent did not stop")
	}
	require.Less(t, time.Since(began), 2*time.Second, "stopped within about the grace")
	select {
	case id := <-started:
		t.Fatalf("task %s started after the stop request", id)
	default:
	}
}

// TestOutputTooLargeForAMessage: the operation's status is still recorded,
// with a note instead of the output, and it is not run again.
func TestOutputTooLargeForAMessage(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	calls := 0
	big := operation.HandlerFunc(func(context.Context, operation.Task) (any, error) {
		mu.Lock()
		calls++
		mu.Unlock()
		return map[string]string{"blob": strings.Repeat("x", 2<<20)}, nil
	})
	b := setupAgent(t, map[string]operation.Handler{"big": big})
	b.publishTask(t, "huge", workflow.Step{ID: "s", Kind: "big"})
	evs := b.waitFinal(t, "huge")
	final := evs[len(evs)-1]
	require.Equal(t, events.TypeOperationSucceeded, final.Type)
	var note map[string]any
	require.NoError(t, json.Unmarshal(final.Data.(*events.OperationSucceeded).Output, &note))
	require.Equal(t, true, note["output_dropped"])
	time.Sleep(2 * ackWait)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, calls)
}
