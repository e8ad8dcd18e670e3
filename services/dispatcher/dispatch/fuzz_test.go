package dispatch

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/startcheck"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/dispatcher/interp"
)

// The fuzz target of the dispatcher's intake of messages: what it decides
// without I/O (intake's admit, the shell's vetting, the interpreter's
// decision and the start check) for any message on any subject.

const (
	fuzzPartitions = 4
	fuzzWorkflow   = "fz"
	fuzzID         = "fz-1"
)

var fuzzNow = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// fuzzDef is the workflow every execution of the fuzz target runs: a
// wait, an operation under a lock, a replay point.
var fuzzDef = func() workflow.Definition {
	d, err := workflow.Parse([]byte(`name: fz
input:
  type: object
  properties: {n: {type: integer, minimum: 1}}
steps:
  - {id: wait, kind: wait, signal: go, timeout: 1h}
  - id: blk
    kind: workflow
    lock: gate
    steps:
      - {id: op, kind: exec, command: x, replayable: from here}
  - {id: done, kind: noop}
`))
	if err != nil {
		panic(err)
	}
	return d
}()

// fuzzState is an execution as the interpreter gets it, and its history.
type fuzzState struct {
	name    string
	state   projections.Execution
	history []events.Event
}

// fuzzStates are the executions a command may find: none yet, started,
// cancelled, ended and expired, damaged.
func fuzzStates(t testing.TB) []fuzzState {
	t.Helper()
	st, err := startcheck.Check(events.New("fuzz", fuzzID, fuzzWorkflow, fuzzNow,
		&events.StartExecution{Workflow: fuzzWorkflow, ExecutionID: fuzzID, Input: json.RawMessage(`{"n":1}`)}),
		&startcheck.Definition{Name: fuzzWorkflow, Version: 1, Spec: fuzzDef}, startcheck.Options{Now: fuzzNow})
	if err != nil {
		t.Fatal(err)
	}
	started := st.Started
	started.Token = "t1"
	history := func(ps ...events.Payload) []events.Event {
		var evs []events.Event
		for i, p := range ps {
			ev := events.New("fuzz", fuzzID, fuzzWorkflow, fuzzNow, p)
			ev.Seq, ev.PrevSeq = uint64(10*i+10), uint64(10*i)
			if i == 0 {
				ev.PrevSeq = 0
			}
			evs = append(evs, ev)
		}
		return evs
	}
	out := []fuzzState{{name: "none"}}
	for name, evs := range map[string][]events.Event{
		"started":   history(started),
		"cancelled": history(started, &events.ExecutionCancelled{}),
		"expired":   history(started, &events.ExecutionSucceeded{}, &events.ExecutionExpired{Rule: "1"}),
		"damaged":   history(started, started),
	} {
		out = append(out, fuzzState{name: name, state: projections.FoldQuarantined(fuzzID, evs), history: evs})
	}
	return out
}

