package events_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
)

var at = time.Date(2026, 3, 14, 15, 9, 26, 535897932, time.UTC)

// samples has one fully populated payload per event type. RawMessage
// fields are compact JSON so that they survive a round trip byte for byte.
func samples() []events.Payload {
	actor := &events.Actor{Subject: "alice", Method: events.ActorAPIKey, KeyID: "0123456789abcdef"}
	action := events.ActionRecord{Action: events.ActionCancel, Reason: "wrong host", RequestedBy: "alice", Actor: actor, Command: "cli#7"}
	ref := events.TaskRef{TaskID: "x1.build.2", ExecutionID: "x1", Workflow: "deploy", StepID: "build",
		Attempt: 2, Token: "tok", Queue: "gpu", Agent: "agent-7", Delivery: 3}
	return []events.Payload{
		&events.ExecutionStarted{Workflow: "deploy", Version: 3, Input: json.RawMessage(`{"env":"prod"}`),
			Steps:      []events.StepRef{{ID: "build", Kind: "exec"}, {ID: "notify", Kind: "http"}},
			Definition: json.RawMessage(`{"name":"deploy"}`), Token: "tok", CommandKey: "cli#1", CommandDigest: "d1", StartedBy: "alice", Actor: actor, APIURL: "http://127.0.0.1:8080",
			WaitAfterFail: true, DryRun: true, Retention: &events.Retention{Rule: "max(5, 24h)", Key: "deploy-prod"}},
		&events.ExecutionSucceeded{Output: json.RawMessage(`[1,2,3]`)},
		&events.ExecutionFailed{Error: "step build: exit status 1", StepID: "build"},
		&events.StepScheduled{StepID: "each[1]/build", Kind: "exec", Attempt: 1, Input: json.RawMessage(`"in"`),
			Retention: &events.Retention{Rule: "forever"}},
		&events.StepSending{StepID: "build", Attempt: 1, TaskID: "x1.build.1", Queue: "default"},
		&events.StepSent{StepID: "build", Attempt: 1, TaskID: "x1.build.1", TaskSeq: 42},
		&events.StepStarted{StepID: "build", Attempt: 1, Agent: "agent-7", Delivery: 2},
		&events.StepSucceeded{StepID: "build", Attempt: 1, Output: json.RawMessage(`{"ok":true}`), SignalID: "s1",
			Vars: map[string]json.RawMessage{"ok": json.RawMessage(`true`)}, Agent: "agent-7", Duration: 1234},
		&events.StepFailed{StepID: "build", Kind: "exec", Attempt: 1, Error: "boom", Final: true, Output: json.RawMessage(`{"code":2}`),
			Agent: "agent-7", Lost: true},
		&events.StartExecution{Workflow: "deploy", Version: 2, Input: json.RawMessage(`{"a":"ü"}`), ExecutionID: "x1",
			WaitAfterFail: true, DryRun: true, Actor: actor},
		&events.ReconcileExecution{ExecutionID: "x1", Workflow: "deploy", Reason: "stuck"},
		&events.Task{TaskID: "x1.build.2", ExecutionID: "x1", Workflow: "deploy", StepID: "build", Attempt: 2,
			Token: "tok", Kind: "exec", Queue: "builders", Spec: json.RawMessage(`{"command":"make"}`)},
		&events.OperationStarted{TaskRef: ref},
		&events.OperationSucceeded{TaskRef: ref, Output: json.RawMessage(`null`), Duration: 99},
		&events.OperationFailed{TaskRef: ref, Error: "agent died", Output: json.RawMessage(`{}`), Lost: true, Final: true},
		&events.CommandRejected{CommandKey: "cli#1", CommandType: events.TypeStartExecution, ExecutionID: "x1",
			Code: events.CodeNotFound, Reason: "no workflow deploy", Field: "workflow", Subject: events.SubjectStart, StreamSeq: 7},
		&events.ExecutionCancelling{ActionRecord: action},
		&events.ExecutionCancelled{ActionRecord: action},
		&events.ExecutionResumed{ActionRecord: action, Token: "tok2", Reset: []string{"build", "each[1]/ping"}},
		&events.ExecutionReplayed{ActionRecord: action, From: events.ReplayLast, Force: true, Point: "each[1]/ping",
			Mode: events.ReplayModeReplay, Token: "tok3", Resume: []string{"a"}, Reopen: []string{"each"}, Reset: []string{"b"},
			Vars: map[string]json.RawMessage{"n": json.RawMessage(`2`)}, Cause: "build/on-error1/again", Automatic: true},
		&events.ExecutionSuspended{Error: "step build: exit status 1", StepID: "build"},
		&events.ResultIgnored{ResultID: "r1", ResultType: events.TypeOperationSucceeded, TaskID: "x1.build.1", StepID: "build",
			Attempt: 1, Agent: "agent-7", Reason: "stale token"},
		&events.StepSkipped{StepID: "each[0]/ping", Kind: "exec", Reason: "condition is false", DryRun: true},
		&events.StepWaiting{StepID: "approve", Attempt: 1, Until: at.Add(time.Hour), Signals: []string{"approve", "reject"}},
		&events.StepRescheduled{StepID: "build", Attempt: 1, NextAttempt: 2, Due: at.Add(2 * time.Second), TimerID: "t-retry-1"},
		&events.VariablesSet{StepID: "set", Vars: map[string]json.RawMessage{"host": json.RawMessage(`"web-1"`), "n": json.RawMessage(`[1,{"a":null}]`)}},
		&events.TimerArmed{TimerID: "t-sleep-1", Purpose: events.TimerSleep, StepID: "nap", Attempt: 1, Due: at.Add(time.Minute)},
		&events.TimerFired{TimerID: "t-sleep-1"},
		&events.SignalReceived{SignalID: "s1", Name: "approve", Data: json.RawMessage(`{"by":"alice"}`), Sender: "cli/alice", Actor: actor},
		&events.SignalExecution{ExecutionID: "x1", Name: "approve", Data: json.RawMessage(`{"by":"alice"}`), Actor: actor},
		&events.FireTimer{ExecutionID: "x1", Workflow: "deploy", TimerID: "t-sleep-1"},
		&events.ExecutionAction{ExecutionID: "x1", Action: events.ActionReplay, Reason: "fixed the host", RequestedBy: "alice",
			From: "build", Force: true, Actor: actor, IgnoreSeq: 17},
		&events.KillOperations{ExecutionID: "x1", Workflow: "deploy", Command: "cli#9", Lift: true},
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

var allTypes = []events.Type{
	events.TypeExecutionStarted, events.TypeExecutionSucceeded, events.TypeExecutionFailed,
	events.TypeStepScheduled, events.TypeStepSending, events.TypeStepSent, events.TypeStepStarted,
	events.TypeStepSucceeded, events.TypeStepFailed, events.TypeStartExecution, events.TypeReconcileExecution,
	events.TypeTask, events.TypeOperationStarted, events.TypeOperationSucceeded, events.TypeOperationFailed,
	events.TypeCommandRejected, events.TypeExecutionCancelling, events.TypeExecutionCancelled,
	events.TypeExecutionResumed, events.TypeExecutionReplayed, events.TypeExecutionSuspended, events.TypeResultIgnored,
	events.TypeStepSkipped, events.TypeStepWaiting, events.TypeStepRescheduled, events.TypeVariablesSet,
	events.TypeTimerArmed, events.TypeTimerFired, events.TypeSignalReceived, events.TypeSignalExecution,
	events.TypeFireTimer, events.TypeExecutionAction, events.TypeKillOperations,
	events.TypeLockRequested, events.TypeLockAcquired, events.TypeLockReleased, events.TypeLockCleared, events.TypeClearLock,
	events.TypeExpireExecution, events.TypeExecutionExpired, events.TypeExecutionRepaired,
}

func sampleEvent(p events.Payload) events.Event {
	ev := events.New("jetflow/dispatcher", "x1", "deploy", at, p)
	ev.PrevSeq = 41
	return ev
}

func requireSameEvent(t *testing.T, want, got events.Event) {
	t.Helper()
	require.Equal(t, want.ID, got.ID)
	require.Equal(t, want.Type, got.Type)
	require.Equal(t, want.Source, got.Source)
	require.Equal(t, want.Subject, got.Subject)
	require.Equal(t, want.Workflow, got.Workflow)
	require.True(t, want.Time.Equal(got.Time), "time %s != %s", want.Time, got.Time)
	require.Equal(t, time.UTC, got.Time.Location())
	require.Equal(t, want.Ignorable, got.Ignorable)
	require.Equal(t, want.PrevSeq, got.PrevSeq)
	require.Zero(t, got.Seq, "Seq comes from the stream, not the message")
	require.Equal(t, want.Data, got.Data)
	require.JSONEq(t, mustJSON(t, want.Data), string(got.Raw))
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestSamplesCoverEveryType(t *testing.T) {
	t.Parallel()

	seen := map[events.Type]bool{}
	for _, p := range samples() {
		require.False(t, seen[p.EventType()], "two samples of %s", p.EventType())
		seen[p.EventType()] = true
	}
	for _, typ := range allTypes {
		require.True(t, seen[typ], "no sample of %s", typ)
	}
	require.Len(t, seen, len(allTypes))
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()

	for _, p := range samples() {
		t.Run(typeName(p.EventType()), func(t *testing.T) {
			t.Parallel()

			ev := sampleEvent(p)
			ev.Ignorable = true

			t.Run("Binary", func(t *testing.T) {
				t.Parallel()

				msg, err := events.Encode("jf.events.deploy.x1", ev)
				require.NoError(t, err)
				require.Equal(t, "jf.events.deploy.x1", msg.Subject)
				require.Equal(t, string(ev.Type), msg.Header.Get("ce-type"))
				require.Equal(t, ev.ID, msg.Header.Get("ce-id"))
				require.Equal(t, "deploy", msg.Header.Get("ce-workflow"))
				require.Equal(t, "41", msg.Header.Get("ce-prevseq"))
				require.True(t, json.Valid(msg.Data), "binary mode data is the JSON payload: %s", msg.Data)

				got, err := events.Decode(msg.Header, msg.Data)
				require.NoError(t, err)
				requireSameEvent(t, ev, got)
			})

			t.Run("Structured", func(t *testing.T) {
				t.Parallel()

				b, err := events.EncodeStructured(ev)
				require.NoError(t, err)
				for _, hdr := range []nats.Header{nil, {}} {
					got, err := events.Decode(hdr, b)
					require.NoError(t, err)
					requireSameEvent(t, ev, got)
				}
				got, err := events.Decode(nats.Header{"Content-Type": []string{"application/cloudevents+json"}}, b)
				require.NoError(t, err)
				requireSameEvent(t, ev, got)
			})
		})
	}
}

func TestRoundTripOptionalAttributes(t *testing.T) {
	t.Parallel()

	ev := events.Event{ID: "e1", Type: events.TypeExecutionSucceeded, Source: "src", Time: at,
		Data: &events.ExecutionSucceeded{}}
	msg, err := events.Encode("jf.events.w.x", ev)
	require.NoError(t, err)
	require.Empty(t, msg.Header.Get("ce-subject"))
	require.Empty(t, msg.Header.Get("ce-workflow"))
	require.Empty(t, msg.Header.Get("ce-ignorable"))
	require.Empty(t, msg.Header.Get("ce-prevseq"))

	got, err := events.Decode(msg.Header, msg.Data)
	require.NoError(t, err)
	requireSameEvent(t, ev, got)
	require.False(t, got.Ignorable)
}

func TestNew(t *testing.T) {
	t.Parallel()

	local := at.In(time.FixedZone("X", 3600))
	a := events.New("s", "x1", "wf", local, &events.StepStarted{StepID: "a"})
	b := events.New("s", "x1", "wf", local, &events.StepStarted{StepID: "a"})
	require.NotEqual(t, a.ID, b.ID)
	require.NotEmpty(t, a.ID)
	require.Equal(t, events.TypeStepStarted, a.Type)
	require.Equal(t, time.UTC, a.Time.Location())
	require.True(t, at.Equal(a.Time))
}

func TestDecodeMalformed(t *testing.T) {
	t.Parallel()

	valid, err := events.Encode("jf.events.w.x", sampleEvent(&events.StepStarted{StepID: "a", Attempt: 1}))
	require.NoError(t, err)
	without := func(key string) nats.Header {
		h := nats.Header{}
		for k, v := range valid.Header {
			if k != key {
				h[k] = v
			}
		}
		return h
	}
	with := func(key, value string) nats.Header {
		h := without(key)
		h[key] = []string{value}
		return h
	}

	tests := []struct {
		name   string
		header nats.Header
		data   []byte
	}{
		{"Garbage", nil, []byte("garbage \x00\xff")},
		{"Empty", nil, nil},
		{"EmptyHeader", nats.Header{}, []byte(`{"step_id":"a"}`)},
		{"BrokenStructuredJSON", nil, []byte(`{"specversion":"1.0","id":`)},
		{"StructuredMissingID", nil, []byte(`{"specversion":"1.0","type":"io.jetflow.step.started","source":"s"}`)},
		{"StructuredBadSpecVersion", nil, []byte(`{"specversion":"9.9","id":"1","type":"io.jetflow.step.started","source":"s"}`)},
		{"BinaryMissingID", without("ce-id"), valid.Data},
		{"BinaryMissingSource", without("ce-source"), valid.Data},
		{"BinaryMissingType", without("ce-type"), valid.Data},
		{"BinaryBadTime", with("ce-time", "yesterday"), valid.Data},
		{"BinaryDataNotJSON", valid.Header, []byte("{not json")},
		{"BinaryDataWrongShape", valid.Header, []byte(`{"attempt":"one"}`)},
		{"BinaryDataNotJSONContentType", with("ce-datacontenttype", "text/plain"), valid.Data},
		{"BinaryEmptyHeaderValue", with("ce-id", ""), valid.Data},
		{"BinaryHeaderWithoutValues", nats.Header{"ce-specversion": {"1.0"}, "ce-id": {}}, valid.Data},
		{"BinaryUnknownSpecVersion", with("ce-specversion", "9.9"), valid.Data},
		{"BinaryPrevSeqNotANumber", with("ce-prevseq", "seven"), valid.Data},
		{"BinaryPrevSeqNegative", with("ce-prevseq", "-1"), valid.Data},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			ev, err := events.Decode(tt.header, tt.data)
			require.Error(t, err)
			require.ErrorIs(t, err, events.ErrMalformed)
			require.NotErrorIs(t, err, events.ErrUnknownType)
			require.Nil(t, ev.Data)
		})
	}
}

func TestDecodeUnknownType(t *testing.T) {
	t.Parallel()

	ev := events.Event{ID: "e1", Type: "io.jetflow.step.paused", Source: "future/dispatcher", Subject: "x1",
		Workflow: "deploy", Time: at, Ignorable: true, Raw: json.RawMessage(`{"step_id":"a"}`)}

	msg, err := events.Encode("jf.events.deploy.x1", ev)
	require.NoError(t, err)
	structured, err := events.EncodeStructured(ev)
	require.NoError(t, err)

	for name, in := range map[string]struct {
		header nats.Header
		data   []byte
	}{
		"Binary":     {msg.Header, msg.Data},
		"Structured": {nil, structured},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()

			got, err := events.Decode(in.header, in.data)
			require.ErrorIs(t, err, events.ErrUnknownType)
			require.NotErrorIs(t, err, events.ErrMalformed)
			require.Nil(t, got.Data)
			require.Equal(t, ev.ID, got.ID)
			require.Equal(t, ev.Type, got.Type)
			require.Equal(t, ev.Subject, got.Subject)
			require.Equal(t, ev.Workflow, got.Workflow)
			require.True(t, got.Ignorable)
			require.JSONEq(t, `{"step_id":"a"}`, string(got.Raw))
		})
	}
}

