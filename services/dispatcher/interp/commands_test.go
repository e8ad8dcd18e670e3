package interp

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// commandDef sleeps, then runs an operation.
var commandDef = workflow.Definition{Name: "deploy", Steps: []workflow.Step{
	{ID: "rest", Kind: workflow.KindSleep, Duration: "1m"},
	{ID: "op", Kind: workflow.KindExec, Command: "x"},
}}

// sleeping is an execution of commandDef in its sleep, and the sleep's timer.
func sleeping(t *testing.T) (*memShell, string) {
	t.Helper()
	m := newMemShell(t, commandDef, `{}`)
	m.advance()
	require.Len(t, m.timers, 1)
	for id := range m.timers {
		return m, id
	}
	return m, ""
}

func TestFired(t *testing.T) {
	t.Parallel()
	m, timer := sleeping(t)
	sent := m.now

	d := Fired(m.input(), "t-unknown", sent)
	require.Contains(t, d.Retry, "not recorded yet", "a timer armed a moment ago by another dispatcher may not be visible yet")
	in := m.input()
	in.Now = sent.Add(time.Minute)
	d = Fired(in, "t-unknown", sent)
	require.Equal(t, "a timer the history does not know", d.Ignore)
	require.True(t, d.Empty())

	// Every state its own event (for histories older dispatchers read):
	// the firing, then the sleep's success by the next decision.
	split := m.input()
	split.SplitDispatch = true
	require.Equal(t, []events.Payload{&events.TimerFired{TimerID: timer}}, Fired(split, timer, sent).Events)

	// Else the sleep's end is the very next decision: its success records
	// the firing, and carries the next dispatch (docs/adr/0017, 0008).
	d = Fired(m.input(), timer, sent)
	require.Len(t, d.Events, 1)
	ok, isOK := d.Events[0].(*events.StepSucceeded)
	require.True(t, isOK, "%T", d.Events[0])
	require.Equal(t, "rest", ok.StepID)
	require.Equal(t, timer, ok.Fired)
	require.NotNil(t, ok.Then)
	require.Equal(t, "op", ok.Then.StepID)
	require.Empty(t, d.Before)
	require.Empty(t, d.After)
	m.carry(d)
	require.True(t, m.state.Timers[timer].Fired)
	require.Equal(t, projections.OpSucceeded, m.state.Steps[m.state.StepIndex("rest")].Status)
	d = Fired(m.input(), timer, sent)
	require.True(t, d.Empty(), "fired once")
	require.Empty(t, d.Ignore, "a redelivery goes on deciding: the dispatcher that recorded it may have stopped before acting")
}

// TestFiredCarriesOnlyASleepsEnd: a firing is recorded alone when
// something else follows it: a wait's timeout fails the step, a sleep
// whose execution is being cancelled goes no further, a sleep of a large
// execution (whose decisions follow a view) is decided after.
func TestFiredCarriesOnlyASleepsEnd(t *testing.T) {
	t.Parallel()
	alone := func(t *testing.T, d Decision, timer string) {
		t.Helper()
		require.Equal(t, []events.Payload{&events.TimerFired{TimerID: timer}}, d.Events)
	}
	t.Run("AWaitsTimeout", func(t *testing.T) {
		t.Parallel()
		m := newMemShell(t, workflow.Definition{Name: "w", Steps: []workflow.Step{
			{ID: "hold", Kind: workflow.KindWait, Signal: "go", Timeout: "1m"},
		}}, `{}`)
		m.advance()
		require.Len(t, m.timers, 1)
		for id, due := range m.timers {
			m.now = due
			alone(t, Fired(m.input(), id, due), id)
		}
	})
	t.Run("ACancellingExecution", func(t *testing.T) {
		t.Parallel()
		m, timer := sleeping(t)
		m.append(&events.ExecutionCancelling{})
		alone(t, Fired(m.input(), timer, m.now), timer)
	})
	t.Run("ALargeExecution", func(t *testing.T) {
		t.Parallel()
		var steps []workflow.Step
		for i := range SmallExecution {
			steps = append(steps, workflow.Step{ID: fmt.Sprintf("s%d", i), Kind: workflow.KindNoop})
		}
		steps = append(steps, workflow.Step{ID: "rest", Kind: workflow.KindSleep, Duration: "1m"})
		m := newMemShell(t, workflow.Definition{Name: "big", Steps: steps}, `{}`)
		m.advance()
		for i := 0; len(m.timers) == 0 && i < len(m.tasks); i++ { // each noop's task, in turn
			m.finish(m.tasks[i])
			m.advance()
		}
		require.Len(t, m.timers, 1)
		require.Greater(t, len(m.state.Steps), SmallExecution)
		for id, due := range m.timers {
			m.now = due
			alone(t, Fired(m.input(), id, due), id)
		}
	})
}