// fuzzSeeds are real commands, each on the subject it is published on.
func fuzzSeeds(t testing.TB) []*nats.Msg {
	t.Helper()
	api := &events.Actor{Subject: "alice", Method: events.ActorAPIKey, KeyID: "0123456789abcdef"}
	sig := json.RawMessage(`{"by":"alice"}`)
	cmds := []struct {
		subject string
		p       events.Payload
	}{
		{bus.SubjectStart, &events.StartExecution{Workflow: fuzzWorkflow, Input: json.RawMessage(`{"n":2}`)}},
		{bus.SubjectStart, &events.StartExecution{Workflow: fuzzWorkflow, Version: 1, ExecutionID: "x-2", WaitAfterFail: true, DryRun: true}},
		{bus.SubjectAPIStart, &events.StartExecution{Workflow: fuzzWorkflow, ExecutionID: "x-3", Actor: api}},
		{bus.SubjectSignal, &events.SignalExecution{ExecutionID: fuzzID, Name: "go", Data: sig}},
		{bus.SubjectAPISignal, &events.SignalExecution{ExecutionID: fuzzID, Name: "go", Actor: api}},
		{bus.SubjectAction, &events.ExecutionAction{ExecutionID: fuzzID, Action: events.ActionCancel, Reason: "wrong tag", RequestedBy: "alice"}},
		{bus.SubjectAction, &events.ExecutionAction{ExecutionID: fuzzID, Action: events.ActionKill}},
		{bus.SubjectAPIAction, &events.ExecutionAction{ExecutionID: fuzzID, Action: events.ActionResume, Actor: api}},
		{bus.SubjectAPIAction, &events.ExecutionAction{ExecutionID: fuzzID, Action: events.ActionForceResume, Actor: api}},
		{bus.SubjectAPIAction, &events.ExecutionAction{ExecutionID: fuzzID, Action: events.ActionReplay, From: "blk/op", Force: true, Actor: api}},
		{bus.SubjectAPIAction, &events.ExecutionAction{ExecutionID: fuzzID, Action: events.ActionRepair, IgnoreSeq: 20, Actor: api}},
		{bus.SubjectReconcile, &events.ReconcileExecution{ExecutionID: fuzzID, Workflow: fuzzWorkflow, Reason: "lock"}},
		{bus.SubjectExpire, &events.ExpireExecution{ExecutionID: fuzzID, Workflow: fuzzWorkflow, LastSeq: 30, Rule: "1"}},
		{bus.SubjectClearLock, &events.ClearLock{Lock: "gate", Entries: []events.LockEntry{{ExecutionID: fuzzID, Workflow: fuzzWorkflow, Path: "blk", Request: 1}},
			OnlyEnded: true, Reason: "ended"}},
		{bus.SubjectAPIClearLock, &events.ClearLock{Lock: "gate", Entries: []events.LockEntry{{ExecutionID: fuzzID, Workflow: fuzzWorkflow, Request: 1}},
			Reason: "hangs", RequestedBy: "alice", Actor: api}},
		{bus.PartitionTimerSubject(partition.Of(fuzzID, fuzzPartitions), fuzzID), &events.FireTimer{ExecutionID: fuzzID, Workflow: fuzzWorkflow, TimerID: "t-1"}},
	}
	var out []*nats.Msg
	for i, c := range cmds {
		ev := events.New("fuzz", fuzzID, "", fuzzNow, c.p)
		ev.ID = "cmd-" + string(rune('a'+i))
		m, err := bus.Encode(c.subject, ev)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
		if strings.HasPrefix(c.subject, bus.CommandsPrefix+".") {
			// The same command, as an intake routes it to its partition.
			routed := nats.NewMsg(inboxSubjectOf(ev, fuzzPartitions))
			for k, v := range m.Header {
				routed.Header[k] = v
			}
			routed.Data = m.Data
			routed.Header.Set(CommandSubjectHeader, c.subject)
			out = append(out, routed)
		}
	}
	return out
}

// FuzzCommand hands the dispatcher any message on any subject (headers as
// "name: value" lines). Nothing panics, and each message ends accepted or
// rejected with a reason: intake admits it or says why not (and a
// command's rejection can be published); an admitted command is vetted,
// then decided against each state its execution may be in, where a
// rejection has a code and a reason, a start is either valid or a
// problem naming its field, a decision that cannot be carried out
// (dropped without a word to the sender) is a failure, and so is a
// command handed back for later that would still be handed back an hour
// later: it would be retried for ever.
func FuzzCommand(f *testing.F) {
	states := fuzzStates(f)
	for _, m := range fuzzSeeds(f) {
		f.Add(m.Subject, headerLines(m.Header), m.Data)
	}
	f.Add(bus.SubjectSignal, "content-type: application/cloudevents+json",
		[]byte(`{"specversion":"1.0","id":"s1","source":"cli","type":"io.jetflow.execution.signal","data":{"execution_id":"fz-1","name":"go"}}`))
	f.Add(bus.SubjectAction, "", []byte(`{"oops":true}`))
	f.Fuzz(func(t *testing.T, subject, header string, data []byte) {
		h := nats.Header{}
		for _, line := range strings.Split(header, "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && k != "" {
				h.Add(k, strings.TrimSpace(v))
			}
		}
		ev, why, _ := admit(subject, h, data, fuzzPartitions)
		if why != "" {
			if cmd, _, answer := unhandled(subject, h, data, ev, 7); answer {
				checkRejection(t, cmd, events.CodeInvalid, why)
			}
			return
		}
		if ev.Data == nil {
			t.Fatalf("admitted without a payload: %+v", ev)
		}
		if r := vetCommand(ev); r != nil {
			checkRejection(t, ev, r.Code, r.Reason)
			return
		}
		if _, ok := ev.Data.(*events.StartExecution); ok {
			checkStart(t, ev)
			return
		}
		for _, s := range states {
			in := interp.Input{ID: fuzzID, Workflow: fuzzWorkflow, Def: fuzzDef, State: s.state, Now: fuzzNow, MaxEvent: 1 << 20}
			decideCommand(t, s, in, ev)
		}
	})
}