func TestEncodeInvalid(t *testing.T) {
	t.Parallel()

	_, err := events.Encode("s", events.Event{Type: events.TypeStepStarted, Source: "s", Data: &events.StepStarted{}})
	require.ErrorIs(t, err, events.ErrMalformed, "an event without id is not a CloudEvent")
	_, err = events.EncodeStructured(events.Event{ID: "1", Type: events.TypeStepStarted, Data: &events.StepStarted{}})
	require.ErrorIs(t, err, events.ErrMalformed, "an event without source is not a CloudEvent")
}

func TestIsTerminal(t *testing.T) {
	t.Parallel()

	for _, typ := range allTypes {
		want := typ == events.TypeExecutionSucceeded || typ == events.TypeExecutionFailed || typ == events.TypeExecutionCancelled
		require.Equal(t, want, typ.IsTerminal(), string(typ))
	}
}

func TestValidWorkflowName(t *testing.T) {
	t.Parallel()

	for name, want := range map[string]bool{
		"a":                           true,
		"deploy":                      true,
		"Deploy-prod_2":               true,
		"a" + strings.Repeat("b", 63): true,
		"a" + strings.Repeat("b", 64): false,
		"":                            false,
		"2deploy":                     false,
		"-deploy":                     false,
		"_deploy":                     false,
		"de.ploy":                     false,
		"de*":                         false,
		"de>":                         false,
		"de ploy":                     false,
		"deploy\n":                    false,
		"\ndeploy":                    false,
		"déploy":                      false,
	} {
		require.Equal(t, want, events.ValidWorkflowName(name), "%q", name)
	}
}

