package bus

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
)

func codecSamples() []events.Event {
	at := time.Date(2026, 11, 21, 16, 9, 22, 123456789, time.UTC)
	payloads := []events.Payload{
		&events.ExecutionStarted{Workflow: "wf", Version: 2, Input: json.RawMessage(`{"a":[1,2]}`), Steps: []events.StepRef{{ID: "s", Kind: "exec"}},
			Definition: json.RawMessage(`{"name":"wf"}`), Token: "t", CommandKey: "src#1", StartedBy: "src"},
		&events.ExecutionSucceeded{}, &events.ExecutionFailed{Error: "boom \"quoted\" <html>", StepID: "s"},
		&events.StepScheduled{StepID: "s", Attempt: 1}, &events.StepSending{StepID: "s", Attempt: 1, TaskID: "e.s.1", Queue: "q"},
		&events.StepSent{StepID: "s", Attempt: 1, TaskID: "e.s.1", TaskSeq: 9}, &events.StepStarted{StepID: "s", Attempt: 3, Agent: "a", Delivery: 2},
		&events.StepSucceeded{StepID: "s", Attempt: 1, Output: json.RawMessage(`{"stdout":"é\n"}`), Duration: 5}, &events.StepFailed{StepID: "s", Attempt: 1, Error: "x"},
		&events.StartExecution{Workflow: "wf", ExecutionID: "id"}, &events.ReconcileExecution{ExecutionID: "id", Workflow: "wf"},
		&events.Task{TaskID: "e.s.1", ExecutionID: "e", Spec: json.RawMessage(`{"kind":"noop"}`)},
		&events.OperationStarted{TaskRef: events.TaskRef{TaskID: "t"}}, &events.OperationSucceeded{TaskRef: events.TaskRef{TaskID: "t"}, Output: json.RawMessage(`[1]`)},
		&events.OperationFailed{TaskRef: events.TaskRef{TaskID: "t"}, Error: "e"}, &events.CommandRejected{Code: events.CodeConflict, Reason: "r"},
	}
	var out []events.Event
	for i, p := range payloads {
		ev := events.Event{ID: "id-" + string(rune('a'+i)), Type: p.EventType(), Source: "jetflow/dispatcher", Data: p}
		switch i % 4 {
		case 0:
			ev.Subject, ev.Workflow, ev.Time, ev.PrevSeq = "exec-1", "wf", at, uint64(i+1)
		case 1:
			ev.Time, ev.Ignorable = at.Add(time.Duration(i)), true
		case 2:
			ev.Source, ev.Subject = "urn:example:orders", "x"
			// The distributed-tracing extension, with and without a state.
			ev.TraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
			if i%8 == 2 {
				ev.TraceState = "vendor=a,other=b"
			}
		case 3:
			ev.Source, ev.Time = "https://example.com/a?b=c", at.Truncate(time.Second)
		}
		out = append(out, ev)
	}
	return out
}

// TestDirectCodecMatchesSDK checks that the direct encoder writes exactly
// what the sdk-go binding writes, and that both decoders read both
// outputs to the same event.
func TestDirectCodecMatchesSDK(t *testing.T) {
	t.Parallel()
	for _, ev := range codecSamples() {
		fast, ok := fastEncode("subj", ev)
		require.True(t, ok, ev.Type)
		ref, err := encodeSDK("subj", ev)
		require.NoError(t, err)
		require.Equal(t, ref.Header, fast.Header, ev.Type)
		require.Equal(t, string(ref.Data), string(fast.Data), ev.Type)

		viaFast, ok := fastDecode(normalizeHeader(fast.Header), fast.Data)
		require.True(t, ok, ev.Type)
		viaSDK, err := decodeSDK(normalizeHeader(ref.Header), ref.Data)
		require.NoError(t, err)
		requireSameEvent(t, viaSDK, viaFast)
		require.Equal(t, ev.Data, viaFast.Data)
	}
}

