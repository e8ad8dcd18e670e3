package dispatch_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/history/historytest"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/dispatcher/dispatch"
)

const waitFor = 15 * time.Second

type testBundle struct {
	js jetstream.JetStream
	// connect opens another connection to the same server.
	connect func() jetstream.JetStream
	defs    *catalog.Store
	// tasks is the test's own consumer of the default queue: the test
	// plays the agent.
	tasks jetstream.Consumer
	// srv is the server, for what only it tells (its connections).
	srv *server.Server
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	srv := natstest.RunJetStream(t)
	_, js := natstest.Connect(t, srv)
	defs, err := catalog.Open(t.Context(), js)
	require.NoError(t, err)
	tasks, err := js.CreateOrUpdateConsumer(t.Context(), bus.StreamTasks, jetstream.ConsumerConfig{
		// Both lanes: a fan-out's tasks past its second are on the bulk lane.
		Durable: "test-agent", FilterSubjects: []string{bus.TaskSubject(workflow.DefaultQueue), bus.BulkTaskSubject(workflow.DefaultQueue)},
		// A short ack wait: a task the server hands to a fetch that has
		// just given up (nextTask fetches for 1 s at a time; on a loaded
		// machine the two can cross) is lost to the test until the ack
		// wait ends, and with 30 s nextTask would give up first. nextTask
		// acks each task as it takes it.
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 3 * time.Second,
	})
	require.NoError(t, err)
	connect := func() jetstream.JetStream {
		_, js := natstest.Connect(t, srv)
		return js
	}
	return &testBundle{js: js, connect: connect, defs: defs, tasks: tasks, srv: srv}
}

// runDispatcher runs a dispatcher on js until the test ends.
func runDispatcher(t *testing.T, js jetstream.JetStream, cfg dispatch.Config) {
	t.Helper()
	log := zerolog.New(zerolog.NewTestWriter(t)).With().Str("dispatcher", cfg.Source).Logger()
	d, err := dispatch.New(t.Context(), cfg, js, log)
	require.NoError(t, err)
	natstest.Serve(t, d.Run)
}

// register stores a workflow of noop steps with the given ids.
func (b *testBundle) register(t *testing.T, name string, stepIDs ...string) workflow.Definition {
	t.Helper()
	d := workflow.Definition{Name: name}
	for _, id := range stepIDs {
		d.Steps = append(d.Steps, workflow.Step{ID: id, Kind: workflow.KindNoop})
	}
	_, _, err := b.defs.Apply(t.Context(), d)
	require.NoError(t, err)
	return d
}

// start publishes a start command and returns its command key.
func (b *testBundle) start(t *testing.T, wf, execID string) string {
	t.Helper()
	ev := events.New("test-client", "", "", time.Now(), &events.StartExecution{
		Workflow: wf, ExecutionID: execID, Input: json.RawMessage(`{"who":"test"}`)})
	msg, err := bus.Encode(bus.SubjectStart, ev)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(ev.ID))
	require.NoError(t, err)
	return events.CommandKey(ev.Source, ev.ID)
}

// report publishes an agent's result about a task.
func (b *testBundle) report(t *testing.T, p events.Payload) {
	t.Helper()
	ref, _ := events.ResultRef(p)
	msg, err := bus.Encode(bus.ResultSubject(ref.Queue, ref.ExecutionID), events.New("test-agent", ref.ExecutionID, ref.Workflow, time.Now(), p))
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
}

type fetchedTask struct {
	task  *events.Task
	ev    events.Event
	msgID string
	// seq and stored: where and when the task was stored.
	seq    uint64
	stored time.Time
	header nats.Header
}

// ref is the reference an agent's report about the task carries.
func (f fetchedTask) ref(agent string, delivery int) events.TaskRef {
	r := f.task.Ref(agent, delivery)
	r.TaskSeq, r.StoredAt = f.seq, f.stored
	return r
}