func TestValidExecutionID(t *testing.T) {
	t.Parallel()

	for id, want := range map[string]bool{
		"a":                            true,
		"1":                            true,
		"0abc":                         true,
		"x1-build_2":                   true,
		strings.Repeat("a", 128):       true,
		strings.Repeat("a", 129):       false,
		"":                             false,
		"-x":                           false,
		"_x":                           false,
		"x.y":                          false,
		"x*":                           false,
		">":                            false,
		"x y":                          false,
		"x\n":                          false,
		"x\x00":                        false,
		"ñ":                            false,
		events.DerivedExecutionID("k"): true,
	} {
		require.Equal(t, want, events.ValidExecutionID(id), "%q", id)
	}
}

func TestDerivedExecutionID(t *testing.T) {
	t.Parallel()

	key := events.CommandKey("cli/alice", "42")
	require.Equal(t, "cli/alice#42", key)
	id := events.DerivedExecutionID(key)
	require.Equal(t, id, events.DerivedExecutionID(key))
	require.True(t, strings.HasPrefix(id, "ce-"))
	require.Len(t, id, len("ce-")+24)
	require.True(t, events.ValidExecutionID(id))
	require.NotEqual(t, id, events.DerivedExecutionID(events.CommandKey("cli/alice", "43")))
	require.NotEqual(t, id, events.DerivedExecutionID(events.CommandKey("cli/bob", "42")))
	// Pinned: derived ids are stored forever, so the derivation must never change.
	require.Equal(t, "ce-"+"b5bb9d8014a0f9b1d61e21e7", events.DerivedExecutionID("foo\n"))
}

