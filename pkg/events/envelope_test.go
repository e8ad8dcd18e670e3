package events_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/events/eventstest"
)

// The envelope without NATS: an event to sdk-go's CloudEvent and back.
// The NATS codec (package bus) has its own round trips on top of these.

// fromStructured reads what EncodeStructured wrote, through sdk-go's JSON
// form of a CloudEvent.
func fromStructured(t *testing.T, b []byte) (events.Event, error) {
	t.Helper()
	var ce event.Event
	require.NoError(t, json.Unmarshal(b, &ce))
	return events.FromCloudEvent(ce)
}

func TestStructuredRoundTrip(t *testing.T) {
	t.Parallel()

	for _, p := range eventstest.Samples() {
		ev := eventstest.Event(p)
		ev.Ignorable = true
		b, err := events.EncodeStructured(ev)
		require.NoError(t, err, p.EventType())
		got, err := fromStructured(t, b)
		require.NoError(t, err, p.EventType())
		require.Equal(t, ev.ID, got.ID)
		require.Equal(t, ev.Type, got.Type)
		require.Equal(t, ev.Source, got.Source)
		require.Equal(t, ev.Subject, got.Subject)
		require.Equal(t, ev.Workflow, got.Workflow)
		require.True(t, ev.Time.Equal(got.Time), "time %s != %s", ev.Time, got.Time)
		require.Equal(t, time.UTC, got.Time.Location())
		require.True(t, got.Ignorable)
		require.Equal(t, ev.PrevSeq, got.PrevSeq)
		require.Zero(t, got.Seq, "Seq comes from the stream, not the message")
		require.Equal(t, ev.Data, got.Data)
		require.JSONEq(t, mustJSON(t, ev.Data), string(got.Raw))
	}
}

// TestToCloudEventKeepsRawData: an event of a type this version does not
// know travels with its data as received, and reads back as unknown.
func TestToCloudEventKeepsRawData(t *testing.T) {
	t.Parallel()

	ev := events.Event{ID: "e1", Type: "io.jetflow.step.paused", Source: "future/dispatcher", Subject: "x1",
		Workflow: "deploy", Time: eventstest.At, Ignorable: true, PrevSeq: 7, Raw: json.RawMessage(`{"step_id":"a"}`)}
	ce, err := ev.ToCloudEvent()
	require.NoError(t, err)
	require.Equal(t, "1.0", ce.SpecVersion())
	require.Equal(t, event.ApplicationJSON, ce.DataContentType())
	require.Equal(t, "deploy", ce.Extensions()[events.ExtWorkflow])
	require.Equal(t, "7", ce.Extensions()[events.ExtPrevSeq])

	got, err := events.FromCloudEvent(ce)
	require.ErrorIs(t, err, events.ErrUnknownType)
	require.NotErrorIs(t, err, events.ErrMalformed)
	require.Nil(t, got.Data)
	require.Equal(t, ev.ID, got.ID)
	require.Equal(t, ev.Workflow, got.Workflow)
	require.True(t, got.Ignorable)
	require.Equal(t, uint64(7), got.PrevSeq)
	require.JSONEq(t, `{"step_id":"a"}`, string(got.Raw))
}

