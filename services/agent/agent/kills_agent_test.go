package agent_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/agent/agent"
)

func publishKill(t *testing.T, js jetstream.JetStream, execID string) {
	t.Helper()
	ev := events.New("test-dispatcher", execID, "wf", time.Now(), &events.KillOperations{ExecutionID: execID, Workflow: "wf"})
	msg, err := bus.Encode(bus.KillSubject(execID), ev)
	require.NoError(t, err)
	_, err = js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
}

// TestAgentRefusesTaskOfExecutionKilledBeforeItStarted: an agent that
// starts (after a crash, say) reads every kill notice kept before it takes
// a task, so a redelivered task of a killed execution does not run.
func TestAgentRefusesTaskOfExecutionKilledBeforeItStarted(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	for i := range 2000 {
		publishKill(t, js, fmt.Sprintf("k%d", i))
	}
	b := &agentBundle{js: js}
	ran := make(chan struct{}, 1)
	task := b.publishTask(t, "k1999", workflow.Step{ID: "s", Kind: "probe"})
	a, err := agent.New(agent.Config{Name: agentName, AckWait: ackWait, Concurrency: 4, ShutdownGrace: time.Second,
		Handlers: map[string]operation.Handler{"probe": operation.HandlerFunc(func(context.Context, operation.Task) (any, error) {
			ran <- struct{}{}
			return nil, nil
		})}}, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, a.Run)

	evs := b.waitFinal(t, "k1999")
	final := evs[len(evs)-1]
	require.Equal(t, events.TypeOperationFailed, final.Type)
	require.Equal(t, task.TaskID, final.Data.(*events.OperationFailed).TaskID)
	require.Contains(t, final.Data.(*events.OperationFailed).Error, agent.ErrKilled.Error())
	require.Empty(t, ran, "the operation did not run")
}

// TestAgentKillCancelsGoHandler: a kill notice cancels a running Go
// handler's context, with ErrKilled as the cause; other executions' go on.
func TestAgentKillCancelsGoHandler(t *testing.T) {
	t.Parallel()
	causes := make(chan error, 2)
	started := make(chan string, 2)
	release := make(chan struct{})
	b := setupAgent(t, map[string]operation.Handler{"block": operation.HandlerFunc(func(ctx context.Context, task operation.Task) (any, error) {
		started <- task.ExecutionID
		select {
		case <-ctx.Done():
			causes <- context.Cause(ctx)
			return nil, ctx.Err()
		case <-release: // held until the victim's end is seen
			return "finished", nil
		}
	})})
	b.publishTask(t, "victim", workflow.Step{ID: "s", Kind: "block"})
	b.publishTask(t, "bystander", workflow.Step{ID: "s", Kind: "block"})
	<-started
	<-started
	publishKill(t, b.js, "victim")
	select {
	case cause := <-causes:
		require.ErrorIs(t, cause, agent.ErrKilled)
	case <-time.After(waitFor):
		t.Fatal("the killed handler's context was not cancelled")
	}
	evs := b.waitFinal(t, "victim")
	require.Equal(t, events.TypeOperationFailed, evs[len(evs)-1].Type)
	require.Contains(t, evs[len(evs)-1].Data.(*events.OperationFailed).Error, "killed")
	close(release)
	evs = b.waitFinal(t, "bystander")
	require.Equal(t, events.TypeOperationSucceeded, evs[len(evs)-1].Type, "another execution's operation went on")
}

func publishNotice(t *testing.T, js jetstream.JetStream, execID string, lift bool) uint64 {
	t.Helper()
	ev := events.New("test-dispatcher", execID, "wf", time.Now(), &events.KillOperations{ExecutionID: execID, Workflow: "wf", Lift: lift})
	msg, err := bus.Encode(bus.KillSubject(execID), ev)
	require.NoError(t, err)
	ack, err := js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
	return ack.Sequence
}

