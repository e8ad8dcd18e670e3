package bus_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/events/eventstest"
)

// TestDecodeErrorsSayWhatToFix: what people publish by mistake (a plain
// message, an event without an id, broken JSON, another specversion) is
// refused with one line that says what is wrong, never the sdk's
// multi-line text or a misleading "not in binary mode".
func TestDecodeErrorsSayWhatToFix(t *testing.T) {
	t.Parallel()
	start := `{"workflow":"hello"}`
	structured := nats.Header{"content-type": {"application/cloudevents+json"}}
	for _, tt := range []struct {
		name   string
		header nats.Header
		data   string
		want   string
	}{
		{"PlainMessage", nats.Header{}, start, "not a CloudEvent: in binary mode it needs the headers ce-specversion"},
		{"PlainWithJSONContentType", nats.Header{"content-type": {"application/json"}}, start, "not a CloudEvent"},
		{"BinaryWithoutID", nats.Header{"ce-specversion": {"1.0"}, "ce-type": {string(events.TypeStartExecution)}, "ce-source": {"x"}}, start,
			"the CloudEvent has no id: every CloudEvent needs one (in binary mode, the header ce-id)"},
		{"BinaryWithoutSource", nats.Header{"ce-specversion": {"1.0"}, "ce-type": {string(events.TypeStartExecution)}, "ce-id": {"1"}}, start,
			"has no source"},
		{"StructuredBrokenJSON", structured, `{"specversion":"1.0",`, "the structured CloudEvent is not valid JSON"},
		{"StructuredWithoutID", structured, `{"specversion":"1.0","type":"io.jetflow.execution.start","source":"x","data":{"workflow":"hello"}}`,
			"the CloudEvent has no id"},
		{"BinarySpecVersion2", nats.Header{"ce-specversion": {"2.0"}, "ce-id": {"1"}, "ce-type": {string(events.TypeStartExecution)}, "ce-source": {"x"}}, start,
			`ce-specversion is "2.0"; jetflow speaks CloudEvents 1.0`},
		{"StructuredSpecVersion2", structured, `{"specversion":"2.0","id":"1","type":"io.jetflow.execution.start","source":"x","data":{"workflow":"hello"}}`,
			`specversion is "2.0"; jetflow speaks CloudEvents 1.0`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := bus.Decode(tt.header, []byte(tt.data))
			require.Error(t, err)
			require.True(t, errors.Is(err, events.ErrMalformed), "%v", err)
			require.Contains(t, err.Error(), tt.want)
			require.NotContains(t, err.Error(), "\n")
			require.NotContains(t, err.Error(), "binary mode\"")
			require.Equal(t, strings.TrimSpace(err.Error()), err.Error())
		})
	}
}