func TestFromCloudEventRefuses(t *testing.T) {
	t.Parallel()

	valid := func() event.Event {
		ce := event.New()
		ce.SetID("e1")
		ce.SetSource("s")
		ce.SetType(string(events.TypeStepStarted))
		require.NoError(t, ce.SetData(event.ApplicationJSON, json.RawMessage(`{"step_id":"a","attempt":1}`)))
		return ce
	}
	_, err := events.FromCloudEvent(valid())
	require.NoError(t, err, "the base case is valid")

	for _, tt := range []struct {
		name   string
		change func(*event.Event)
		want   string
		field  string // the attribute or member named
	}{
		// sdk-go's Validate words a missing id unlike its binding
		// ("id: id is required to be a non-empty string"), which
		// ExplainSDKError does not rephrase: the message still names it.
		{"NoID", func(ce *event.Event) { ce.SetID("") }, "id: id is required", "id"},
		{"NoSource", func(ce *event.Event) { ce.SetSource("") },
			"the CloudEvent has no source: every CloudEvent needs one (in binary mode, the header ce-source)", "source"},
		{"NoType", func(ce *event.Event) { ce.SetType("") }, "the CloudEvent has no type", "type"},
		{"SpecVersion03", func(ce *event.Event) { ce.SetSpecVersion(event.CloudEventsVersionV03) },
			`specversion is "0.3"; jetflow speaks CloudEvents 1.0`, "specversion"},
		{"PrevSeqNotASequence", func(ce *event.Event) { ce.SetExtension(events.ExtPrevSeq, "seven") },
			`extension prevseq "seven" is not a sequence`, "prevseq"},
		{"DataNotJSON", func(ce *event.Event) { require.NoError(t, ce.SetData("text/plain", []byte("hi"))) },
			`datacontenttype "text/plain" is not JSON`, "datacontenttype"},
		{"DataWrongShape", func(ce *event.Event) {
			require.NoError(t, ce.SetData(event.ApplicationJSON, json.RawMessage(`{"step_id":"a","attempt":"one"}`)))
		}, "io.jetflow.step.started data: attempt must be a number, not string", "attempt"},
		{"DataNotAnObject", func(ce *event.Event) {
			require.NoError(t, ce.SetData(event.ApplicationJSON, json.RawMessage(`[1]`)))
		}, "io.jetflow.step.started data: must be a JSON object", "data"},
		{"SeveralMissing", func(ce *event.Event) { ce.SetType(""); ce.SetSource("") }, "source: REQUIRED type: MUST", "source"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()

			ce := valid()
			tt.change(&ce)
			ev, err := events.FromCloudEvent(ce)
			require.ErrorIs(t, err, events.ErrMalformed)
			require.NotErrorIs(t, err, events.ErrUnknownType)
			require.Contains(t, err.Error(), tt.want)
			require.NotContains(t, err.Error(), "\n")
			require.Nil(t, ev.Data)
			var fe *events.FieldError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, tt.field, fe.Field, "the field at fault")
		})
	}
}

func TestExplainSDKError(t *testing.T) {
	t.Parallel()

	for in, want := range map[string]string{
		"id: MUST be a non-empty string":  "the CloudEvent has no id: every CloudEvent needs one (in binary mode, the header ce-id)",
		"type: REQUIRED":                  "the CloudEvent has no type: every CloudEvent needs one (in binary mode, the header ce-type)",
		"specversion: unknown value: 2.0": `specversion is "2.0"; jetflow speaks CloudEvents 1.0`,
		"unexpected end of JSON input":    "the structured CloudEvent is not valid JSON: unexpected end of JSON input",
		"invalid character 'x' looking for beginning of value": "the structured CloudEvent is not valid JSON: " +
			"invalid character 'x' looking for beginning of value",
		"something\n\t else": "something else",
		`unexpected data payload for media type "a\"b", expected a string: ReadString`: `datacontenttype "a\"b" ` +
			"is not JSON, yet data is not a string: jetflow reads data as JSON; set datacontenttype to application/json, or leave it out",
		`unexpected data payload for media type "text/jso", expected a string: ReadString: expects " or n`: `datacontenttype "text/jso" ` +
			"is not JSON, yet data is not a string: jetflow reads data as JSON; set datacontenttype to application/json, or leave it out",
	} {
		require.Equal(t, want, events.ExplainSDKError(errors.New(in)), "%q", in)
	}
}