// nextTask fetches, decodes and acknowledges the next task of the default queue.
func (b *testBundle) nextTask(t *testing.T) fetchedTask {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for time.Now().Before(deadline) {
		batch, err := b.tasks.Fetch(1, jetstream.FetchMaxWait(time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			ev, err := bus.Decode(m.Headers(), m.Data())
			require.NoError(t, err)
			task, ok := ev.Data.(*events.Task)
			require.True(t, ok, "task stream holds %s", ev.Type)
			md, err := m.Metadata()
			require.NoError(t, err)
			require.NoError(t, m.Ack())
			return fetchedTask{task: task, ev: ev, msgID: m.Headers().Get(jetstream.MsgIDHeader), seq: md.Sequence.Stream, stored: md.Timestamp.UTC(), header: m.Headers()}
		}
		require.NoError(t, batch.Error())
	}
	t.Fatal("no task arrived")
	return fetchedTask{}
}

// taskStored reports whether the task taskID is stored in its queue.
func taskStored(t *testing.T, js jetstream.JetStream, taskID string) bool {
	t.Helper()
	found := false
	err := history.ScanReports(t.Context(), js, bus.StreamTasks, bus.TasksPrefix+".>", func(ev events.Event) error {
		found = found || ev.ID == taskID
		return nil
	})
	require.NoError(t, err)
	return found
}

func readHistory(t *testing.T, js jetstream.JetStream, wf, id string) []events.Event {
	t.Helper()
	evs, err := history.Read(t.Context(), js, bus.ExecutionSubject(wf, id), 0)
	require.NoError(t, err)
	return evs
}

// waitHistory polls the history of an execution until cond holds.
func waitHistory(t *testing.T, js jetstream.JetStream, wf, id string, what string, cond func([]events.Event) bool) []events.Event {
	t.Helper()
	return waitHistoryWithin(t, waitFor, js, wf, id, what, cond)
}

// waitHistoryWithin is waitHistory, waiting up to d.
func waitHistoryWithin(t *testing.T, d time.Duration, js jetstream.JetStream, wf, id string, what string, cond func([]events.Event) bool) []events.Event {
	t.Helper()
	var evs []events.Event
	natstest.Eventually(t, d, func() bool {
		evs = readHistory(t, js, wf, id)
		return cond(evs)
	}, "history of %s: %s; have %v", id, what, natstest.Later(func() any { return typesOf(evs) }))
	return evs
}

func waitStatus(t *testing.T, js jetstream.JetStream, wf, id string, want projections.Status) (projections.Execution, []events.Event) {
	t.Helper()
	return waitStatusWithin(t, waitFor, js, wf, id, want)
}

// waitStatusWithin is waitStatus, waiting up to d.
func waitStatusWithin(t *testing.T, d time.Duration, js jetstream.JetStream, wf, id string, want projections.Status) (projections.Execution, []events.Event) {
	t.Helper()
	var s projections.Execution
	evs := waitHistoryWithin(t, d, js, wf, id, "status "+string(want), func(evs []events.Event) bool {
		var err error
		s, err = projections.Fold(evs)
		require.NoError(t, err)
		return s.Status == want
	})
	return s, evs
}

// dispatches counts the operations dispatched in evs: by a
// step.dispatched, or with the event before them (the then of a
// step.succeeded or of execution.started).
func dispatches(evs []events.Event) int {
	n := countType(evs, events.TypeStepDispatched)
	for _, ev := range evs {
		if thenOf(ev) != nil {
			n++
		}
	}
	return n
}

// thenOf is the dispatch ev records after what it says, if any.
func thenOf(ev events.Event) *events.StepDispatched {
	switch e := ev.Data.(type) {
	case *events.StepSucceeded:
		return e.Then
	case *events.ExecutionStarted:
		return e.Then
	}
	return nil
}

func typesOf(evs []events.Event) []events.Type {
	out := make([]events.Type, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type
	}
	return out
}

// countType counts the events of type typ in evs; for step.succeeded,
// the last step's success an execution's end carries too (docs/adr/0015);
// for timer.fired, every event recording a firing (events.FiringOf: 0017).
func countType(evs []events.Event, typ events.Type) int {
	n := 0
	for _, ev := range evs {
		switch {
		case typ == events.TypeTimerFired:
			if events.FiringOf(ev.Data) != "" { // a sleep's firing is carried by its success (docs/adr/0017)
				n++
			}
		case typ == events.TypeTimerArmed:
			if events.ArmingOf(ev.Data) != nil { // a wait's arming is carried by the wait (docs/adr/0018)
				n++
			}
		case ev.Type == typ || (typ == events.TypeStepSucceeded && ev.Type == events.TypeExecutionSucceeded && succeededOf(ev) != nil):
			n++
		}
	}
	return n
}

// succeededOf is the step's success ev records: its own, or the one an
// execution's end carries (docs/adr/0015); nil for any other event.
func succeededOf(ev events.Event) *events.StepSucceeded {
	switch e := ev.Data.(type) {
	case *events.StepSucceeded:
		return e
	case *events.ExecutionSucceeded:
		return e.Step
	}
	return nil
}

// watchLeaseMoves watches the partitions' leases from now on and returns
// whether a partition's lease has left its owner in owners since.
func watchLeaseMoves(t *testing.T, js jetstream.JetStream, owners []string) func(p int) bool {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), bus.BucketDispatchers)
	require.NoError(t, err)
	w, err := kv.Watch(t.Context(), "lease.*", jetstream.UpdatesOnly())
	require.NoError(t, err)
	var mu sync.Mutex
	movedSet := map[int]bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range w.Updates() {
			if e == nil {
				continue
			}
			p, err := strconv.Atoi(strings.TrimPrefix(e.Key(), "lease."))
			if err != nil || p >= len(owners) {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut || string(e.Value()) != owners[p] {
				mu.Lock()
				movedSet[p] = true
				mu.Unlock()
				t.Logf("partition %d left %s during the test", p, owners[p])
			}
		}
	}()
	t.Cleanup(func() { _ = w.Stop(); <-done })
	return func(p int) bool {
		mu.Lock()
		defer mu.Unlock()
		return movedSet[p]
	}
}