func TestDecodeNamesTheMemberAtFault(t *testing.T) {
	t.Parallel()

	header := func(typ events.Type) nats.Header {
		return nats.Header{"ce-specversion": {"1.0"}, "ce-id": {"e1"}, "ce-source": {"s"}, "ce-type": {string(typ)},
			"content-type": {"application/json"}}
	}
	tests := []struct {
		name string
		typ  events.Type
		data string
		want string
	}{
		{"NumberAsString", events.TypeStepStarted, `{"step_id":"a","attempt":"one"}`,
			"io.jetflow.step.started data: attempt must be a number, not string"},
		{"ListAsString", events.TypeStepWaiting, `{"step_id":"a","signals":"go"}`,
			"io.jetflow.step.waiting data: signals must be an array, not string"},
		{"ObjectAsList", events.TypeVariablesSet, `{"vars":[1]}`,
			"io.jetflow.variables.set data: vars must be an object, not array"},
		{"BoolAsNumber", events.TypeStepSkipped, `{"step_id":"a","dry_run":1}`,
			"io.jetflow.step.skipped data: dry_run must be a boolean, not number"},
		// encoding/json's v2 implementation (Go 1.27's; make test/go1.26
		// runs the v1 one) names the item of an array, its v1 one does not: a case
		// named ...V1 or ...V2 is of that one only.
		{"NestedMemberV1", events.TypeClearLock, `{"lock":"db","entries":[{"request":"2"}]}`,
			"io.jetflow.lock.clear data: entries.request must be a number, not string"},
		{"NestedMemberV2", events.TypeClearLock, `{"lock":"db","entries":[{"request":"2"}]}`,
			"io.jetflow.lock.clear data: entries.0.request must be a number, not string"},
		{"WholeDocument", events.TypeTimerFired, `["t1"]`,
			"io.jetflow.timer.fired data: must be a JSON object, not array"},
		{"BadTime", events.TypeTimerArmed, `{"timer_id":"t","due":"tomorrow"}`,
			`io.jetflow.timer.armed data: parsing time "tomorrow" as "2006-01-02T15:04:05Z07:00": cannot parse "tomorrow" as "2006"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eventstest.SkipOtherJSON(t, tc.name)

			_, err := bus.Decode(header(tc.typ), []byte(tc.data))
			require.ErrorIs(t, err, events.ErrMalformed)
			require.Equal(t, events.ErrMalformed.Error()+": "+tc.want, err.Error())
		})
	}
}

// TestStructuredDataOfAnyJSONMediaType: over NATS too, a structured
// CloudEvent's data is read inline as JSON for every JSON media type, and
// keeps its datacontenttype; a type that is not JSON with data that is not
// a string is refused naming datacontenttype.
func TestStructuredDataOfAnyJSONMediaType(t *testing.T) {
	t.Parallel()
	structured := nats.Header{"content-type": {"application/cloudevents+json"}}
	for _, ct := range []string{"application/vnd.acme.order+json", "Application/JSON", "application/json; charset=utf-8"} {
		for _, header := range []nats.Header{structured, {}} { // without headers: structured, as looksStructured says
			ev, err := bus.Decode(header, []byte(`{"specversion":"1.0","id":"1","source":"s","type":"io.jetflow.execution.start",`+
				`"datacontenttype":"`+ct+`","data":{"workflow":"hello"}}`))
			require.NoError(t, err, ct)
			require.Equal(t, "hello", ev.Data.(*events.StartExecution).Workflow, ct)
		}
	}
	for _, ct := range []string{"text/plain", `a\"b`} {
		_, err := bus.Decode(structured, []byte(`{"specversion":"1.0","id":"1","source":"s","type":"io.jetflow.execution.start",`+
			`"datacontenttype":"`+ct+`","data":{"workflow":"hello"}}`))
		var fe *events.FieldError
		require.ErrorAs(t, err, &fe, ct)
		require.Equal(t, "datacontenttype", fe.Field, ct)
		require.Contains(t, fe.Reason, "set datacontenttype to application/json", ct)
	}
}

// TestBinaryDataIsNeverRewritten: with ce-specversion, a message is in
// binary mode whatever its content-type says, and its data is the
// payload as sent: a member of it named datacontenttype is no attribute.
func TestBinaryDataIsNeverRewritten(t *testing.T) {
	t.Parallel()
	h := nats.Header{"ce-specversion": {"1.0"}, "ce-id": {"1"}, "ce-source": {"s"}, "ce-type": {string(events.TypeStartExecution)},
		"content-type": {"application/cloudevents"}}
	_, err := bus.Decode(h, []byte(`{"workflow":"w","datacontenttype":"application/vnd.x+json"}`))
	require.ErrorIs(t, err, events.ErrMalformed, "refused for its content-type, as before")
	require.Contains(t, err.Error(), `datacontenttype "application/cloudevents" is not JSON`)
}

// TestStructuredOddAttributes: a structured event whose attribute is not
// a string names no decoder's word as the field; a JSON type with spaces
// around it is read as JSON.
func TestStructuredOddAttributes(t *testing.T) {
	t.Parallel()
	structured := nats.Header{"content-type": {"application/cloudevents+json"}}
	_, err := bus.Decode(structured, []byte(`{"specversion":"1.0","id":1,"source":"s","type":"io.jetflow.execution.start","data":{"workflow":"w"}}`))
	require.ErrorIs(t, err, events.ErrMalformed)
	var fe *events.FieldError
	if errors.As(err, &fe) {
		require.NotEqual(t, "ReadString", fe.Field)
	}
	ev, err := bus.Decode(structured, []byte(`{"specversion":"1.0","id":"1","source":"s","type":"io.jetflow.execution.start",`+
		`"datacontenttype":" application/json ","data":{"workflow":"w","input":{"html":"<b>&</b>"}}}`))
	require.NoError(t, err)
	require.JSONEq(t, `{"html":"<b>&</b>"}`, string(ev.Data.(*events.StartExecution).Input))
}