func headerLines(h nats.Header) string {
	var b strings.Builder
	for k, vs := range h {
		for _, v := range vs {
			b.WriteString(k + ": " + v + "\n")
		}
	}
	return b.String()
}

// checkRejection holds the rejection of cmd to its contract: a known code,
// a reason, and a message that can be published.
func checkRejection(t *testing.T, cmd events.Event, code, reason string) {
	t.Helper()
	if strings.TrimSpace(reason) == "" {
		t.Fatalf("a rejection of %s without a reason", cmd.Type)
	}
	switch code {
	case events.CodeInvalid, events.CodeNotFound, events.CodeConflict, events.CodeExpired, events.CodeDamaged, events.CodeForbidden:
	default:
		t.Fatalf("rejection code %q of %s: %s", code, cmd.Type, reason)
	}
	if _, err := rejectionMsg("jetflow/dispatcher", fuzzNow, cmd, &events.CommandRejected{Code: code, Reason: reason}); err != nil {
		t.Fatalf("the rejection of %s cannot be published (%v): it would be retried for ever", cmd.Type, err)
	}
}

// checkStart: a start is valid, or a problem the sender is told.
func checkStart(t *testing.T, ev events.Event) {
	t.Helper()
	p := ev.Data.(*events.StartExecution)
	var def *startcheck.Definition
	if p.Workflow == fuzzWorkflow && p.Version <= 1 {
		def = &startcheck.Definition{Name: fuzzWorkflow, Version: 1, Spec: fuzzDef}
	}
	_, err := startcheck.Check(ev, def, startcheck.Options{MaxPayload: 1 << 20, Now: fuzzNow})
	var problem *startcheck.Problem
	switch {
	case err == nil:
	case errors.As(err, &problem):
		checkRejection(t, ev, problem.Code, problem.Message)
	default:
		t.Fatalf("a start that is neither valid nor refused (dropped without a word): %v", err)
	}
}

// decideCommand decides ev about the execution in state s as the shell
// does (handing the interpreter what it needs; the message stored now) and
// checks the decision.
func decideCommand(t *testing.T, s fuzzState, in interp.Input, ev events.Event) {
	t.Helper()
	ev.Time = sentAt(ev.Time, in.Now)
	decide := deciderFor(ev, s)
	if decide == nil {
		return // reconcile: no command decision, the execution advances
	}
	dec := decideFully(t, in, s, decide)
	what := string(ev.Type) + " on a " + s.name + " execution"
	switch {
	case dec.Err != nil:
		t.Fatalf("%s: the decision cannot be carried out, so the command is dropped without a word: %v", what, dec.Err)
	case dec.Reject != nil:
		checkRejection(t, ev, dec.Reject.Code, dec.Reject.Reason)
	case dec.Retry != "":
		later := in
		later.Now = in.Now.Add(time.Hour)
		if again := decideFully(t, later, s, decide); again.Retry != "" {
			t.Fatalf("%s: handed back (%s), and still an hour later (%s): it would be retried for ever", what, dec.Retry, again.Retry)
		}
	}
}