func requireSameEvent(t *testing.T, want, got events.Event) {
	t.Helper()
	require.Equal(t, want.ID, got.ID)
	require.Equal(t, want.Type, got.Type)
	require.Equal(t, want.Source, got.Source)
	require.Equal(t, want.Subject, got.Subject)
	require.Equal(t, want.Workflow, got.Workflow)
	require.True(t, want.Time.Equal(got.Time), "%s != %s", want.Time, got.Time)
	require.Equal(t, want.Ignorable, got.Ignorable)
	require.Equal(t, want.PrevSeq, got.PrevSeq)
	require.Equal(t, want.TraceParent, got.TraceParent)
	require.Equal(t, want.TraceState, got.TraceState)
	require.True(t, reflect.DeepEqual(want.Data, got.Data), "%#v != %#v", want.Data, got.Data)
	require.JSONEq(t, string(want.Raw), string(got.Raw))
}

// FuzzDirectDecode feeds arbitrary values for every header the direct
// decoder knows: whenever it accepts a message, sdk-go must accept it too
// and read the same event.
func FuzzDirectDecode(f *testing.F) {
	for _, ev := range codecSamples() {
		m, _ := fastEncode("s", ev)
		f.Add(m.Header.Get("ce-specversion"), m.Header.Get("ce-id"), m.Header.Get("ce-source"), m.Header.Get("ce-type"),
			m.Header.Get("ce-time"), m.Header.Get("ce-subject"), m.Header.Get("ce-datacontenttype"),
			m.Header.Get("ce-prevseq"), m.Header.Get("ce-ignorable"), m.Header.Get("ce-"+events.ExtWorkflow), m.Header.Get("ce-"+events.ExtSchema),
			m.Header.Get("ce-"+events.ExtTraceParent), m.Data)
	}
	// The schema version: this one's, a newer one's, and no version.
	if ev := codecSamples(); len(ev) > 0 {
		m, _ := fastEncode("s", ev[0])
		for _, schema := range []string{"1", "2", "x"} {
			f.Add(m.Header.Get("ce-specversion"), m.Header.Get("ce-id"), m.Header.Get("ce-source"), m.Header.Get("ce-type"),
				m.Header.Get("ce-time"), m.Header.Get("ce-subject"), m.Header.Get("ce-datacontenttype"),
				m.Header.Get("ce-prevseq"), m.Header.Get("ce-ignorable"), m.Header.Get("ce-"+events.ExtWorkflow), schema, "", m.Data)
		}
	}
	f.Fuzz(func(t *testing.T, spec, id, source, typ, ts, subject, ct, prev, ign, wf, schema, traceparent string, data []byte) {
		h := nats.Header{}
		for k, v := range map[string]string{"ce-specversion": spec, "ce-id": id, "ce-source": source, "ce-type": typ,
			"ce-time": ts, "ce-subject": subject, "ce-datacontenttype": ct, "ce-prevseq": prev, "ce-ignorable": ign,
			"ce-" + events.ExtWorkflow: wf, "ce-" + events.ExtSchema: schema, "ce-" + events.ExtTraceParent: traceparent} {
			if v != "" {
				h.Set(k, v)
			}
		}
		got, ok := fastDecode(h, data)
		if !ok {
			return
		}
		want, err := decodeSDK(h, data)
		require.NoError(t, err, "the direct decoder accepted what sdk-go refuses: %v %q", h, data)
		requireSameEvent(t, want, got)
	})
}

// TestNewerSchemaIsNotMisread: an event written with a schema above this
// version's is read as one of a type this version does not know (its
// execution waits for a newer dispatcher), never decoded as if it were
// this version's; schema 1 (or none) is read as always; a value that is
// no version is malformed.
func TestASuccessThatDispatchesIsSchema2(t *testing.T) {
	at := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	plain := events.New("test", "x1", "wf", at, &events.StepSucceeded{StepID: "a"})
	msg, err := Encode("jf.events.wf.x1", plain)
	require.NoError(t, err)
	require.Empty(t, msg.Header.Get("ce-"+events.ExtSchema), "schema 1: no extension")
	then := events.New("test", "x1", "wf", at, &events.StepSucceeded{StepID: "a", Then: &events.StepDispatched{StepID: "b", Attempt: 1, TaskID: "x1.b.1"}})
	msg, err = Encode("jf.events.wf.x1", then)
	require.NoError(t, err)
	require.Equal(t, "2", msg.Header.Get("ce-"+events.ExtSchema), "an older reader would pass over the dispatch")
	got, err := Decode(msg.Header, msg.Data)
	require.NoError(t, err)
	require.Equal(t, "b", got.Data.(*events.StepSucceeded).Then.StepID)
	ce, err := then.ToCloudEvent()
	require.NoError(t, err)
	require.Equal(t, "2", ce.Extensions()[events.ExtSchema], "the sdk-go form says the same")
}