// A structured CloudEvent whose datacontenttype is not JSON but whose data
// is an object: sdk-go refuses it in its own words, and the error names
// the attribute to fix.
func TestStructuredDataOfAnotherMediaTypeNamesIt(t *testing.T) {
	t.Parallel()

	var ce event.Event
	err := json.Unmarshal([]byte(`{"specversion":"1.0","type":"t","source":"s","id":"1",`+
		`"datacontenttype":"apprication/json","data":{"workflow":"fz"}}`), &ce)
	require.Error(t, err)
	require.Equal(t, "datacontenttype", events.SDKErrorField(err))
	require.Equal(t, `datacontenttype "apprication/json" is not JSON, yet data is not a string: `+
		"jetflow reads data as JSON; set datacontenttype to application/json, or leave it out", events.ExplainSDKError(err))
}

// A binary-mode CloudEvent whose ce-time is no RFC 3339 timestamp:
// sdk-go refuses it in its own words, read through the HTTP binding as
// the api reads a request, and the error names time and says what to send.
func TestBinaryTimeThatIsNoTimestampNamesIt(t *testing.T) {
	t.Parallel()

	for _, value := range []string{"yesterday", "a@\xedsF\xa8 2026-01-02T03:04:05Z"} {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{}`))
		for k, v := range map[string]string{"Ce-Specversion": "1.0", "Ce-Type": "t", "Ce-Source": "s", "Ce-Id": "1",
			"Ce-Time": value, "Content-Type": "application/json"} {
			req.Header.Set(k, v)
		}
		_, err := binding.ToEvent(t.Context(), cehttp.NewMessageFromHttpRequest(req))
		require.Error(t, err)
		require.Equal(t, "time", events.SDKErrorField(err), "%q", value)
		require.Equal(t, fmt.Sprintf("time %q is not an RFC 3339 time (e.g. 2026-01-02T03:04:05Z; "+
			"in binary mode, the header ce-time), or leave it out", value), events.ExplainSDKError(err))
	}
}

// The media types that say data is JSON, as the CloudEvents JSON format
// reads them, and some that do not.
func TestIsJSONMediaType(t *testing.T) {
	t.Parallel()
	for ct, want := range map[string]bool{
		"application/json": true, "application/json; charset=utf-8": true, "Application/JSON": true, "text/json": true,
		"application/vnd.foo+json": true, "application/cloudevents+json": true, "APPLICATION/VND.FOO+JSON; v=2": true,
		"text/plain": false, "application/jsonx": false, "application/json-seq": false, "application/xml": false,
		"": false, "json": false, "application/json;;": false,
	} {
		require.Equal(t, want, events.IsJSONMediaType(ct), "%q", ct)
	}
}

// StructuredJSONData rewrites the type only when sdk-go would not read
// the data inline, and keeps the data as it was sent.
func TestStructuredJSONData(t *testing.T) {
	t.Parallel()
	for _, body := range []string{
		`{"datacontenttype":"application/json","data":{"a":"<b>"}}`,
		`{"datacontenttype":"application/json; charset=utf-8","data":{}}`,
		`{"datacontenttype":"text/json","data":{}}`,
		`{"data":{}}`, `{"datacontenttype":null}`, `{"datacontenttype":5}`, `{"datacontenttype":"text/plain","data":"x"}`, `[1]`, `nope`,
	} {
		out, restore := events.StructuredJSONData([]byte(body))
		require.Equal(t, body, string(out), "left as it is")
		require.Empty(t, restore, body)
	}
	for _, ct := range []string{"application/vnd.acme+json", "Application/JSON", " application/json", "application/json "} {
		out, restore := events.StructuredJSONData([]byte(`{"datacontenttype":"` + ct + `","data":{"a":"<b>&"}}`))
		require.Equal(t, ct, restore)
		require.JSONEq(t, `{"datacontenttype":"application/json","data":{"a":"<b>&"}}`, string(out))
		require.Contains(t, string(out), `"<b>&"`, "not escaped")
	}
	require.Empty(t, events.SDKErrorField(errors.New(`ReadString: expects " or n, but found 1`)), "a decoder's word is no attribute")
}