func TestSubjects(t *testing.T) {
	t.Parallel()

	require.Equal(t, "jf.events.deploy.x1", events.ExecutionSubject("deploy", "x1"))
	require.Equal(t, "jf.events.deploy.*", events.WorkflowSubjects("deploy"))
	require.Equal(t, "jf.events.*.x1", events.ExecutionFilter("x1"))
	require.Equal(t, "jf.tasks.builders", events.TaskSubject("builders"))
	require.Equal(t, "jf.results.gpu.x1", events.ResultSubject("gpu", "x1"))
	require.Equal(t, "jf.results.*.*.x1", events.ExecutionResults("x1"))
	require.Equal(t, "jf.results.gpu.7.x1", events.StoredResultSubject("gpu", 7, "x1"))
	require.Equal(t, "jf.results.gpu.*.x1", events.QueueResults("gpu", "x1"))
	require.Equal(t, "jf.timers.3.x1", events.PartitionTimerSubject(3, "x1"))
	require.Equal(t, "jf.inbox.3.x1", events.InboxSubject(3, "x1"))
	require.Equal(t, "x1.build.3", events.TaskID("x1", "build", 3))

	r := events.RejectionSubject("cli#1")
	require.Equal(t, r, events.RejectionSubject("cli#1"))
	require.NotEqual(t, r, events.RejectionSubject("cli#2"))
	require.True(t, strings.HasPrefix(r, events.RejectionsPrefix+"."))
	require.NotContains(t, strings.TrimPrefix(r, events.RejectionsPrefix+"."), ".")
}