// TestASleepsFiringIsSchema4: a success that records a sleep's firing
// (docs/adr/0017), alone or carried by the end, is written with schema 4:
// an older reader would pass over the firing and leave the timer armed.
func TestASleepsFiringIsSchema4(t *testing.T) {
	at := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	ok := &events.StepSucceeded{StepID: "nap", Attempt: 1, Fired: "t1"}
	for _, p := range []events.Payload{ok, &events.ExecutionSucceeded{Step: ok}} {
		msg, err := Encode("jf.events.wf.x1", events.New("test", "x1", "wf", at, p))
		require.NoError(t, err)
		require.Equal(t, "4", msg.Header.Get("ce-"+events.ExtSchema), "%T", p)
		got, err := Decode(msg.Header, msg.Data)
		require.NoError(t, err)
		require.Equal(t, "t1", events.FiringOf(got.Data))
	}
}

// TestAWaitsArmingIsSchema5: a wait that records its timer's arming
// (docs/adr/0018) is written with schema 5: an older reader would pass
// over the arming, and ignore the timer's firing.
func TestAWaitsArmingIsSchema5(t *testing.T) {
	at := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	armed := &events.TimerArmed{TimerID: "t1", Purpose: events.TimerSleep, StepID: "nap", Attempt: 1, Due: at.Add(time.Hour)}
	for _, tc := range []struct {
		p      *events.StepWaiting
		schema string
	}{
		{&events.StepWaiting{StepID: "nap", Attempt: 1, Until: at.Add(time.Hour), Timer: armed}, "5"},
		{&events.StepWaiting{StepID: "nap", Attempt: 1, Until: at.Add(time.Hour)}, ""},
	} {
		msg, err := Encode("jf.events.wf.x1", events.New("test", "x1", "wf", at, tc.p))
		require.NoError(t, err)
		require.Equal(t, tc.schema, msg.Header.Get("ce-"+events.ExtSchema))
		got, err := Decode(msg.Header, msg.Data)
		require.NoError(t, err)
		if tc.p.Timer == nil {
			require.Nil(t, events.ArmingOf(got.Data))
			continue
		}
		require.Equal(t, armed, events.ArmingOf(got.Data))
	}
}

func TestNewerSchemaIsNotMisread(t *testing.T) {
	ev := events.New("test", "x1", "wf", time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC), &events.StepSucceeded{StepID: "a"})
	for _, tc := range []struct {
		schema string
		want   error
	}{
		{"", nil},
		{"1", nil},
		{"2", nil},
		{"3", nil},
		{"4", nil},
		{"5", nil},
		{"6", events.ErrUnknownType},
		{"x", events.ErrMalformed},
		{"0", events.ErrMalformed},
	} {
		msg, err := Encode("jf.events.wf.x1", ev)
		require.NoError(t, err)
		if tc.schema != "" {
			msg.Header.Set("ce-"+events.ExtSchema, tc.schema)
		}
		got, err := Decode(msg.Header, msg.Data)
		if tc.want == nil {
			require.NoError(t, err, tc.schema)
			require.Equal(t, "a", got.Data.(*events.StepSucceeded).StepID)
			continue
		}
		require.ErrorIs(t, err, tc.want, tc.schema)
		if errors.Is(tc.want, events.ErrUnknownType) {
			require.ErrorContains(t, err, "written with schema 6 by a newer jetflow")
			require.Nil(t, got.Data, "not decoded as this version's")
			require.Equal(t, ev.ID, got.ID, "but known for what it is")
		}
	}
}

