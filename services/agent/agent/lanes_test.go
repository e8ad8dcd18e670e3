package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/agent/agent"
)

// gate is an operation that records which executions started it (and
// at which delivery) and holds each until released.
type gate struct {
	mu         sync.Mutex
	started    []string
	deliveries []int
	release    chan struct{}
}

func newGate(t *testing.T) *gate {
	g := &gate{release: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *gate) Handle(ctx context.Context, tk operation.Task) (any, error) {
	g.mu.Lock()
	g.started = append(g.started, tk.ExecutionID)
	g.deliveries = append(g.deliveries, tk.Delivery)
	g.mu.Unlock()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-g.release:
		return "done", nil
	}
}

func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.release:
	default:
		close(g.release)
	}
}

func (g *gate) starts() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.started)
}

// requireFirstDeliveries checks that every task the gate saw ran at its
// first delivery: none waited for the ack wait in a pull the agent gave
// up.
func (g *gate) requireFirstDeliveries(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, d := range g.deliveries {
		require.Equal(t, 1, d, "task of %s ran at delivery %d", g.started[i], d)
	}
}

func runLaneAgent(t *testing.T, concurrency int, handlers map[string]operation.Handler) *agentBundle {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	a, err := agent.New(agent.Config{Name: agentName, AckWait: ackWait, Concurrency: concurrency, ShutdownGrace: time.Second,
		Handlers: handlers}, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, a.Run)
	natstest.Eventually(t, waitFor, func() bool { return a.Ready() == nil }, "the agent binds its queues")
	return &agentBundle{js: js}
}

// waitPending waits until consumer c counts n messages pending. The
// server acknowledges a publish before it tells the stream's consumers
// of the message (another goroutine does that), and a pull that asks for
// no wait is answered from that count: on a busy machine a worker that
// looks at once can find a lane empty whose task was just acknowledged.
// The tests of the lanes' order look only once every task is counted.
func (b *agentBundle) waitPending(t *testing.T, c bus.Consumer, n uint64) {
	t.Helper()
	cons, err := b.js.Consumer(t.Context(), c.Stream, c.Config.Durable)
	require.NoError(t, err)
	natstest.Eventually(t, waitFor, func() bool {
		info, err := cons.Info(t.Context())
		return err == nil && info.NumPending >= n
	}, "consumer "+c.Config.Durable+" counts the tasks published")
}

// TestAFanOutLeavesWorkersForOtherExecutions: a fan-out's tasks on the
// bulk lane take at most the flex workers (three of four); the reserved
// one runs another execution's task at once, while every fan-out task
// still holds its worker. Without lanes the small task would wait for
// the fan-out's six.
func TestAFanOutLeavesWorkersForOtherExecutions(t *testing.T) {
	t.Parallel()
	held := newGate(t)
	b := runLaneAgent(t, 4, map[string]operation.Handler{"held": held})
	bulk := bus.BulkTaskSubject(workflow.DefaultQueue)
	for i := range 6 {
		b.publishTaskTo(t, bulk, fmt.Sprintf("fan-%d", i), workflow.Step{ID: "s", Kind: "held"})
	}
	natstest.Eventually(t, waitFor, func() bool { return len(held.starts()) == 3 }, "the flex workers take three fan-out tasks")
	b.publishTask(t, "small", workflow.Step{ID: "s", Kind: "noop"})
	evs := b.waitFinal(t, "small")
	require.NotEmpty(t, evs)
	require.Len(t, held.starts(), 3, "the reserved worker took no fan-out task, and no flex worker was free")
	held.open()
	for i := range 6 {
		b.waitFinal(t, fmt.Sprintf("fan-%d", i))
	}
	held.requireFirstDeliveries(t)
}

// TestTheNormalLaneGoesFirst: a worker that ends a task takes the normal
// lane's task before the bulk lane's, even those sent earlier.
func TestTheNormalLaneGoesFirst(t *testing.T) {
	t.Parallel()
	held := newGate(t)
	b := runLaneAgent(t, 1, map[string]operation.Handler{"held": held})
	bulk := bus.BulkTaskSubject(workflow.DefaultQueue)
	b.publishTaskTo(t, bulk, "fan-0", workflow.Step{ID: "s", Kind: "held"})
	natstest.Eventually(t, waitFor, func() bool { return len(held.starts()) == 1 }, "the one worker takes the first fan-out task")
	b.publishTaskTo(t, bulk, "fan-1", workflow.Step{ID: "s", Kind: "held"})
	b.publishTaskTo(t, bulk, "fan-2", workflow.Step{ID: "s", Kind: "held"})
	b.publishTask(t, "small", workflow.Step{ID: "s", Kind: "held"})
	b.waitPending(t, bus.AgentQueueConsumer(bus.Durables{}, workflow.DefaultQueue), 1)
	b.waitPending(t, bus.AgentBulkQueueConsumer(bus.Durables{}, workflow.DefaultQueue), 2)
	held.open()
	for _, id := range []string{"fan-0", "fan-1", "fan-2", "small"} {
		b.waitFinal(t, id)
	}
	require.Equal(t, []string{"fan-0", "small", "fan-1", "fan-2"}, held.starts())
	held.requireFirstDeliveries(t)
}