// waitLeases waits until the dispatchers bucket shows each partition's
// lease held by owners[partition].
func waitLeases(t *testing.T, js jetstream.JetStream, owners []string) {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), bus.BucketDispatchers)
	require.NoError(t, err)
	var wrong []string
	natstest.Eventually(t, waitFor, func() bool {
		wrong = wrong[:0]
		for p, o := range owners {
			e, err := kv.Get(t.Context(), partition.LeaseKey(p))
			if err != nil || string(e.Value()) != o {
				wrong = append(wrong, fmt.Sprintf("%d (%v)", p, err))
			}
		}
		return len(wrong) == 0
	}, "the partitions' leases held as rendezvous hashing says (not yet: %v)", &wrong)
}

// waitResultsHandled waits until the dispatcher acknowledged every result
// published so far.
func waitResultsHandled(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	waitConsumerCaughtUp(t, js, bus.StreamResults)
}

// waitConsumerCaughtUp waits until the dispatchers' consumers of a stream
// (the shared one and the partitions') handled every message it holds;
// for the commands stream, the partitions' inboxes too.
func waitConsumerCaughtUp(t *testing.T, js jetstream.JetStream, streamName string) {
	t.Helper()
	streams := []string{streamName}
	if streamName == bus.StreamCommands {
		streams = append(streams, bus.StreamInbox)
	}
	natstest.Eventually(t, waitFor, func() bool {
		for _, s := range streams {
			if !consumersIdle(t, js, s) {
				return false
			}
		}
		return true
	}, "%s consumers caught up", streamName)
}

// consumersIdle reports whether every dispatcher consumer of a stream has
// nothing pending or unacknowledged, and every partition has its
// consumer there (one not made yet, before its partition was first taken,
// would be idle for want of existing).
func consumersIdle(t *testing.T, js jetstream.JetStream, streamName string) bool {
	t.Helper()
	stream, err := js.Stream(t.Context(), streamName)
	require.NoError(t, err)
	list := stream.ListConsumers(t.Context())
	var mine []*jetstream.ConsumerInfo
	partitions := 0
	for ci := range list.Info() { // read to the end: the lister's goroutine ends then
		if strings.HasPrefix(ci.Name, "dispatcher-") {
			mine = append(mine, ci)
		}
		if strings.HasPrefix(ci.Name, "dispatcher-") && strings.LastIndexFunc(ci.Name, func(r rune) bool { return r < '0' || r > '9' }) < len(ci.Name)-1 {
			partitions++ // dispatcher-<kind>-<p>
		}
	}
	require.NoError(t, list.Err())
	if streamName != bus.StreamCommands && partitions < partition.DefaultCount {
		return false
	}
	for _, ci := range mine {
		// Not NumPending alone: a consumer learns of a message a moment
		// after its publish is acknowledged.
		caught, _, err := natstest.CaughtUp(t.Context(), js, ci)
		require.NoError(t, err)
		if !caught {
			return false
		}
	}
	return true
}