// deciderFor is the interpreter's decision about the admitted command ev,
// as the shell asks for it.
func deciderFor(ev events.Event, s fuzzState) func(interp.Input) interp.Decision {
	switch p := ev.Data.(type) {
	case *events.SignalExecution:
		cmd := signalCommand(ev, p, ev.Time)
		return func(in interp.Input) interp.Decision { return interp.Signal(in, cmd) }
	case *events.ExecutionAction:
		rec := actionRecord(ev, p)
		if p.Action == events.ActionRepair {
			var first uint64
			if len(s.history) > 0 {
				first = s.history[0].Seq
			}
			cmd := interp.RepairCommand{Key: rec.Command, IgnoreSeq: p.IgnoreSeq, Record: rec, FirstSeq: first}
			return func(in interp.Input) interp.Decision { return interp.Repair(in, cmd) }
		}
		cmd := interp.ActionCommand{Key: rec.Command, Record: rec, From: p.From, Force: p.Force, SentAt: ev.Time}
		return func(in interp.Input) interp.Decision { return interp.Action(in, cmd) }
	case *events.FireTimer:
		return func(in interp.Input) interp.Decision { return interp.Fired(in, p.TimerID, ev.Time) }
	case *events.ExpireExecution:
		cmd := interp.ExpireCommand{LastSeq: p.LastSeq, Rule: p.Rule, Group: p.Group, By: ev.Source}
		return func(in interp.Input) interp.Decision { return interp.Expire(in, cmd) }
	case *events.ClearLock:
		rec := clearRecord(ev, p)
		return func(in interp.Input) interp.Decision {
			var dec interp.Decision
			for _, en := range p.Entries {
				if dec = interp.Clear(in, interp.ClearCommand{Lock: p.Lock, Path: en.Path, Request: en.Request, Record: rec, OnlyEnded: p.OnlyEnded}); dec.Reject != nil || dec.Err != nil {
					return dec
				}
			}
			return dec
		}
	}
	return nil
}

// decideFully decides until the decision needs nothing more, handing the
// interpreter what it asks for, as the shell's decide does.
func decideFully(t *testing.T, in interp.Input, s fuzzState, decide func(interp.Input) interp.Decision) interp.Decision {
	t.Helper()
	for range 16 {
		dec := decide(in)
		switch n := dec.Need.(type) {
		case nil:
			return dec
		case interp.NeedWorkflow:
			if in.Called == nil {
				in.Called = map[interp.CalledRef]*interp.Called{}
			}
			in.Called[n.Ref] = nil
		case interp.NeedHistory:
			in.History = s.history
		case interp.NeedStoredResults:
			in.Stored = map[string]events.Event{}
		case interp.NeedToken:
			in.Token = "fuzz-token"
		case interp.NeedClaim:
			claimed := s.history != nil
			in.Claimed = &claimed
		default:
			t.Fatalf("a need the fuzz target does not know: %T", n)
		}
	}
	t.Fatal("a decision kept asking for more")
	return interp.Decision{}
}

// TestFuzzSeedsAreAdmitted: FuzzCommand's seeds are commands the
// dispatcher takes, so that the fuzzer starts from past the intake.
func TestFuzzSeedsAreAdmitted(t *testing.T) {
	t.Parallel()
	for _, m := range fuzzSeeds(t) {
		ev, why, _ := admit(m.Subject, m.Header, m.Data, fuzzPartitions)
		if why != "" {
			t.Fatalf("%s on %s: %s", ev.Type, m.Subject, why)
		}
		if r := vetCommand(ev); r != nil {
			t.Fatalf("%s on %s: %s", ev.Type, m.Subject, r.Reason)
		}
	}
}

func TestSentAt(t *testing.T) {
	t.Parallel()
	stored := fuzzNow
	for _, c := range []struct {
		name       string
		ce, stored time.Time
		want       time.Time
	}{
		{"Before", stored.Add(-time.Second), stored, stored.Add(-time.Second)},
		{"InTheFuture", stored.Add(24 * 365 * time.Hour), stored, stored},
		{"Unset", time.Time{}, stored, stored},
		{"NotStored", stored.Add(time.Hour), time.Time{}, stored.Add(time.Hour)},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if got := sentAt(c.ce, c.stored); !got.Equal(c.want) {
				t.Fatalf("sentAt(%s, %s) = %s, want %s", c.ce, c.stored, got, c.want)
			}
		})
	}
}