// TestABusyNormalLaneStillGetsEveryWorker: with no fan-out, every worker
// serves the normal lane: four tasks held at once.
func TestABusyNormalLaneStillGetsEveryWorker(t *testing.T) {
	t.Parallel()
	held := newGate(t)
	b := runLaneAgent(t, 4, map[string]operation.Handler{"held": held})
	for i := range 5 {
		b.publishTask(t, fmt.Sprintf("x-%d", i), workflow.Step{ID: "s", Kind: "held"})
	}
	natstest.Eventually(t, waitFor, func() bool { return len(held.starts()) == 4 }, "four normal tasks run at once")
	held.open()
	for i := range 5 {
		b.waitFinal(t, fmt.Sprintf("x-%d", i))
	}
}

// TestAnIdleAgentNoticesAFanOut: on an idle agent whose workers wait on
// the normal lane, a task on the bulk lane is taken by the scout within
// about a second, not when the others' long pulls end (30 s here). Not
// parallel: it sets the package's long pull.
func TestAnIdleAgentNoticesAFanOut(t *testing.T) {
	t.Cleanup(agent.SetLongPoll(30 * time.Second)) // run after the agent stops
	held := newGate(t)
	b := runLaneAgent(t, 4, map[string]operation.Handler{"held": held})
	time.Sleep(2 * time.Second) // every worker is idle, in its wait
	began := time.Now()
	b.publishTaskTo(t, bus.BulkTaskSubject(workflow.DefaultQueue), "fan", workflow.Step{ID: "s", Kind: "held"})
	natstest.Eventually(t, waitFor, func() bool { return len(held.starts()) == 1 }, "the scout takes the fan-out's task")
	require.Less(t, time.Since(began), 15*time.Second, "taken when a long pull ended, not by the scout")
	held.open()
	b.waitFinal(t, "fan")
	held.requireFirstDeliveries(t)
}

// TestTasksOneAtATimeCostARequestEach: tasks that come one at a time on
// the normal lane, the bulk lane idle, cost a pull request each: a worker
// that ended one with none behind it waits on the normal lane at once,
// without the two looks (the normal lane, then the bulk lane) that each
// found nothing. The looks at the bulk lane are then the scout's (one a
// second) and the long pulls' ends, not one a task. Not parallel: it
// sets the package's recheck to an hour, so that the test does not
// depend on the machine's pace (at the default 20 ms, only tasks that
// come less than 20 ms apart, as one execution's steps do, are spared
// the looks; the test's own waits are 10 ms each).
func TestTasksOneAtATimeCostARequestEach(t *testing.T) {
	t.Cleanup(agent.SetBulkRecheck(time.Hour)) // run after the agent stops
	s := natstest.RunJetStream(t)
	watch, _ := natstest.Connect(t, s)
	var normal, bulk atomic.Int64
	for n, consumer := range map[*atomic.Int64]string{
		&normal: bus.AgentConsumer(workflow.DefaultQueue), &bulk: bus.AgentBulkConsumer(workflow.DefaultQueue),
	} {
		_, err := watch.Subscribe("$JS.API.CONSUMER.MSG.NEXT."+bus.StreamTasks+"."+consumer, func(*nats.Msg) { n.Add(1) })
		require.NoError(t, err)
	}
	require.NoError(t, watch.Flush())
	_, js := natstest.Connect(t, s)
	a, err := agent.New(agent.Config{Name: agentName, AckWait: ackWait, Concurrency: 4, ShutdownGrace: time.Second},
		js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, a.Run)
	natstest.Eventually(t, waitFor, func() bool { return a.Ready() == nil }, "the agent binds its queues")
	b := &agentBundle{js: js}
	b.publishTask(t, "first", workflow.Step{ID: "s", Kind: "noop"})
	b.waitFinal(t, "first") // every worker has looked at both lanes

	const tasks = 60
	normalBefore, bulkBefore, began := normal.Load(), bulk.Load(), time.Now()
	for i := range tasks {
		id := fmt.Sprintf("one-%d", i)
		b.publishTask(t, id, workflow.Step{ID: "s", Kind: "noop"})
		b.waitFinal(t, id)
	}
	took := time.Since(began)
	// Besides a request a task: the scout's two looks a second, a long
	// pull's end now and then, and the workers' pulls when counting began.
	others := int64(8 + 3*int(took.Seconds()))
	normalAsked, bulkAsked := normal.Load()-normalBefore, bulk.Load()-bulkBefore
	t.Logf("%d tasks in %s: %d requests to the normal lane, %d to the bulk lane (others allowed: %d)",
		tasks, took.Round(time.Millisecond), normalAsked, bulkAsked, others)
	require.LessOrEqual(t, bulkAsked, others, "the bulk lane looked at for tasks that came one at a time")
	require.LessOrEqual(t, normalAsked, tasks+others, "more than a request a task to the normal lane")
}