func TestSignal(t *testing.T) {
	t.Parallel()
	m, _ := sleeping(t)
	sig := SignalCommand{ID: "s1", Name: "go", Sender: "test", SentAt: m.now}

	bad := sig
	bad.Name = "no spaces"
	require.Equal(t, events.CodeInvalid, Signal(m.input(), bad).Reject.Code)

	d := Signal(m.input(), sig)
	require.Equal(t, []events.Payload{&events.SignalReceived{SignalID: "s1", Name: "go", Sender: "test"}}, d.Events)
	m.carry(d)
	require.True(t, Signal(m.input(), sig).Empty(), "the same signal again records nothing")

	none := Input{ID: "x2", Now: m.now}
	require.NotEmpty(t, Signal(none, sig).Retry, "the start may be on its way")
	none.Now = m.now.Add(time.Minute)
	require.Equal(t, NeedClaim{}, Signal(none, sig).Need, "after 30 s: was its start accepted?")
	unclaimed, claimed := false, true
	none.Claimed = &unclaimed
	d = Signal(none, sig)
	require.Equal(t, events.CodeNotFound, d.Reject.Code)
	require.Contains(t, d.Reject.Reason, "never started")
	// Its start was accepted (the id is claimed) but its first append
	// waits (a cluster electing a leader): the signal waits too, for up
	// to StartClaimedWait, instead of being lost.
	none.Claimed = &claimed
	require.Contains(t, Signal(none, sig).Retry, "its start was accepted")
	none.Now = m.now.Add(StartClaimedWait)
	d = Signal(none, sig)
	require.Equal(t, events.CodeNotFound, d.Reject.Code, "not for ever")

	m.append(&events.ExecutionCancelled{})
	d = Signal(m.input(), SignalCommand{ID: "s2", Name: "go", SentAt: m.now})
	require.Equal(t, events.CodeConflict, d.Reject.Code)
	require.Contains(t, d.Reject.Reason, "has already cancelled")
}