func readRejection(t *testing.T, js jetstream.JetStream, commandKey string) *events.CommandRejected {
	t.Helper()
	var rej *events.CommandRejected
	natstest.Eventually(t, waitFor, func() bool {
		evs, err := history.ReadStream(t.Context(), js, bus.StreamRejections, bus.RejectionSubject(commandKey), 0, 0)
		require.NoError(t, err)
		if len(evs) == 0 {
			return false
		}
		require.Len(t, evs, 1)
		var ok bool
		rej, ok = evs[0].Data.(*events.CommandRejected)
		require.True(t, ok, "rejections stream holds %s", evs[0].Type)
		return true
	}, "rejection of %s", commandKey)
	return rej
}

func TestStartToSuccess(t *testing.T) {
	t.Parallel()

	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4})
	def := b.register(t, "greet", "hello", "bye")
	b.start(t, "greet", "x1")

	task := b.nextTask(t)
	evs := waitHistory(t, b.js, "greet", "x1", "first step sending", func(evs []events.Event) bool { return dispatches(evs) == 1 })
	// The start, scheduled and sending are one event: nothing comes
	// between them (docs/adr/0008). The task's stored sequence is
	// recorded with the step's next event (docs/adr/0007).
	require.Equal(t, []events.Type{events.TypeExecutionStarted}, typesOf(evs))
	historytest.RequireLinear(t, evs)
	started := evs[0].Data.(*events.ExecutionStarted)
	require.Equal(t, "greet", started.Workflow)
	require.Equal(t, 1, started.Version)
	require.JSONEq(t, `{"who":"test"}`, string(started.Input))
	require.Equal(t, def.StepRefs(), started.Steps)
	require.NotEmpty(t, started.Token)
	disp := started.Then
	require.NotNil(t, disp, "the start records hello's dispatch")
	require.Equal(t, "hello", disp.StepID)
	require.Equal(t, events.TaskID("x1", "hello", 1), disp.TaskID)
	require.Equal(t, workflow.DefaultQueue, disp.Queue)
	require.NotEmpty(t, disp.Input, "the rendered input is recorded before the task is published")

	t.Log("the task carries the token, step, attempt and idempotency id")
	wantID := events.TaskID("x1", "hello", 1)
	require.Equal(t, wantID, task.task.TaskID)
	require.Equal(t, wantID, task.ev.ID)
	require.Equal(t, wantID, task.msgID)
	require.Equal(t, "x1", task.task.ExecutionID)
	require.Equal(t, "greet", task.task.Workflow)
	require.Equal(t, "hello", task.task.StepID)
	require.Equal(t, 1, task.task.Attempt)
	require.Equal(t, started.Token, task.task.Token)
	require.Equal(t, workflow.KindNoop, task.task.Kind)
	require.Equal(t, workflow.DefaultQueue, task.task.Queue)
	require.Positive(t, task.seq)
	var spec workflow.Step
	require.NoError(t, json.Unmarshal(task.task.Spec, &spec))
	require.Equal(t, def.Steps[0], spec)

	t.Log("results advance the execution")
	b.report(t, &events.OperationStarted{TaskRef: task.ref("test-agent", 1)})
	b.report(t, &events.OperationSucceeded{TaskRef: task.ref("test-agent", 1), Output: json.RawMessage(`{"n":1}`)})
	second := b.nextTask(t)
	require.Equal(t, "bye", second.task.StepID)
	require.Equal(t, events.TaskID("x1", "bye", 1), second.task.TaskID)
	// The second reports its start only with its result (an operation
	// shorter than the agent's grace): one event records both.
	// Not truncated: a start the agent's clock puts before the step's
	// schedule (the same millisecond, cut) is taken as the schedule.
	began := time.Now().UTC()
	b.report(t, &events.OperationSucceeded{TaskRef: second.ref("test-agent", 1), StartedAt: began})

	s, evs := waitStatus(t, b.js, "greet", "x1", projections.StatusSucceeded)
	historytest.RequireLinear(t, evs)
	require.Equal(t, []events.Type{
		events.TypeExecutionStarted,                      // with hello's dispatch
		events.TypeStepStarted, events.TypeStepSucceeded, // hello's success carries bye's dispatch
		events.TypeExecutionSucceeded, // the end carries bye's success
	}, typesOf(evs))
	then := evs[2].Data.(*events.StepSucceeded).Then
	require.NotNil(t, then, "hello's success records bye's dispatch: one event")
	require.Equal(t, "bye", then.StepID)
	require.Equal(t, second.task.TaskID, then.TaskID)
	t.Log("each step passed through sent, with the task's stored sequence and time from the agent's report")
	for i, ft := range []fetchedTask{task, second} {
		st := s.Steps[i]
		require.Equal(t, ft.seq, st.TaskSeq)
		require.False(t, st.SentAt.IsZero(), "step %d passed through sent", i)
		require.False(t, st.SentAt.Before(st.ScheduledAt) || st.SentAt.After(st.EndedAt),
			"step %d: scheduled at %s, sent at %s, ended at %s", i, st.ScheduledAt, st.SentAt, st.EndedAt)
	}
	require.Equal(t, projections.OpSucceeded, s.Steps[0].Status)
	require.JSONEq(t, `{"n":1}`, string(s.Steps[0].Output))
	require.Equal(t, "test-agent", s.Steps[0].Agent)
	require.Equal(t, projections.OpSucceeded, s.Steps[1].Status)
	require.True(t, began.Equal(s.Steps[1].StartedAt), "started at %s, want %s", s.Steps[1].StartedAt, began)
	require.Equal(t, 1, s.Steps[1].Delivery)
	require.Equal(t, "test-agent", s.Steps[1].Agent)
}

