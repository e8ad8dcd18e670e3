// Package eventstest holds sample events for tests: one fully populated
// payload of every event type. The tests of pkg/events (every declared
// type has a sample, every member of a sample is set) and those of the
// NATS codec in pkg/bus (every sample survives a round trip) share them,
// so that a new event type is covered by both.
package eventstest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"jetflow.dev/pkg/events"
)

// At is the time the samples are set at.
var At = time.Date(2026, 3, 14, 15, 9, 26, 535897932, time.UTC)

// Samples returns one fully populated payload of every event type, fresh
// on each call. RawMessage fields are compact JSON so that they survive a
// round trip byte for byte; only OperationSucceeded.Output is JSON null,
// on purpose.
func Samples() []events.Payload {
	actor := &events.Actor{Subject: "alice", Method: events.ActorAPIKey, KeyID: "0123456789abcdef"}
	action := events.ActionRecord{Action: events.ActionCancel, Reason: "wrong host", RequestedBy: "alice", Actor: actor, Command: "cli#7"}
	ref := events.TaskRef{TaskID: "x1.build.2", ExecutionID: "x1", Workflow: "deploy", StepID: "build",
		Attempt: 2, Token: "tok", Queue: "gpu", Agent: "agent-7", Delivery: 3, TaskSeq: 41, StoredAt: At.Add(-2 * time.Second)}
	return []events.Payload{
		&events.ExecutionStarted{Workflow: "deploy", Version: 3, Input: json.RawMessage(`{"env":"prod"}`),
			Steps:      []events.StepRef{{ID: "build", Kind: "exec"}, {ID: "notify", Kind: "http"}},
			Definition: json.RawMessage(`{"name":"deploy"}`), Token: "tok", CommandKey: "cli#1", CommandDigest: "d1", StartedBy: "alice", Actor: actor, APIURL: "http://127.0.0.1:8080",
			WaitAfterFail: true, DryRun: true, Retention: &events.Retention{Rule: "max(5, 24h)", Key: "deploy-prod"},
			Chain: "x0", Run: 2, ContinuedFrom: "x0", Parent: &events.ParentRef{ExecutionID: "p1", Workflow: "order", StepID: "ship", Attempt: 2, Retention: "7d"},
			Then: &events.StepDispatched{StepID: "build", Kind: "exec", Attempt: 1, Input: json.RawMessage(`{"command":"make"}`),
				Retention: &events.Retention{Rule: "7d"}, TaskID: "x1.build.1", Queue: "default"}},
		&events.ExecutionSucceeded{Output: json.RawMessage(`[1,2,3]`), ContinuedAs: "x1-run2", Children: []events.StoppedChild{{StepID: "each[1]/ship", Attempt: 2, ExecutionID: "x1-ship-0123456789", Action: events.ActionKill}},
			Step: &events.StepSucceeded{StepID: "ship", Attempt: 1, Output: json.RawMessage(`{"ok":true}`), Agent: "a1", Duration: 12,
				OperationStart: events.OperationStart{StartedAt: At.Add(-time.Second), Delivery: 1},
				TaskSent:       events.TaskSent{SentAt: At.Add(-2 * time.Second), TaskSeq: 43}}},
		&events.ExecutionFailed{Error: "step build: exit status 1", StepID: "build", Children: []events.StoppedChild{{StepID: "each[1]/ship", Attempt: 2, ExecutionID: "x1-ship-0123456789", Action: events.ActionKill}}},
		&events.StepScheduled{StepID: "each[1]/build", Kind: "exec", Attempt: 1, Input: json.RawMessage(`"in"`),
			Retention: &events.Retention{Rule: "forever"}},
		&events.StepSending{StepID: "build", Attempt: 1, TaskID: "x1.build.1", Queue: "default"},
		&events.StepSent{StepID: "build", Attempt: 1, TaskID: "x1.build.1", TaskSeq: 42},
		&events.StepDispatched{StepID: "each[1]/build", Kind: "exec", Attempt: 2, Input: json.RawMessage(`{"command":"make"}`),
			Retention: &events.Retention{Rule: "3", Key: "builds"}, TaskID: "x1.each[1]/build.2", Queue: "builders"},
		&events.StepStarted{StepID: "build", Attempt: 1, Agent: "agent-7", Delivery: 2, StartedAt: At.Add(-time.Second),
			TaskSent: events.TaskSent{SentAt: At.Add(-2 * time.Second), TaskSeq: 41}},
		&events.StepChildStarted{StepID: "each[1]/ship", Attempt: 2, ExecutionID: "x1-ship-0123456789", Workflow: "shipping", Version: 4},
		&events.StepSucceeded{StepID: "build", Attempt: 1, Output: json.RawMessage(`{"ok":true}`), SignalID: "s1",
			Vars: map[string]json.RawMessage{"ok": json.RawMessage(`true`)}, Agent: "agent-7", Duration: 1234,
			OperationStart: events.OperationStart{StartedAt: At.Add(-time.Second), Delivery: 2},
			TaskSent:       events.TaskSent{SentAt: At.Add(-2 * time.Second), TaskSeq: 41},
			Then: &events.StepDispatched{StepID: "ship", Kind: "exec", Attempt: 1, Input: json.RawMessage(`{"command":"ship"}`),
				Retention: &events.Retention{Rule: "7d"}, TaskID: "x1.ship.1", Queue: "default"},
			Fired: "t0123456789abcdef01234567"},
		&events.StepFailed{StepID: "build", Kind: "exec", Attempt: 1, Error: "boom", Final: true, Output: json.RawMessage(`{"code":2}`),
			Agent: "agent-7", Lost: true, OperationStart: events.OperationStart{StartedAt: At.Add(-time.Second), Delivery: 1},
			TaskSent: events.TaskSent{SentAt: At.Add(-2 * time.Second), TaskSeq: 41}},
		&events.StartExecution{Workflow: "deploy", Version: 2, Input: json.RawMessage(`{"a":"ü"}`), ExecutionID: "x1",
			Chain: "x0", Run: 2, ContinuedFrom: "x0", Parent: &events.ParentRef{ExecutionID: "p1", Workflow: "order", StepID: "ship", Attempt: 2, Retention: "7d"},
			WaitAfterFail: true, DryRun: true, Actor: actor},
		&events.ReconcileExecution{ExecutionID: "x1", Workflow: "deploy", Reason: "stuck"},
		&events.Task{TaskID: "x1.build.2", ExecutionID: "x1", Workflow: "deploy", StepID: "build", Attempt: 2,
			Token: "tok", Kind: "exec", Queue: "builders", Spec: json.RawMessage(`{"command":"make"}`), Partitions: 8},
		&events.OperationStarted{TaskRef: ref, StartedAt: At.Add(-time.Second)},
		&events.OperationSucceeded{TaskRef: ref, Output: json.RawMessage(`null`), Duration: 99, StartedAt: At.Add(-time.Second)},
		&events.OperationFailed{TaskRef: ref, Error: "agent died", Output: json.RawMessage(`{}`), Lost: true, Final: true, StartedAt: At.Add(-time.Second)},
		&events.CommandRejected{CommandKey: "cli#1", CommandType: events.TypeStartExecution, ExecutionID: "x1",
			Code: events.CodeNotFound, Reason: "no workflow deploy", Field: "workflow", Subject: "jf.commands.start", StreamSeq: 7},
		&events.ExecutionCancelling{ActionRecord: action},
		&events.ExecutionCancelled{ActionRecord: action, Children: []events.StoppedChild{{StepID: "each[1]/ship", Attempt: 2, ExecutionID: "x1-ship-0123456789", Action: events.ActionKill}}},
		&events.ExecutionResumed{ActionRecord: action, Token: "tok2", Reset: []string{"build", "each[1]/ping"}},
		&events.ExecutionReplayed{ActionRecord: action, From: events.ReplayLast, Force: true, Point: "each[1]/ping",
			Mode: events.ReplayModeReplay, Token: "tok3", Resume: []string{"a"}, Reopen: []string{"each"}, Reset: []string{"b"},
			Vars: map[string]json.RawMessage{"n": json.RawMessage(`2`)}, Cause: "build/on-error1/again", Automatic: true},
		&events.DefinitionChanged{ActionRecord: action, FromVersion: 1, Version: 2, Definition: json.RawMessage(`{"name":"deploy","steps":[{"id":"build","kind":"exec"}]}`),
			Steps: []events.StepRef{{ID: "build", Kind: "exec"}}, Moved: map[string]string{"test": "checks/test"}, Retired: []string{"old", "blk/old"},
			Retention: &events.Retention{Rule: "3", Key: "deploy"}},
		&events.CompensationStarted{ActionRecord: action, Cause: events.CompensateForOperator, Error: "step ship failed: boom",
			Steps: []string{"book-car", "book-hotel"}, Token: "tok4", Children: []events.StoppedChild{{StepID: "each[1]/ship", Attempt: 2, ExecutionID: "x1-ship-0123456789", Action: events.ActionKill}}},
		&events.CompensationFinished{},
		&events.CompensationFailed{StepID: "book-car", Error: "step book-car/compensate/cancel failed: 503"},
		&events.ExecutionSuspended{Error: "step build: exit status 1", StepID: "build"},
		&events.ResultIgnored{ResultID: "r1", ResultType: events.TypeOperationSucceeded, TaskID: "x1.build.1", StepID: "build",
			Attempt: 1, Agent: "agent-7", Reason: "stale token"},
		&events.ResultAfterEnd{ResultID: "r2", ResultType: events.TypeOperationFailed, TaskID: "x1.build.1", StepID: "build",
			Attempt: 1, Agent: "agent-7", Error: "terminated: an operator killed the execution", StartedAt: At.Add(-time.Second)},
		&events.StepSkipped{StepID: "each[0]/ping", Kind: "exec", Reason: "condition is false", DryRun: true},
		&events.StepWaiting{StepID: "approve", Attempt: 1, Until: At.Add(time.Hour), Signals: []string{"approve", "reject"},
			Timer: &events.TimerArmed{TimerID: "t-wait-1", Purpose: events.TimerWaitTimeout, StepID: "approve", Attempt: 1, Due: At.Add(time.Hour)}},
		&events.StepRescheduled{StepID: "build", Attempt: 1, NextAttempt: 2, Due: At.Add(2 * time.Second), TimerID: "t-retry-1"},
		&events.VariablesSet{StepID: "set", Vars: map[string]json.RawMessage{"host": json.RawMessage(`"web-1"`), "n": json.RawMessage(`[1,{"a":null}]`)}},
		&events.TimerArmed{TimerID: "t-sleep-1", Purpose: events.TimerSleep, StepID: "nap", Attempt: 1, Due: At.Add(time.Minute)},
		&events.TimerFired{TimerID: "t-sleep-1"},
		&events.SignalReceived{SignalID: "s1", Name: "approve", Data: json.RawMessage(`{"by":"alice"}`), Sender: "cli/alice", Actor: actor},
		&events.SignalExecution{ExecutionID: "x1", Name: "approve", Data: json.RawMessage(`{"by":"alice"}`), Actor: actor},
		&events.FireTimer{ExecutionID: "x1", Workflow: "deploy", TimerID: "t-sleep-1"},
		&events.TimerNotice{ExecutionID: "x1", Workflow: "deploy", TimerID: "t-sleep-1", Due: At.Add(time.Hour)},
		&events.ExecutionAction{ExecutionID: "x1", Action: events.ActionReplay, Reason: "fixed the host", RequestedBy: "alice", Version: 3,
			From: "build", Force: true, Actor: actor, IgnoreSeq: 17, Parent: &events.ParentRef{ExecutionID: "p1", Workflow: "order", StepID: "ship", Attempt: 2}},
		&events.KillOperations{ExecutionID: "x1", Workflow: "deploy", Command: "cli#9", Lift: true},
		&events.RefuseTasks{ExecutionID: "x1", Workflow: "deploy", Tokens: []string{"tok2"}, Command: "cli#10"},
		&events.TerminateTask{ExecutionID: "x1", Workflow: "deploy", TaskID: "x1.build.3", Reason: "attempt 3 timed out after 10s"},
		&events.LockRequested{Lock: "apt-web-1", Path: "install", Limit: 3},
		&events.LockAcquired{Lock: "apt-web-1", Path: "install"},
		&events.LockReleased{Lock: "db", Path: "install", Reason: "the execution ends"},
		&events.LockCleared{ActionRecord: action, Lock: "db", Path: "each[2]/blk"},
		&events.ClearLock{Lock: "db", Entries: []events.LockEntry{{ExecutionID: "x1", Workflow: "deploy", Path: "blk", Request: 2}},
			OnlyEnded: true, Reason: "holder ended", RequestedBy: "jetflow/janitor", Actor: actor},
		&events.ExpireExecution{ExecutionID: "x1", Workflow: "deploy", LastSeq: 41, Rule: "3", Group: "deploy"},
		&events.ExecutionExpired{Rule: "3", Group: "deploy", RequestedBy: "jetflow/janitor"},
		&events.ExecutionRepaired{IgnoreSeq: 17, ActionRecord: events.ActionRecord{Action: events.ActionRepair,
			Reason: "an event written by hand", RequestedBy: "alice", Actor: actor, Command: "jetflow/api#r1"}},
	}
}