func TestAction(t *testing.T) {
	t.Parallel()
	act := func(key, action string) ActionCommand {
		return ActionCommand{Key: key, Record: events.ActionRecord{Action: action, RequestedBy: "ops", Command: key}}
	}
	t.Run("Cancel", func(t *testing.T) {
		t.Parallel()
		m, _ := sleeping(t)
		d := Action(m.input(), act("k1", events.ActionCancel))
		require.Len(t, d.Events, 1)
		require.IsType(t, &events.ExecutionCancelling{}, d.Events[0])
		m.carry(d)
		m.advance()
		require.Equal(t, projections.StatusCancelled, m.state.Status, "nothing runs: cancelled at once (%v)", m.types())
		require.True(t, Action(m.input(), act("k1", events.ActionCancel)).Empty(), "the same command again records nothing")
		d = Action(m.input(), act("k1", events.ActionKill))
		require.Equal(t, events.CodeConflict, d.Reject.Code)
		require.Contains(t, d.Reject.Reason, "already recorded as a cancel")
	})
	t.Run("Kill", func(t *testing.T) {
		t.Parallel()
		m, _ := sleeping(t)
		d := Action(m.input(), act("k2", events.ActionKill))
		require.Len(t, d.Events, 1)
		require.IsType(t, &events.ExecutionCancelled{}, d.Events[0])
		require.Equal(t, []Effect{PublishKill{Command: "k2"}}, d.After, "agents are told once it is recorded")
		m.carry(d)
		again := Action(m.input(), act("k2", events.ActionKill))
		require.Empty(t, again.Events)
		require.Equal(t, []Effect{PublishKill{Command: "k2"}}, again.After, "a redelivered kill publishes its notice again")
	})
	t.Run("ResumeAsksForStoredResults", func(t *testing.T) {
		t.Parallel()
		m, _ := sleeping(t)
		m.carry(Action(m.input(), act("k3", events.ActionForceCancel)))
		require.Equal(t, projections.StatusCancelled, m.state.Status)
		require.Equal(t, NeedStoredResults{}, Action(m.input(), act("k4", events.ActionResume)).Need)
		in := m.input()
		in.Stored = map[string]events.Event{}
		noToken := in
		noToken.Token = ""
		require.Equal(t, NeedToken{}, Action(noToken, act("k4", events.ActionResume)).Need,
			"a fresh token is made only for the decisions that need one")
		d := Action(in, act("k4", events.ActionResume))
		require.Len(t, d.Events, 1)
		resumed, ok := d.Events[0].(*events.ExecutionResumed)
		require.True(t, ok, "%T", d.Events[0])
		require.Equal(t, in.Token, resumed.Token, "a resume gives the execution the fresh token of its input")
		require.Equal(t, []Effect{CatchUp{}}, d.After)
	})
	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		m, _ := sleeping(t)
		d := Action(m.input(), act("k5", events.ActionResume))
		require.Nil(t, d.Reject, "a started execution may be resumed")
		m.append(&events.ExecutionSucceeded{})
		d = Action(m.input(), act("k6", events.ActionCancel))
		require.Equal(t, events.CodeConflict, d.Reject.Code)
		require.Contains(t, d.Reject.Reason, "has already succeeded")
	})
	t.Run("Expired", func(t *testing.T) {
		t.Parallel()
		m, _ := sleeping(t)
		m.append(&events.ExecutionCancelled{})
		m.append(&events.ExecutionExpired{Rule: "1d"})
		d := Action(m.input(), act("k7", events.ActionResume))
		require.Equal(t, events.CodeExpired, d.Reject.Code)
	})
	t.Run("ReplayDisabled", func(t *testing.T) {
		t.Parallel()
		def := commandDef
		def.Replayable = "disabled"
		m := newMemShell(t, def, `{}`)
		m.advance()
		d := Action(m.input(), act("k8", events.ActionReplay))
		require.Equal(t, events.CodeConflict, d.Reject.Code)
		require.Contains(t, d.Reject.Reason, "replayable: disabled")
	})
}

func TestExpire(t *testing.T) {
	t.Parallel()
	m, _ := sleeping(t)
	cmd := ExpireCommand{LastSeq: m.state.LastSeq, Rule: "1d", By: "janitor"}
	require.Contains(t, Expire(m.input(), cmd).Ignore, "changed since the janitor looked", "a running execution is kept")
	m.append(&events.ExecutionCancelled{})
	require.Contains(t, Expire(m.input(), cmd).Ignore, "changed since", "the history moved on since the janitor looked")
	cmd.LastSeq = m.state.LastSeq
	d := Expire(m.input(), cmd)
	require.Equal(t, []events.Payload{&events.ExecutionExpired{Rule: "1d", RequestedBy: "janitor"}}, d.Events)
	m.carry(d)
	require.True(t, Expire(m.input(), cmd).Empty(), "recorded once")
	require.Equal(t, "expire: no history, nothing to record", Expire(Input{ID: "x2"}, cmd).Ignore)
}

func TestExpireGivesUpLocksFirst(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Lock: "l", Steps: []workflow.Step{{ID: "op", Kind: workflow.KindExec, Command: "x"}}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	m.append(&events.ExecutionCancelled{}) // recorded, and then a crash before the lock was given up
	d := Expire(m.input(), ExpireCommand{LastSeq: m.state.LastSeq, Rule: "1d"})
	require.Equal(t, []events.Payload{&events.LockReleased{Lock: "l", Reason: "the execution is cancelled"}}, d.Events,
		"the lock is given up; expiring waits for the janitor's next look")
}

