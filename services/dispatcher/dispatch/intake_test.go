package dispatch

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/partition"
)

// TestCommandActor: the api's subjects must carry an actor; every other
// command subject must not, and is attributed to the role that may
// publish there.
func TestCommandActor(t *testing.T) {
	t.Parallel()

	alice := &events.Actor{Subject: "alice", Method: events.ActorAPIKey, KeyID: "k1"}
	for _, tt := range []struct {
		name    string
		subject string
		payload events.Payload
		want    *events.Actor
		why     string
	}{
		{"APIStart", bus.SubjectAPIStart, &events.StartExecution{Actor: alice}, alice, ""},
		{"APISignal", bus.SubjectAPISignal, &events.SignalExecution{Actor: alice}, alice, ""},
		{"APIAction", bus.SubjectAPIAction, &events.ExecutionAction{Actor: alice}, alice, ""},
		{"APIClearLock", bus.SubjectAPIClearLock, &events.ClearLock{Actor: alice}, alice, ""},
		{"APIWithoutActor", bus.SubjectAPIAction, &events.ExecutionAction{}, nil, "carries the actor the api authenticated"},
		{"APIWithBadActor", bus.SubjectAPIAction, &events.ExecutionAction{Actor: &events.Actor{Method: events.ActorOIDC}}, nil, "subject must be"},
		{"ClientStart", bus.SubjectStart, &events.StartExecution{}, &events.Actor{Subject: "client", Method: events.ActorNATS}, ""},
		{"ClientSignal", bus.SubjectSignal, &events.SignalExecution{}, &events.Actor{Subject: "client", Method: events.ActorNATS}, ""},
		{"ClientAction", bus.SubjectAction, &events.ExecutionAction{}, &events.Actor{Subject: "client", Method: events.ActorNATS}, ""},
		{"JanitorClearLock", bus.SubjectClearLock, &events.ClearLock{}, &events.Actor{Subject: "janitor", Method: events.ActorNATS}, ""},
		{"ForgedOnAction", bus.SubjectAction, &events.ExecutionAction{Actor: alice}, nil, "actor is set by the api"},
		{"ForgedOnStart", bus.SubjectStart, &events.StartExecution{Actor: alice}, nil, "actor is set by the api"},
		{"ForgedOnClearLock", bus.SubjectClearLock, &events.ClearLock{Actor: alice}, nil, "actor is set by the api"},
		{"Reconcile", bus.SubjectReconcile, &events.ReconcileExecution{}, nil, ""},
		{"Expire", bus.SubjectExpire, &events.ExpireExecution{}, nil, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, why := commandActor(tt.subject, tt.payload)
			if tt.why != "" {
				require.Contains(t, why, tt.why)
				require.Nil(t, got)
				return
			}
			require.Empty(t, why)
			require.Equal(t, tt.want, got)
		})
	}
}

// TestMisroutedNamesTheClientSubject: a command on the wrong subject is
// told the client's subject for its type, whatever the map's order.
func TestMisroutedNamesTheClientSubject(t *testing.T) {
	t.Parallel()
	for range 20 {
		why := misrouted(bus.SubjectSignal, events.Event{Type: events.TypeStartExecution}, 16)
		require.Contains(t, why, "publish it on "+bus.SubjectStart)
	}
	require.Empty(t, misrouted(bus.SubjectAPIStart, events.Event{Type: events.TypeStartExecution}, 16))
	require.Contains(t, misrouted(bus.SubjectAPISignal, events.Event{Type: events.TypeStartExecution}, 16), "takes "+string(events.TypeSignalExecution))
}

// TestAdmitRefusesForgedChains: chain, run and continued_from link a
// continue-as-new step's successor to its chain; only the dispatcher
// sets them (its own start, straight into the inbox), so a client's start
// that carries them is refused, and the dispatcher's is admitted.
func TestAdmitRefusesForgedChains(t *testing.T) {
	t.Parallel()
	start := &events.StartExecution{Workflow: "countdown", ExecutionID: "cd-run2", Input: []byte(`{"n":1}`),
		Chain: "cd", Run: 2, ContinuedFrom: "cd"}
	ev := events.New("urn:test", "cd-run2", "countdown", time.Now(), start)
	msg, err := bus.Encode(bus.SubjectStart, ev)
	require.NoError(t, err)
	_, why, _ := admit(bus.SubjectStart, msg.Header, msg.Data, 16)
	require.Contains(t, why, "chain, run and continued_from are set by the dispatcher only")

	own := events.New("jetflow/dispatcher", "cd-run2", "countdown", time.Now(), start)
	own.ID = "continue-cd-run2"
	subject := inboxSubjectOf(own, 16)
	msg, err = bus.Encode(subject, own)
	require.NoError(t, err)
	got, why, _ := admit(subject, msg.Header, msg.Data, 16)
	require.Empty(t, why)
	require.Equal(t, "cd", got.Data.(*events.StartExecution).Chain)
}