// TestTheBulkLaneIsBoundOnceMade: an agent that may not make consumers,
// beside a bootstrap that made only the normal lane (an older release),
// serves the normal lane, and takes the bulk lane's tasks once the
// bootstrap has made it.
func TestTheBulkLaneIsBoundOnceMade(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	d := bus.Durables{TaskAckWait: ackWait}
	_, err := bus.Bind(t.Context(), js, true, bus.AgentQueueConsumer(d, workflow.DefaultQueue), nil)
	require.NoError(t, err)
	held := newGate(t)
	held.open()
	a, err := agent.New(agent.Config{Name: agentName, AckWait: ackWait, Concurrency: 2, BindOnly: true,
		Handlers: map[string]operation.Handler{"held": held}}, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, a.Run)
	natstest.Eventually(t, waitFor, func() bool { return a.Ready() == nil }, "the agent serves without the bulk lane")
	b := &agentBundle{js: js}
	b.publishTaskTo(t, bus.BulkTaskSubject(workflow.DefaultQueue), "fan", workflow.Step{ID: "s", Kind: "held"})
	b.publishTask(t, "small", workflow.Step{ID: "s", Kind: "held"})
	b.waitFinal(t, "small")
	require.Equal(t, []string{"small"}, held.starts(), "no one serves the bulk lane yet")
	_, err = bus.Bind(t.Context(), js, true, bus.AgentBulkQueueConsumer(d, workflow.DefaultQueue), nil)
	require.NoError(t, err)
	b.waitFinal(t, "fan")
	held.requireFirstDeliveries(t)
}

// TestABusyNormalLaneDoesNotStarveTheBulkLane: a worker takes the bulk
// lane first for every fourth task, so a fan-out moves on while the
// normal lane is never empty.
func TestABusyNormalLaneDoesNotStarveTheBulkLane(t *testing.T) {
	t.Parallel()
	held := newGate(t)
	b := runLaneAgent(t, 1, map[string]operation.Handler{"held": held})
	b.publishTask(t, "n0", workflow.Step{ID: "s", Kind: "held"})
	natstest.Eventually(t, waitFor, func() bool { return len(held.starts()) == 1 }, "the one worker takes the first task")
	b.publishTaskTo(t, bus.BulkTaskSubject(workflow.DefaultQueue), "fan", workflow.Step{ID: "s", Kind: "held"})
	for i := 1; i <= 5; i++ {
		b.publishTask(t, fmt.Sprintf("n%d", i), workflow.Step{ID: "s", Kind: "held"})
	}
	b.waitPending(t, bus.AgentQueueConsumer(bus.Durables{}, workflow.DefaultQueue), 5)
	b.waitPending(t, bus.AgentBulkQueueConsumer(bus.Durables{}, workflow.DefaultQueue), 1)
	held.open()
	b.waitFinal(t, "fan")
	for i := 1; i <= 5; i++ {
		b.waitFinal(t, fmt.Sprintf("n%d", i))
	}
	require.Equal(t, []string{"n0", "n1", "n2", "fan", "n3", "n4", "n5"}, held.starts())
}