func TestStaleResultsIgnored(t *testing.T) {
	t.Parallel()

	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4})
	b.register(t, "greet", "hello", "bye")
	b.start(t, "greet", "x1")
	task := b.nextTask(t)
	waitHistory(t, b.js, "greet", "x1", "step sent", func(evs []events.Event) bool {
		return len(evs) == 1 && dispatches(evs) == 1
	})
	ref := task.task.Ref("test-agent", 1)

	t.Run("WrongToken", func(t *testing.T) {
		bad := ref
		bad.Token = "not-the-token"
		b.report(t, &events.OperationStarted{TaskRef: bad})
		b.report(t, &events.OperationSucceeded{TaskRef: bad})
		b.report(t, &events.OperationFailed{TaskRef: bad, Error: "boom"})
		waitResultsHandled(t, b.js)
		evs := readHistory(t, b.js, "greet", "x1")
		require.Equal(t, 4, len(evs), "each report is recorded as ignored, nothing else")
		for _, ev := range evs[1:] { // after the start, which carries the dispatch
			require.Equal(t, events.TypeResultIgnored, ev.Type)
			require.Contains(t, ev.Data.(*events.ResultIgnored).Reason, "stale execution token")
		}
		s, err := projections.Fold(evs)
		require.NoError(t, err)
		require.Equal(t, projections.OpSending, s.Steps[0].Status)
	})

	t.Run("WrongAttempt", func(t *testing.T) {
		for _, attempt := range []int{0, 2} {
			bad := ref
			bad.Attempt = attempt
			bad.TaskID = events.TaskID("x1", "hello", attempt)
			b.report(t, &events.OperationStarted{TaskRef: bad})
			b.report(t, &events.OperationSucceeded{TaskRef: bad})
			b.report(t, &events.OperationFailed{TaskRef: bad, Error: "boom"})
		}
		waitResultsHandled(t, b.js)
		evs := readHistory(t, b.js, "greet", "x1")
		require.Equal(t, 10, len(evs))
		require.Equal(t, 9, countType(evs, events.TypeResultIgnored))
		require.Contains(t, evs[4].Data.(*events.ResultIgnored).Reason, "attempt 0 is not the step's current attempt 1")
		s, err := projections.Fold(evs)
		require.NoError(t, err)
		require.Equal(t, projections.OpSending, s.Steps[0].Status)
		require.Len(t, s.Ignored, 9)
	})

	t.Run("Duplicate", func(t *testing.T) {
		// Distinct CloudEvent ids, so the results stream keeps every copy.
		b.report(t, &events.OperationSucceeded{TaskRef: ref, Output: json.RawMessage(`{"first":true}`)})
		b.report(t, &events.OperationSucceeded{TaskRef: ref, Output: json.RawMessage(`{"first":false}`)})
		b.report(t, &events.OperationStarted{TaskRef: ref})
		b.report(t, &events.OperationFailed{TaskRef: ref, Error: "late failure"})
		waitResultsHandled(t, b.js)
		evs := readHistory(t, b.js, "greet", "x1")
		historytest.RequireLinear(t, evs)
		var kept []events.Type
		for _, typ := range typesOf(evs) {
			if typ != events.TypeResultIgnored { // from the cases above
				kept = append(kept, typ)
			}
		}
		require.Equal(t, []events.Type{
			events.TypeExecutionStarted, // with the first step's dispatch
			events.TypeStepSucceeded,    // with the next step's dispatch
		}, kept, "duplicates of the current attempt are not recorded at all")
		s, err := projections.Fold(evs)
		require.NoError(t, err)
		require.JSONEq(t, `{"first":true}`, string(s.Steps[0].Output))
	})

	t.Run("AfterTerminal", func(t *testing.T) {
		second := b.nextTask(t)
		require.Equal(t, "bye", second.task.StepID)
		ref2 := second.task.Ref("test-agent", 1)
		b.report(t, &events.OperationSucceeded{TaskRef: ref2})
		_, before := waitStatus(t, b.js, "greet", "x1", projections.StatusSucceeded)
		b.report(t, &events.OperationFailed{TaskRef: ref2, Error: "too late"})
		b.report(t, &events.OperationSucceeded{TaskRef: ref2})
		b.report(t, &events.OperationFailed{TaskRef: ref, Error: "too late"})
		waitResultsHandled(t, b.js)
		evs := readHistory(t, b.js, "greet", "x1")
		require.Equal(t, typesOf(before), typesOf(evs))
		require.Equal(t, 2, countType(evs, events.TypeStepSucceeded))
	})
}