func TestTaskRef(t *testing.T) {
	t.Parallel()

	task := events.Task{TaskID: "x1.a.1", ExecutionID: "x1", Workflow: "wf", StepID: "a", Attempt: 1, Token: "t", Kind: "noop", Queue: "q"}
	require.Equal(t, events.TaskRef{TaskID: "x1.a.1", ExecutionID: "x1", Workflow: "wf", StepID: "a", Attempt: 1,
		Token: "t", Queue: "q", Agent: "ag", Delivery: 2}, task.Ref("ag", 2))
}

func typeName(t events.Type) string {
	var b strings.Builder
	up := true
	for _, r := range strings.TrimPrefix(string(t), "io.jetflow.") {
		if r == '.' {
			up = true
			continue
		}
		if up {
			r = []rune(strings.ToUpper(string(r)))[0]
			up = false
		}
		b.WriteRune(r)
	}
	return b.String()
}

// headerText and parseHeader give the fuzzer headers as plain text, one
// "Key: value" per line.
func headerText(h nats.Header) string {
	var b strings.Builder
	for k, vs := range h {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\n", k, v)
		}
	}
	return b.String()
}

func parseHeader(s string) nats.Header {
	if s == "" {
		return nil
	}
	h := nats.Header{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		h[k] = append(h[k], strings.TrimSpace(v))
	}
	return h
}