// TestAgentRunsTaskOfResumedExecutionBeforeReadingTheLift: the dispatcher
// stores the lift of a resumed execution's kill before it sends the
// execution's new tasks, but an agent follows the kill notices apart from
// its tasks, so a task can come before the agent has read the lift. The
// notice kept in the stream decides: the task runs. (Such a task used to
// be refused, failing the resumed execution as killed.)
func TestAgentRunsTaskOfResumedExecutionBeforeReadingTheLift(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	killedAt := publishNotice(t, js, "resumed", false)
	publishNotice(t, js, "resumed", true)
	publishNotice(t, js, "killed", false)
	ran := make(chan string, 2)
	a, err := agent.New(agent.Config{Name: agentName, AckWait: ackWait, Concurrency: 4, ShutdownGrace: time.Second,
		Handlers: map[string]operation.Handler{"probe": operation.HandlerFunc(func(_ context.Context, task operation.Task) (any, error) {
			ran <- task.ExecutionID
			return nil, nil
		})}}, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, a.Run)
	// The agent takes tasks (its consumer exists) once it has read the
	// kept notices: then hold its view at the kill, before the lift.
	natstest.Eventually(t, waitFor, func() bool {
		_, err := js.Consumer(t.Context(), bus.StreamTasks, agent.ConsumerName("default"))
		return err == nil
	}, "the agent's consumer")
	a.FollowKillNotice("resumed", killedAt)

	b := &agentBundle{js: js}
	b.publishTask(t, "resumed", workflow.Step{ID: "s", Kind: "probe"})
	b.publishTask(t, "killed", workflow.Step{ID: "s", Kind: "probe"})
	evs := b.waitFinal(t, "resumed")
	require.Equal(t, events.TypeOperationSucceeded, evs[len(evs)-1].Type, "the task of the resumed execution ran")
	evs = b.waitFinal(t, "killed")
	require.Equal(t, events.TypeOperationFailed, evs[len(evs)-1].Type)
	require.Contains(t, evs[len(evs)-1].Data.(*events.OperationFailed).Error, agent.ErrKilled.Error(), "a kill not lifted still refuses")
	require.Equal(t, "resumed", <-ran)
	require.Empty(t, ran)
}

// publishTaskKill publishes the notice terminating one attempt, as the
// dispatcher does when its step's timeout fires.
func publishTaskKill(t *testing.T, js jetstream.JetStream, task *events.Task, reason string) {
	t.Helper()
	ev := events.New("test-dispatcher", task.ExecutionID, "wf", time.Now(), &events.TerminateTask{ExecutionID: task.ExecutionID, Workflow: "wf",
		TaskID: task.TaskID, Reason: reason})
	msg, err := bus.Encode(bus.TaskKillSubject(task.ExecutionID, task.TaskID), ev)
	require.NoError(t, err)
	_, err = js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
}

// waitTaskFinal waits for the final report of one task and returns it.
func (b *agentBundle) waitTaskFinal(t *testing.T, task *events.Task) events.Event {
	t.Helper()
	var final events.Event
	natstest.Eventually(t, waitFor, func() bool {
		for _, ev := range readResults(t, b.js, task.ExecutionID) {
			if ref, ok := events.ResultRef(ev.Data); ok && ref.TaskID == task.TaskID && isFinal(ev) {
				final = ev
				return true
			}
		}
		return false
	}, "final result of %s", task.TaskID)
	return final
}

// TestAgentTaskNoticeTerminatesOneAttempt: the notice naming one attempt
// (its step timed out) terminates that operation, the exec process with
// SIGTERM, and says so and how in its failure; the execution's other
// operation goes on; a task named before it arrives is refused.
func TestAgentTaskNoticeTerminatesOneAttempt(t *testing.T) {
	t.Parallel()
	started := make(chan string, 2)
	release := make(chan struct{})
	b := setupAgent(t, map[string]operation.Handler{"block": operation.HandlerFunc(func(ctx context.Context, task operation.Task) (any, error) {
		started <- task.StepID
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-release: // held until the other attempt was terminated
			return "finished", nil
		}
	})})
	mark := filepath.Join(t.TempDir(), "running")
	slow := b.publishTask(t, "x1", workflow.Step{ID: "slow", Kind: workflow.KindExec, Command: "sh", Args: []string{"-c", "touch " + mark + "; exec sleep 30"}})
	other := b.publishTask(t, "x1", workflow.Step{ID: "other", Kind: "block"})
	require.Equal(t, "other", <-started)
	natstest.Eventually(t, waitFor, func() bool {
		_, err := os.Stat(mark)
		return err == nil
	}, "the exec step's process started")

	publishTaskKill(t, b.js, slow, "attempt 1 timed out after 1s")
	final := b.waitTaskFinal(t, slow)
	require.Equal(t, events.TypeOperationFailed, final.Type)
	msg := final.Data.(*events.OperationFailed).Error
	require.Contains(t, msg, agent.ErrTerminated.Error())
	require.Contains(t, msg, "attempt 1 timed out after 1s")
	require.Contains(t, msg, "SIGTERM sent; ended by SIGTERM")
	t.Logf("the failure: %s", msg)
	close(release)
	require.Equal(t, events.TypeOperationSucceeded, b.waitTaskFinal(t, other).Type, "the execution's other operation went on")
}