func TestFailedStepFailsExecution(t *testing.T) {
	t.Parallel()

	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4})
	b.register(t, "greet", "hello", "bye")
	b.start(t, "greet", "x1")
	task := b.nextTask(t)
	b.report(t, &events.OperationFailed{TaskRef: task.task.Ref("test-agent", 1), Error: "exit status 3",
		Output: json.RawMessage(`{"exit_code":3}`)})

	s, evs := waitStatus(t, b.js, "greet", "x1", projections.StatusFailed)
	historytest.RequireLinear(t, evs)
	require.Equal(t, "step hello failed: exit status 3", s.Error)
	failed := evs[len(evs)-1].Data.(*events.ExecutionFailed)
	require.Equal(t, "hello", failed.StepID)
	require.Equal(t, projections.OpFailed, s.Steps[0].Status)
	require.Equal(t, projections.OpNone, s.Steps[1].Status, "no later step is scheduled")
}

func TestStartRejected(t *testing.T) {
	t.Parallel()

	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 4})
	ids, err := claim.Open(t.Context(), b.js)
	require.NoError(t, err)

	t.Run("UnknownWorkflow", func(t *testing.T) {
		key := b.start(t, "nope", "x-unknown")
		rej := readRejection(t, b.js, key)
		require.Equal(t, events.CodeNotFound, rej.Code)
		require.Equal(t, key, rej.CommandKey)
		require.Equal(t, events.TypeStartExecution, rej.CommandType)
		require.Equal(t, "x-unknown", rej.ExecutionID)
		require.Equal(t, "workflow", rej.Field)
		require.Equal(t, `workflow "nope" is not registered`, rej.Reason)

		_, err := ids.Get(t.Context(), "x-unknown")
		require.ErrorIs(t, err, claim.ErrNotFound, "a rejected start claims no execution id")
		require.Empty(t, readHistory(t, b.js, "nope", "x-unknown"))

		t.Log("the id is still free for a valid start")
		b.register(t, "greet", "hello")
		b.start(t, "greet", "x-unknown")
		evs := waitHistory(t, b.js, "greet", "x-unknown", "started", func(evs []events.Event) bool { return len(evs) > 0 })
		require.Equal(t, events.TypeExecutionStarted, evs[0].Type)
		_, err = ids.Get(t.Context(), "x-unknown")
		require.NoError(t, err)
	})

	t.Run("InvalidExecutionID", func(t *testing.T) {
		for _, id := range []string{"bad id!", "-leading-dash", "a.b"} {
			key := b.start(t, "greet", id)
			rej := readRejection(t, b.js, key)
			require.Equal(t, events.CodeInvalid, rej.Code, "id %q", id)
			require.Equal(t, events.TypeStartExecution, rej.CommandType)
			require.Equal(t, "execution_id", rej.Field)
			require.Equal(t, fmt.Sprintf("execution_id %q is not a valid execution id: %s", id, events.ExecutionIDRule), rej.Reason)
		}
	})

	t.Run("IDAlreadyUsed", func(t *testing.T) {
		b.register(t, "other", "only")
		b.start(t, "other", "x-taken")
		waitHistory(t, b.js, "other", "x-taken", "started", func(evs []events.Event) bool { return len(evs) > 0 })
		key := b.start(t, "other", "x-taken")
		rej := readRejection(t, b.js, key)
		require.Equal(t, events.CodeConflict, rej.Code)
		require.Equal(t, "execution_id", rej.Field)
		require.Equal(t, `execution id "x-taken" is already used (workflow other); execution ids are unique forever`, rej.Reason)
	})
}