func FuzzDecode(f *testing.F) {
	for _, p := range samples() {
		ev := sampleEvent(p)
		msg, err := events.Encode("jf.events.deploy.x1", ev)
		require.NoError(f, err)
		f.Add(headerText(msg.Header), msg.Data)
		b, err := events.EncodeStructured(ev)
		require.NoError(f, err)
		f.Add("", b)
	}
	unknown, err := events.Encode("s", events.Event{ID: "1", Type: "x.unknown", Source: "s", Raw: json.RawMessage(`{}`)})
	require.NoError(f, err)
	f.Add(headerText(unknown.Header), unknown.Data)
	f.Add("", []byte("garbage"))
	f.Add("ce-specversion: 1.0\nce-id: 1\nce-type: io.jetflow.task\nce-source: s\nce-ignorable: TRUE", []byte(`{"attempt":1}`))

	f.Fuzz(func(t *testing.T, header string, data []byte) {
		ev, err := events.Decode(parseHeader(header), data)
		if err != nil {
			require.True(t, errors.Is(err, events.ErrMalformed) || errors.Is(err, events.ErrUnknownType),
				"unexpected error: %v", err)
			if errors.Is(err, events.ErrUnknownType) {
				require.Nil(t, ev.Data)
			}
			return
		}
		require.NotNil(t, ev.Data)
		require.Equal(t, ev.Type, ev.Data.EventType())

		msg, err := events.Encode("jf.events.w.x", ev)
		require.NoError(t, err, "re-encode %+v", ev)
		again, err := events.Decode(msg.Header, msg.Data)
		require.NoError(t, err)
		require.Equal(t, ev.Type, again.Type)
		require.Equal(t, ev.ID, again.ID)
		require.Equal(t, ev.Ignorable, again.Ignorable)
		require.Equal(t, ev.PrevSeq, again.PrevSeq)
		// RawMessage fields are compacted when encoded; compare the JSON.
		require.Equal(t, mustJSON(t, ev.Data), mustJSON(t, again.Data))

		structured, err := events.EncodeStructured(ev)
		require.NoError(t, err)
		again, err = events.Decode(nil, structured)
		require.NoError(t, err)
		require.Equal(t, ev.Type, again.Type)
		require.True(t, bytes.Equal([]byte(mustJSON(t, ev.Data)), []byte(mustJSON(t, again.Data))))
	})
}