func TestRepair(t *testing.T) {
	t.Parallel()
	m, _ := sleeping(t)
	rec := events.ActionRecord{Action: events.ActionRepair, Command: "k1"}
	cmd := RepairCommand{Key: "k1", IgnoreSeq: 3, Record: rec, FirstSeq: 1}
	d := Repair(m.input(), cmd)
	require.Equal(t, events.CodeConflict, d.Reject.Code)
	require.Contains(t, d.Reject.Reason, "is not damaged")

	damaged := m.input()
	damaged.State.Damaged = &projections.Damage{Seq: 5, Reason: "illegal"}
	d = Repair(damaged, cmd)
	require.Contains(t, d.Reject.Reason, "damaged at sequence 5, not 3")
	cmd.IgnoreSeq = 5
	d = Repair(damaged, cmd)
	require.Equal(t, []events.Payload{&events.ExecutionRepaired{IgnoreSeq: 5, ActionRecord: rec}}, d.Events)
	first := cmd
	first.IgnoreSeq, first.FirstSeq = 5, 5
	require.Contains(t, Repair(damaged, first).Reject.Reason, "damaged at its first event")

	m.carry(d) // recorded: the same command again records nothing
	again := m.input()
	again.State.Damaged = nil
	require.True(t, Repair(again, cmd).Empty())
	require.Nil(t, Repair(again, cmd).Reject)
	m.carry(Action(m.input(), ActionCommand{Key: "k2", Record: events.ActionRecord{Action: events.ActionCancel, Command: "k2"}}))
	other := cmd
	other.Key = "k2"
	require.Contains(t, Repair(m.input(), other).Reject.Reason, "already recorded as a cancel")
}

func TestClear(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Lock: "l", Steps: []workflow.Step{{ID: "op", Kind: workflow.KindExec, Command: "x"}}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	l, ok := m.state.LockAt("")
	require.True(t, ok)
	rec := events.ActionRecord{Action: "clear-lock", RequestedBy: "ops", Command: "k"}
	cmd := ClearCommand{Lock: "l", Request: l.Requests, Record: rec}

	d := Clear(m.input(), cmd)
	require.Equal(t, []Effect{ReleaseLock{Lock: "l", Request: l.Requests, Reason: "cleared"}}, d.Before, "removed from the bucket first")
	require.Equal(t, []events.Payload{&events.LockCleared{ActionRecord: rec, Lock: "l"}}, d.Events)

	janitor := cmd
	janitor.OnlyEnded = true
	require.NotEmpty(t, Clear(m.input(), janitor).Ignore, "the janitor leaves a running holder alone")

	stale := cmd
	stale.Request = l.Requests + 1
	d = Clear(m.input(), stale)
	require.Len(t, d.Before, 1, "a stale entry is removed from the bucket")
	require.Empty(t, d.Events, "and nothing is recorded: the history does not hold it")
}

// TestFiredInAnUnsettledState: a dispatcher stopped after an operation's
// success was recorded, before the next decision (the block's success)
// was; the sleep of another branch fires meanwhile. The next decision
// after the firing is that other step's success, which must not record
// the firing (the fold would refuse it, and the timer's message be
// dropped): the firing is recorded alone, and the execution goes on.
func TestFiredInAnUnsettledState(t *testing.T) {
	t.Parallel()
	def := workflow.Definition{Name: "wf", Steps: []workflow.Step{
		{ID: "p", Kind: workflow.KindParallel, Branches: []workflow.Branch{
			{ID: "a", Steps: []workflow.Step{{ID: "blk", Kind: workflow.KindWorkflow, Steps: []workflow.Step{{ID: "op", Kind: workflow.KindExec, Command: "x"}}}}},
			{ID: "b", Steps: []workflow.Step{{ID: "s", Kind: workflow.KindSleep, Duration: "1s"}}}}}}}
	m := newMemShell(t, def, `{}`)
	m.advance()
	require.Len(t, m.tasks, 1)
	require.Len(t, m.timers, 1)
	m.carry(m.report(&events.OperationSucceeded{Output: []byte(`1`)})) // and no advance: stopped here
	for id, due := range m.timers {
		m.now = due
		d := Fired(m.input(), id, due)
		require.Equal(t, []events.Payload{&events.TimerFired{TimerID: id}}, d.Events)
		m.carry(d)
		m.advance()
	}
	require.Equal(t, projections.StatusSucceeded, m.state.Status, "%v", m.types())
}