// TestConcurrentDispatchers runs two dispatchers on the same durable
// consumers. Messages about one execution are spread over both, so they
// race to append; the expected-last-sequence check must keep every
// history linear, with one StepSucceeded per step, and both must have
// written (each event's source names its dispatcher).
func TestConcurrentDispatchers(t *testing.T) {
	t.Parallel()

	b := setup(t)
	sources := []string{"dispatcher-0", "dispatcher-1"}
	for _, source := range sources {
		runDispatcher(t, b.connect(), dispatch.Config{Workers: 4, Source: source, Member: source})
	}
	// Both hold the partitions rendezvous hashing gives them.
	owners := partition.Owners(sources, partition.DefaultCount)
	waitLeases(t, b.js, owners)
	// A partition that changes hands during the test (a dispatcher that
	// stalled past its lease on a busy machine) may have its executions
	// written by both; the others only by their holder.
	moved := watchLeaseMoves(t, b.js, owners)
	steps := []string{"one", "two", "three"}
	b.register(t, "race", steps...)
	// Three executions on each dispatcher's partitions.
	const executions = 6
	ids := make([]string, 0, executions)
	owner := map[string]string{}
	perSource := map[string]int{}
	for i := 0; len(ids) < executions; i++ {
		id := fmt.Sprintf("x%d", i)
		o := owners[partition.Of(id, partition.DefaultCount)]
		if perSource[o] < executions/len(sources) {
			perSource[o]++
			ids = append(ids, id)
			owner[id] = o
		}
	}
	for _, id := range ids {
		b.start(t, "race", id)
	}

	// Play the agent: report started, then succeeded twice, for every task.
	for range executions * len(steps) {
		task := b.nextTask(t)
		ref := task.task.Ref("test-agent", 1)
		b.report(t, &events.OperationStarted{TaskRef: ref})
		b.report(t, &events.OperationSucceeded{TaskRef: ref})
		b.report(t, &events.OperationSucceeded{TaskRef: ref})
	}

	for _, id := range ids {
		s, _ := waitStatus(t, b.js, "race", id, projections.StatusSucceeded)
		for _, st := range s.Steps {
			require.Equal(t, projections.OpSucceeded, st.Status, "%s step %s", id, st.ID)
			require.Equal(t, 1, st.Attempt)
		}
	}
	waitResultsHandled(t, b.js)
	written := map[string]int{}
	for _, id := range ids {
		evs := readHistory(t, b.js, "race", id)
		for _, ev := range evs {
			written[ev.Source]++
			if !moved(partition.Of(id, partition.DefaultCount)) {
				require.Equal(t, owner[id], ev.Source, "%s: every event written by its partition's holder", id)
			}
		}
		historytest.RequireLinear(t, evs)
		_, err := projections.Fold(evs)
		require.NoError(t, err)
		require.Equal(t, 1, countType(evs, events.TypeExecutionStarted), id)
		require.Equal(t, len(steps), dispatches(evs), id)
		require.Zero(t, countType(evs, events.TypeStepScheduled), id)
		require.Equal(t, len(steps), countType(evs, events.TypeStepSucceeded), id)
		require.Equal(t, 1, countType(evs, events.TypeExecutionSucceeded), id)
		require.Equal(t, events.TypeExecutionSucceeded, evs[len(evs)-1].Type, id)
	}
	info, err := b.tasks.Info(t.Context())
	require.NoError(t, err)
	require.Zero(t, info.NumPending, "every step was sent once")
	t.Logf("events written by each dispatcher: %v", written)
	for _, source := range sources {
		require.Positive(t, written[source], "%s handled nothing: the test did not run two dispatchers at once", source)
	}
	require.Len(t, written, len(sources), "no event from anyone else")
}