// TestAgentRefusesTasksNamedBeforeTheyCome: a task of an execution that
// ended (a force-cancel, a failure while it waited in its queue), or of
// an attempt its step gave up on, is refused without running; a notice
// read when the agent starts counts like one followed since.
func TestAgentRefusesTasksNamedBeforeTheyCome(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	gaveUp := &events.Task{TaskID: events.TaskID("x1", "s", 1), ExecutionID: "x1"}
	publishTaskKill(t, js, gaveUp, "attempt 1 timed out after 1s before an agent of queue default started it")
	ev := events.New("test-dispatcher", "x2", "wf", time.Now(), &events.RefuseTasks{ExecutionID: "x2", Workflow: "wf", Tokens: []string{"tok-x2"}})
	msg, err := bus.Encode(bus.KillSubject("x2"), ev)
	require.NoError(t, err)
	_, err = js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)

	ran := make(chan string, 3)
	a, err := agent.New(agent.Config{Name: agentName, AckWait: ackWait, Concurrency: 4, ShutdownGrace: time.Second,
		Handlers: map[string]operation.Handler{"probe": operation.HandlerFunc(func(_ context.Context, task operation.Task) (any, error) {
			ran <- task.TaskID
			return nil, nil
		})}}, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, a.Run)
	b := &agentBundle{js: js}
	refused := b.publishTask(t, "x1", workflow.Step{ID: "s", Kind: "probe"})
	next := b.publishWith(t, bus.TaskSubject(workflow.DefaultQueue), "x1", workflow.Step{ID: "s", Kind: "probe"}, func(task *events.Task) {
		task.Attempt, task.TaskID = 2, events.TaskID("x1", "s", 2)
	})
	ended := b.publishTask(t, "x2", workflow.Step{ID: "s", Kind: "probe"})

	final := b.waitTaskFinal(t, refused)
	require.Equal(t, events.TypeOperationFailed, final.Type)
	require.Contains(t, final.Data.(*events.OperationFailed).Error, agent.ErrTerminated.Error())
	require.Contains(t, final.Data.(*events.OperationFailed).Error, "timed out after 1s")
	require.Equal(t, events.TypeOperationSucceeded, b.waitTaskFinal(t, next).Type, "the step's next attempt runs")
	final = b.waitTaskFinal(t, ended)
	require.Equal(t, events.TypeOperationFailed, final.Type)
	require.Contains(t, final.Data.(*events.OperationFailed).Error, agent.ErrEnded.Error())
	require.Equal(t, next.TaskID, <-ran)
	require.Empty(t, ran, "only the next attempt ran")
}

// TestAnAgentWaitsForTheKillNoticesAtStart: an agent that cannot follow
// the kill notices when it starts (here their stream is not made yet; a
// busy cluster's request timing out is the same to it) waits and tries
// again, not ready meanwhile, instead of stopping with an error; once
// the stream is there it serves.
func TestAnAgentWaitsForTheKillNoticesAtStart(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	require.NoError(t, js.DeleteStream(t.Context(), bus.StreamKills))
	a, err := agent.New(agent.Config{Name: agentName, AckWait: ackWait, Concurrency: 1}, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	natstest.Serve(t, a.Run) // fails the test if Run ends with an error
	time.Sleep(500 * time.Millisecond)
	require.Error(t, a.Ready(), "ready without the kill notices")
	require.NoError(t, bus.Ensure(t.Context(), js, bus.Config{}))
	natstest.Eventually(t, waitFor, func() bool { return a.Ready() == nil }, "the agent serves once the notices can be followed")
	b := &agentBundle{js: js}
	b.publishTask(t, "after", workflow.Step{ID: "s", Kind: workflow.KindNoop})
	b.waitFinal(t, "after")
}