// TestUnhandledNamesTheCommand: a rejected message is keyed by its
// CloudEvent source and id as its mode says: a binary message's headers
// (never its payload's members); a structured one's decoded attributes,
// or its members when it could not be decoded (never a stray header);
// else by where it is stored. A name too long for a rejection is not
// repeated.
func TestUnhandledNamesTheCommand(t *testing.T) {
	t.Parallel()
	binary := nats.Header{"ce-specversion": {"1.0"}, "ce-source": {"tour"}, "ce-type": {string(events.TypeStartExecution)}}
	for _, c := range []struct {
		name   string
		header nats.Header
		data   string
		ev     events.Event
		key    string
	}{
		{"BinaryWithoutIDIgnoresThePayload", binary, `{"workflow":"hello","id":"exec-7","source":"elsewhere"}`, events.Event{}, bus.SubjectStart + "#seq-9"},
		{"BinaryWithMsgID", nats.Header{"ce-specversion": {"1.0"}, "ce-source": {"tour"}, "Nats-Msg-Id": {"m-1"}}, `{}`, events.Event{}, "tour#m-1"},
		{"StructuredUndecodable", nats.Header{"ce-id": {"stray"}}, `{"specversion":"2.0","id":"sv-1","source":"tour"}`, events.Event{}, "tour#sv-1"},
		{"StructuredDecoded", nats.Header{}, `{}`, events.Event{ID: "d-1", Source: "tour"}, "tour#d-1"},
		{"PlainMessage", nats.Header{}, `{"workflow":"hello"}`, events.Event{}, bus.SubjectStart + "#seq-9"},
		{"TooLong", nats.Header{}, `{"id":"` + strings.Repeat("x", 2000) + `","source":"tour"}`, events.Event{}, bus.SubjectStart + "#seq-9"},
	} {
		cmd, subject, answer := unhandled(bus.SubjectStart, c.header, []byte(c.data), c.ev, 9)
		require.True(t, answer, c.name)
		require.Equal(t, bus.SubjectStart, subject, c.name)
		require.Equal(t, c.key, events.CommandKey(cmd.Source, cmd.ID), c.name)
	}
}

// TestTimerSubjectsTakeFiringsAndNotices: a timer's subject takes its
// firing (and the notices development builds before the notices'
// subjects set there), a notices subject its notice (docs/adr/0019), each on its
// execution's partition's subject only, and no other command.
func TestTimerSubjectsTakeFiringsAndNotices(t *testing.T) {
	t.Parallel()
	const n = 16
	p := partition.Of("x1", n)
	timers, otherTimers := bus.PartitionTimerSubject(p, "x1"), bus.PartitionTimerSubject((p+1)%n, "x1")
	notices, otherNotices := bus.PartitionNoticeSubject(p, "x1"), bus.PartitionNoticeSubject((p+1)%n, "x1")
	fire := &events.FireTimer{ExecutionID: "x1", Workflow: "wf", TimerID: "t1"}
	notice := &events.TimerNotice{ExecutionID: "x1", Workflow: "wf", TimerID: "t1", Due: time.Now()}
	signal := &events.SignalExecution{ExecutionID: "x1", Name: "go"}
	for _, c := range []struct {
		subject string
		p       events.Payload
		want    string // what the refusal says ("": taken)
	}{
		{timers, fire, ""},
		{bus.TimerSubject("x1"), fire, ""}, // armed before partitions
		{otherTimers, fire, "it belongs on " + timers},
		{notices, notice, ""},
		{otherNotices, notice, "it belongs on " + notices},
		{timers, notice, ""}, // set on the timers' subject by earlier builds
		{otherTimers, notice, "it belongs on " + timers},
		{notices, fire, "notices subjects take " + string(events.TypeTimerNotice) + " only"},
		{timers, signal, "timer subjects take " + string(events.TypeFireTimer) + " only"},
		{notices, signal, "notices subjects take " + string(events.TypeTimerNotice) + " only"},
	} {
		got := misrouted(c.subject, events.Event{Type: c.p.EventType(), Data: c.p}, n)
		if c.want == "" {
			require.Empty(t, got, "%s on %s", c.p.EventType(), c.subject)
			continue
		}
		require.Contains(t, got, c.want, "%s on %s", c.p.EventType(), c.subject)
	}
}