// TestAQueueConsumerDeletedUnderTheAgentIsMadeAgain: both lanes'
// consumers are deleted under a running agent (by hand, or by a tool);
// the agent makes them again (as at start, having the right to) and runs
// the next tasks sent to either lane.
func TestAQueueConsumerDeletedUnderTheAgentIsMadeAgain(t *testing.T) {
	t.Parallel()
	held := newGate(t)
	held.open()
	b := runLaneAgent(t, 2, map[string]operation.Handler{"held": held})
	b.publishTask(t, "before", workflow.Step{ID: "s", Kind: "held"})
	b.waitFinal(t, "before")
	for _, spec := range []bus.Consumer{
		bus.AgentQueueConsumer(bus.Durables{}, workflow.DefaultQueue),
		bus.AgentBulkQueueConsumer(bus.Durables{}, workflow.DefaultQueue),
	} {
		require.NoError(t, b.js.DeleteConsumer(t.Context(), spec.Stream, spec.Config.Durable))
		natstest.Eventually(t, waitFor, func() bool {
			_, err := b.js.Consumer(t.Context(), spec.Stream, spec.Config.Durable)
			return err == nil
		}, "consumer "+spec.Config.Durable+" made again")
	}
	b.publishTask(t, "after", workflow.Step{ID: "s", Kind: "held"})
	b.publishTaskTo(t, bus.BulkTaskSubject(workflow.DefaultQueue), "bulk-after", workflow.Step{ID: "s", Kind: "held"})
	b.waitFinal(t, "after")
	b.waitFinal(t, "bulk-after")
}

// TestAFailedFetchIsTriedAgainSoon: a worker whose fetch fails (here the
// queue's consumer refuses any pull that would wait) tries again 50 ms
// later, then after pauses that double up to a second, each failure a
// warning (it is no leader's move); five failures come well within the
// four seconds a fixed pause of a second took. Once a fetch succeeds
// again, the worker says so, and takes the next task.
func TestAFailedFetchIsTriedAgainSoon(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	spec := bus.AgentQueueConsumer(bus.Durables{TaskAckWait: ackWait}, workflow.DefaultQueue)
	refusing := spec
	refusing.Config.MaxRequestExpires = 100 * time.Millisecond // an agent's pulls wait 1 s or more
	_, err := bus.Bind(t.Context(), js, true, refusing, nil)
	require.NoError(t, err)

	logs := &fetchLog{}
	gate := newGate(t)
	gate.open()
	a, err := agent.New(agent.Config{Name: agentName, AckWait: ackWait, Concurrency: 1, BindOnly: true,
		Handlers: map[string]operation.Handler{"held": gate}}, js, zerolog.New(logs).Level(zerolog.DebugLevel))
	require.NoError(t, err)
	natstest.Serve(t, a.Run)
	natstest.Eventually(t, waitFor, func() bool { return len(logs.failures()) >= 5 }, "five failed fetches")
	f := logs.failures()[:5]
	t.Logf("five failed fetches within %s", f[4].at.Sub(f[0].at))
	for i, want := range []float64{50, 100, 200, 400, 800} {
		require.Equal(t, "warn", f[i].Level, "failure %d (%s): not a leader move", i+1, f[i].Err)
		require.Equal(t, want, f[i].RetryIn, "failure %d's pause (ms)", i+1)
	}
	require.Less(t, f[4].at.Sub(f[0].at), 4*time.Second, "four pauses of 50 to 400 ms, not of a second")

	_, err = bus.Bind(t.Context(), js, true, spec, nil) // pulls that wait are taken again
	require.NoError(t, err)
	natstest.Eventually(t, waitFor, func() bool { return logs.has("fetching tasks again") }, "the end of the failures said")
	b := &agentBundle{js: js}
	b.publishTask(t, "after", workflow.Step{ID: "s", Kind: "held"})
	b.waitFinal(t, "after")
}

// fetchLog keeps an agent's log lines, each with when it was written.
type fetchLog struct {
	mu    sync.Mutex
	lines []fetchLine
}

type fetchLine struct {
	Level   string  `json:"level"`
	Message string  `json:"message"`
	RetryIn float64 `json:"retry_in"`
	Err     string  `json:"error"`
	at      time.Time
}

func (l *fetchLog) Write(p []byte) (int, error) {
	var line fetchLine
	if err := json.Unmarshal(p, &line); err != nil {
		return 0, err
	}
	line.at = time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
	return len(p), nil
}

// failures returns the lines of failed fetches.
func (l *fetchLog) failures() []fetchLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []fetchLine
	for _, line := range l.lines {
		if line.Message == "fetch task" {
			out = append(out, line)
		}
	}
	return out
}

func (l *fetchLog) has(msg string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.ContainsFunc(l.lines, func(line fetchLine) bool { return line.Message == msg })
}