// Types returns every event type this version declares, fresh on each
// call.
func Types() []events.Type {
	return []events.Type{
		events.TypeExecutionStarted, events.TypeExecutionSucceeded, events.TypeExecutionFailed,
		events.TypeStepScheduled, events.TypeStepSending, events.TypeStepDispatched, events.TypeStepSent, events.TypeStepStarted,
		events.TypeStepChildStarted, events.TypeStepSucceeded, events.TypeStepFailed, events.TypeStartExecution, events.TypeReconcileExecution,
		events.TypeTask, events.TypeOperationStarted, events.TypeOperationSucceeded, events.TypeOperationFailed,
		events.TypeCommandRejected, events.TypeExecutionCancelling, events.TypeExecutionCancelled,
		events.TypeExecutionResumed, events.TypeExecutionReplayed, events.TypeDefinitionChanged, events.TypeCompensationStarted, events.TypeCompensationFinished, events.TypeCompensationFailed, events.TypeExecutionSuspended, events.TypeResultIgnored, events.TypeResultAfterEnd,
		events.TypeStepSkipped, events.TypeStepWaiting, events.TypeStepRescheduled, events.TypeVariablesSet,
		events.TypeTimerArmed, events.TypeTimerFired, events.TypeSignalReceived, events.TypeSignalExecution,
		events.TypeFireTimer, events.TypeTimerNotice, events.TypeExecutionAction, events.TypeKillOperations, events.TypeRefuseTasks, events.TypeTerminateTask,
		events.TypeLockRequested, events.TypeLockAcquired, events.TypeLockReleased, events.TypeLockCleared, events.TypeClearLock,
		events.TypeExpireExecution, events.TypeExecutionExpired, events.TypeExecutionRepaired,
	}
}

// Event returns p as the dispatcher appends it: a fresh id, source
// jetflow/dispatcher, execution x1 of workflow deploy, time [At], and 41 as
// the previous event's sequence.
func Event(p events.Payload) events.Event {
	ev := events.New("jetflow/dispatcher", "x1", "deploy", At, p)
	ev.PrevSeq = 41
	return ev
}

// SkipOtherJSON skips a test case of the implementation of encoding/json
// this build does not have: one named ...V1 is the v1 implementation's
// only, one named ...V2 the v2 one's (events.JSONv2); any other runs in
// both (make test runs the packages that explain bad JSON on each).
func SkipOtherJSON(t testing.TB, name string) {
	t.Helper()
	if v1, v2 := strings.HasSuffix(name, "V1"), strings.HasSuffix(name, "V2"); (v1 && events.JSONv2) || (v2 && !events.JSONv2) {
		t.Skip("a case of encoding/json's other implementation")
	}
}