// BenchmarkCodec: a step's success carrying the next dispatch, as a
// dispatcher appends one, encoded and decoded (every service decodes
// each message it takes).
func BenchmarkCodec(b *testing.B) {
	at := time.Date(2026, 12, 5, 16, 0, 0, 123456789, time.UTC)
	ev := events.Event{ID: "0f9c6a2e-8d1b-4e5a-9c3f-7b2d4e6a8c10", Type: events.TypeStepSucceeded,
		Source: "urn:jetflow:dispatcher:d-1", Subject: "bench-0001", Workflow: "bench", Time: at,
		Data: &events.StepSucceeded{StepID: "s3", Attempt: 1, Output: json.RawMessage(`{"ok":true}`), Duration: 12,
			Then: &events.StepDispatched{StepID: "s4", Kind: "noop", Attempt: 1, TaskID: "bench-0001.s4.1", Queue: "default",
				Input: json.RawMessage(`{"id":"s4","kind":"noop"}`)}}}
	msg, err := Encode("jf.events.bench.bench-0001", ev)
	require.NoError(b, err)
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Encode("jf.events.bench.bench-0001", ev); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Decode(msg.Header, msg.Data); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestDecodeLeavesTheHeaderAlone: the fast path reads a normalized header
// as it is, the others a copy: a structured event without content-type
// is read as one without the caller's header changing.
func TestDecodeLeavesTheHeaderAlone(t *testing.T) {
	msg, err := Encode("jf.events.wf.e1", codecSamples()[0])
	require.NoError(t, err)
	before := nats.Header{}
	for k, v := range msg.Header {
		before[k] = slices.Clone(v)
	}
	_, err = Decode(msg.Header, msg.Data)
	require.NoError(t, err)
	require.Equal(t, before, msg.Header)

	mixed := nats.Header{}
	for k, v := range msg.Header {
		mixed["C"+k[1:]] = v // Ce-id, Ce-type, Content-type
	}
	require.False(t, normalized(mixed))
	ev, err := Decode(mixed, msg.Data)
	require.NoError(t, err)
	require.Equal(t, codecSamples()[0].ID, ev.ID)
	require.Contains(t, mixed, "Ce-id", "the caller's keys as they were")

	structured := []byte(`{"specversion":"1.0","id":"s-1","source":"urn:x","type":"` + string(events.TypeStartExecution) + `","data":{"workflow":"wf"}}`)
	h := nats.Header{}
	ev, err = Decode(h, structured)
	require.NoError(t, err)
	require.Equal(t, "s-1", ev.ID)
	require.Empty(t, h, "content-type set on a copy")
}

// TestValidSourcesAreKeptUpToABound: a valid source is parsed once and
// kept, an invalid one never; past maxValidSources none more is kept.
func TestValidSourcesAreKeptUpToABound(t *testing.T) {
	require.True(t, validSource("urn:jetflow:test-kept"))
	_, kept := validSources.Load("urn:jetflow:test-kept")
	require.True(t, kept)
	for _, bad := range []string{"", "http://a b", "%zz"} {
		require.False(t, validSource(bad), bad)
		require.False(t, validSource(bad), "%s, asked again", bad)
		_, kept := validSources.Load(bad)
		require.False(t, kept, bad)
	}
	for i := range maxValidSources + 10 {
		require.True(t, validSource(fmt.Sprintf("urn:jetflow:test-%d", i)))
	}
	n := 0
	validSources.Range(func(any, any) bool { n++; return true })
	require.LessOrEqual(t, n, maxValidSources)
	require.True(t, validSource(fmt.Sprintf("urn:jetflow:test-%d", maxValidSources+5)), "valid, kept or not")
}

// TestEncodedHeadersAreApart: the encoded header's values share one
// array, and a value added or set later (a publish option, a caller's
// own header) changes that header alone.
func TestEncodedHeadersAreApart(t *testing.T) {
	for _, ev := range codecSamples() {
		msg, err := Encode("jf.events.wf.e1", ev)
		require.NoError(t, err)
		want := nats.Header{}
		for k, v := range msg.Header {
			want[k] = slices.Clone(v)
		}
		for k := range want {
			msg.Header.Add(k, "added")
			want[k] = append(want[k], "added")
			require.Equal(t, want, msg.Header, "after adding to %s", k)
		}
		msg.Header.Set("ce-id", "set")
		want["ce-id"] = []string{"set"}
		require.Equal(t, want, msg.Header)
	}
}
