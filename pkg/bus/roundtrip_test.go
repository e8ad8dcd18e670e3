package bus_test

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

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/events/eventstest"
)

// The codec's round trips: every sample event through binary and
// structured mode, malformed and unknown input, and the fuzzer.

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

func TestRoundTrip(t *testing.T) {
	t.Parallel()

	for _, p := range eventstest.Samples() {
		t.Run(typeName(p.EventType()), func(t *testing.T) {
			t.Parallel()

			ev := eventstest.Event(p)
			ev.Ignorable = true

			t.Run("Binary", func(t *testing.T) {
				t.Parallel()

				msg, err := bus.Encode("jf.events.deploy.x1", ev)
				require.NoError(t, err)
				require.Equal(t, "jf.events.deploy.x1", msg.Subject)
				require.Equal(t, string(ev.Type), msg.Header.Get("ce-type"))
				require.Equal(t, ev.ID, msg.Header.Get("ce-id"))
				require.Equal(t, "deploy", msg.Header.Get("ce-workflow"))
				require.Equal(t, "41", msg.Header.Get("ce-prevseq"))
				require.True(t, json.Valid(msg.Data), "binary mode data is the JSON payload: %s", msg.Data)

				got, err := bus.Decode(msg.Header, msg.Data)
				require.NoError(t, err)
				requireSameEvent(t, ev, got)
			})

			t.Run("Structured", func(t *testing.T) {
				t.Parallel()

				b, err := events.EncodeStructured(ev)
				require.NoError(t, err)
				for _, hdr := range []nats.Header{nil, {}} {
					got, err := bus.Decode(hdr, b)
					require.NoError(t, err)
					requireSameEvent(t, ev, got)
				}
				got, err := bus.Decode(nats.Header{"Content-Type": []string{"application/cloudevents+json"}}, b)
				require.NoError(t, err)
				requireSameEvent(t, ev, got)
			})
		})
	}
}

func TestRoundTripOptionalAttributes(t *testing.T) {
	t.Parallel()

	ev := events.Event{ID: "e1", Type: events.TypeExecutionSucceeded, Source: "src", Time: eventstest.At,
		Data: &events.ExecutionSucceeded{}}
	msg, err := bus.Encode("jf.events.w.x", ev)
	require.NoError(t, err)
	require.Empty(t, msg.Header.Get("ce-subject"))
	require.Empty(t, msg.Header.Get("ce-workflow"))
	require.Empty(t, msg.Header.Get("ce-ignorable"))
	require.Empty(t, msg.Header.Get("ce-prevseq"))

	got, err := bus.Decode(msg.Header, msg.Data)
	require.NoError(t, err)
	requireSameEvent(t, ev, got)
	require.False(t, got.Ignorable)
}

func TestDecodeMalformed(t *testing.T) {
	t.Parallel()

	valid, err := bus.Encode("jf.events.w.x", eventstest.Event(&events.StepStarted{StepID: "a", Attempt: 1}))
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

			ev, err := bus.Decode(tt.header, tt.data)
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
		Workflow: "deploy", Time: eventstest.At, Ignorable: true, Raw: json.RawMessage(`{"step_id":"a"}`)}

	msg, err := bus.Encode("jf.events.deploy.x1", ev)
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

			got, err := bus.Decode(in.header, in.data)
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

	_, err := bus.Encode("s", events.Event{Type: events.TypeStepStarted, Source: "s", Data: &events.StepStarted{}})
	require.ErrorIs(t, err, events.ErrMalformed, "an event without id is not a CloudEvent")
	_, err = events.EncodeStructured(events.Event{ID: "1", Type: events.TypeStepStarted, Data: &events.StepStarted{}})
	require.ErrorIs(t, err, events.ErrMalformed, "an event without source is not a CloudEvent")
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
	for _, p := range eventstest.Samples() {
		ev := eventstest.Event(p)
		msg, err := bus.Encode("jf.events.deploy.x1", ev)
		require.NoError(f, err)
		f.Add(headerText(msg.Header), msg.Data)
		b, err := events.EncodeStructured(ev)
		require.NoError(f, err)
		f.Add("", b)
	}
	unknown, err := bus.Encode("s", events.Event{ID: "1", Type: "x.unknown", Source: "s", Raw: json.RawMessage(`{}`)})
	require.NoError(f, err)
	f.Add(headerText(unknown.Header), unknown.Data)
	f.Add("", []byte("garbage"))
	f.Add("ce-specversion: 1.0\nce-id: 1\nce-type: io.jetflow.task\nce-source: s\nce-ignorable: TRUE", []byte(`{"attempt":1}`))

	f.Fuzz(func(t *testing.T, header string, data []byte) {
		ev, err := bus.Decode(parseHeader(header), data)
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

		msg, err := bus.Encode("jf.events.w.x", ev)
		require.NoError(t, err, "re-encode %+v", ev)
		again, err := bus.Decode(msg.Header, msg.Data)
		require.NoError(t, err)
		require.Equal(t, ev.Type, again.Type)
		require.Equal(t, ev.ID, again.ID)
		require.Equal(t, ev.Ignorable, again.Ignorable)
		require.Equal(t, ev.PrevSeq, again.PrevSeq)
		// RawMessage fields are compacted when encoded; compare the JSON.
		require.Equal(t, mustJSON(t, ev.Data), mustJSON(t, again.Data))

		structured, err := events.EncodeStructured(ev)
		require.NoError(t, err)
		again, err = bus.Decode(nil, structured)
		require.NoError(t, err)
		require.Equal(t, ev.Type, again.Type)
		require.True(t, bytes.Equal([]byte(mustJSON(t, ev.Data)), []byte(mustJSON(t, again.Data))))
	})
}

// TestLockEventsRoundTrip covers the lock and the expiry events.
func TestLockEventsRoundTrip(t *testing.T) {
	t.Parallel()

	for _, p := range []events.Payload{
		&events.LockRequested{Lock: "apt-web-1", Path: "install", Limit: 3},
		&events.LockAcquired{Lock: "apt-web-1", Path: "install"},
		&events.LockReleased{Lock: "db", Reason: "the execution ends"},
		&events.LockCleared{ActionRecord: events.ActionRecord{Action: "clear-lock", Reason: "stuck", RequestedBy: "alice", Command: "cli#1"},
			Lock: "db", Path: "each[2]/blk"},
		&events.ClearLock{Lock: "db", Entries: []events.LockEntry{{ExecutionID: "x1", Workflow: "deploy", Path: "blk", Request: 2}},
			OnlyEnded: true, Reason: "holder ended", RequestedBy: "jetflow/janitor"},
		&events.ExpireExecution{ExecutionID: "x1", Workflow: "deploy", LastSeq: 41, Rule: "3", Group: "deploy"},
		&events.ExecutionExpired{Rule: "3", Group: "deploy", RequestedBy: "jetflow/janitor"},
	} {
		t.Run(typeName(p.EventType()), func(t *testing.T) {
			t.Parallel()
			ev := eventstest.Event(p)
			msg, err := bus.Encode("jf.events.deploy.x1", ev)
			require.NoError(t, err)
			require.Equal(t, string(p.EventType()), msg.Header.Get("ce-type"))
			got, err := bus.Decode(msg.Header, msg.Data)
			require.NoError(t, err)
			requireSameEvent(t, ev, got)
		})
	}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}
