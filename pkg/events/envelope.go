package events

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
)

// Errors returned by [Decode].
var (
	ErrUnknownType = errors.New("events: unknown event type")
	ErrMalformed   = errors.New("events: malformed cloudevent")
)

// ExtWorkflow is the CloudEvents extension attribute naming the workflow.
const ExtWorkflow = "workflow"

// ExtPrevSeq carries, on history events, the stream sequence of the
// previous event of the same execution (0 for the first): the sequence the
// append was conditioned on. Readers use it to detect gaps.
const ExtPrevSeq = "prevseq"

// ExtIgnorable marks an event that folds may skip when they do not know its type.
const ExtIgnorable = "ignorable"

// Event is a decoded jetflow CloudEvent.
type Event struct {
	// ID is the CloudEvent id and the message's Nats-Msg-Id.
	ID string `json:"id"`
	// Type is the CloudEvent type.
	Type Type `json:"type"`
	// Source is the CloudEvent source (who produced it).
	Source string `json:"source"`
	// Subject is the CloudEvent subject: the execution id.
	Subject string `json:"subject,omitempty"`
	// Workflow is the workflow extension attribute.
	Workflow string `json:"workflow,omitempty"`
	// Time is when the producer created the event.
	Time time.Time `json:"time"`
	// Ignorable says folds may skip this event if they do not know its type.
	Ignorable bool `json:"ignorable,omitempty"`
	// Seq is the JetStream stream sequence, set when read from a stream.
	Seq uint64 `json:"seq,omitempty"`
	// PrevSeq is the stream sequence of the execution's previous event
	// (history events only; 0 for the first or when unknown).
	PrevSeq uint64 `json:"prev_seq,omitempty"`
	// Data is the typed payload; nil for an unknown type.
	Data Payload `json:"data"`
	// Raw is the JSON data as received (set by Decode).
	Raw json.RawMessage `json:"-"`
	// Invalid, on an event read from a history, says why the stored
	// message is not a valid event (it could not be decoded); Data is nil
	// then, and folds treat the execution as damaged at it.
	Invalid string `json:"-"`
}

// New returns an event with a fresh id and the given time.
func New(source, subject, workflow string, at time.Time, data Payload) Event {
	return Event{ID: uuid.NewString(), Type: data.EventType(), Source: source, Subject: subject,
		Workflow: workflow, Time: at.UTC(), Data: data}
}

// ToCloudEvent converts e to a valid sdk-go event: its attributes,
// extensions and JSON data (Data, or Raw when Data is nil). An event that
// is no valid CloudEvent returns an error wrapping [ErrMalformed].
func (e Event) ToCloudEvent() (event.Event, error) {
	ce := event.New()
	ce.SetID(e.ID)
	ce.SetType(string(e.Type))
	ce.SetSource(e.Source)
	if e.Subject != "" {
		ce.SetSubject(e.Subject)
	}
	ce.SetTime(e.Time)
	if e.Workflow != "" {
		ce.SetExtension(ExtWorkflow, e.Workflow)
	}
	if e.Ignorable {
		ce.SetExtension(ExtIgnorable, true)
	}
	if e.PrevSeq > 0 {
		ce.SetExtension(ExtPrevSeq, strconv.FormatUint(e.PrevSeq, 10))
	}
	var data any = e.Data
	if e.Data == nil && e.Raw != nil {
		data = e.Raw
	}
	if err := ce.SetData(event.ApplicationJSON, data); err != nil {
		return ce, fmt.Errorf("encode %s data: %w", e.Type, err)
	}
	if err := ce.Validate(); err != nil {
		return ce, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return ce, nil
}

// Encode returns a NATS message for e in CloudEvents binary mode (ce-
// headers, JSON data). The caller sets publish options (Nats-Msg-Id,
// expected sequences). Events in canonical form take a direct path that
// writes exactly what the sdk-go binding writes (see codec.go); anything
// else goes through sdk-go.
func Encode(subject string, e Event) (*nats.Msg, error) {
	if m, ok := fastEncode(subject, e); ok {
		return m, nil
	}
	return encodeSDK(subject, e)
}

// encodeSDK is Encode through the sdk-go binding, the reference.
func encodeSDK(subject string, e Event) (*nats.Msg, error) {
	ce, err := e.ToCloudEvent()
	if err != nil {
		return nil, err
	}
	var body bytes.Buffer
	hdr, err := cejs.WriteMsg(context.Background(), binding.ToMessage(&ce), &body)
	if err != nil {
		return nil, fmt.Errorf("write cloudevent: %w", err)
	}
	return &nats.Msg{Subject: subject, Header: hdr, Data: body.Bytes()}, nil
}

// EncodeStructured returns e in CloudEvents structured JSON mode.
func EncodeStructured(e Event) ([]byte, error) {
	ce, err := e.ToCloudEvent()
	if err != nil {
		return nil, err
	}
	return json.Marshal(ce)
}

// Decode parses a CloudEvent in binary or structured mode from a NATS
// message's header and data. An unknown type returns the event with a nil
// Data and an error wrapping [ErrUnknownType]; malformed input returns an
// error wrapping [ErrMalformed]. Decode never panics.
func Decode(header nats.Header, data []byte) (ev Event, err error) {
	defer func() {
		if r := recover(); r != nil { // the sdk must not take the process down on hostile input
			ev, err = Event{}, fmt.Errorf("%w: %v", ErrMalformed, r)
		}
	}()
	header = normalizeHeader(header)
	if ev, ok := fastDecode(header, data); ok {
		return ev, nil
	}
	return decodeSDK(header, data)
}

// decodeSDK is Decode through the sdk-go binding, the reference; header
// must be normalized.
func decodeSDK(header nats.Header, data []byte) (ev Event, err error) {
	defer func() {
		if r := recover(); r != nil {
			ev, err = Event{}, fmt.Errorf("%w: %v", ErrMalformed, r)
		}
	}()
	spec := header.Get("ce-specversion")
	if spec != "" && spec != "1.0" {
		return Event{}, fmt.Errorf("%w: ce-specversion is %q; jetflow speaks CloudEvents 1.0", ErrMalformed, spec)
	}
	structured := strings.HasPrefix(header.Get("content-type"), "application/cloudevents")
	if spec == "" && !structured {
		if header.Get("content-type") != "" || !looksStructured(data) {
			return Event{}, fmt.Errorf("%w: %s: in binary mode it needs the headers ce-specversion: 1.0, ce-id, ce-source and ce-type; "+
				"in structured mode the whole event is the JSON body, with the header content-type: application/cloudevents+json", ErrMalformed, notCloudEvent)
		}
		header.Set("content-type", "application/cloudevents+json")
	}
	ce, err := binding.ToEvent(context.Background(), cejs.NewMessage(&nats.Msg{Header: header, Data: data}))
	if err != nil {
		return Event{}, fmt.Errorf("%w: %s", ErrMalformed, ExplainSDKError(err))
	}
	return FromCloudEvent(*ce)
}

var (
	missingAttrRe = regexp.MustCompile(`^(\w+): (?:MUST be a non-empty string|REQUIRED)$`)
	specVersionRe = regexp.MustCompile(`^specversion: unknown value: (.*)$`)
)

// ExplainSDKError turns an sdk-go decoding or validation error into one line
// that says what to fix.
func ExplainSDKError(err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	if m := missingAttrRe.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("the CloudEvent has no %s: every CloudEvent needs one (in binary mode, the header ce-%s)", m[1], m[1])
	}
	if m := specVersionRe.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("specversion is %q; jetflow speaks CloudEvents 1.0", m[1])
	}
	if strings.HasPrefix(msg, "unexpected end of JSON input") || strings.Contains(msg, "invalid character") {
		return "the structured CloudEvent is not valid JSON: " + msg
	}
	return msg
}

// FromCloudEvent converts an sdk-go event to an Event with a typed payload.
func FromCloudEvent(ce event.Event) (Event, error) {
	if err := ce.Validate(); err != nil {
		return Event{}, fmt.Errorf("%w: %s", ErrMalformed, ExplainSDKError(err))
	}
	if v := ce.SpecVersion(); v != "1.0" {
		return Event{}, fmt.Errorf("%w: specversion is %q; jetflow speaks CloudEvents 1.0", ErrMalformed, v)
	}
	ev := Event{ID: ce.ID(), Type: Type(ce.Type()), Source: ce.Source(), Subject: ce.Subject(), Time: ce.Time().UTC()}
	if w, ok := ce.Extensions()[ExtWorkflow]; ok {
		ev.Workflow = fmt.Sprint(w)
	}
	if ig, ok := ce.Extensions()[ExtIgnorable]; ok {
		ev.Ignorable = strings.EqualFold(fmt.Sprint(ig), "true")
	}
	if ps, ok := ce.Extensions()[ExtPrevSeq]; ok {
		n, err := strconv.ParseUint(fmt.Sprint(ps), 10, 64)
		if err != nil {
			return ev, fmt.Errorf("%w: extension %s %q is not a sequence", ErrMalformed, ExtPrevSeq, ps)
		}
		ev.PrevSeq = n
	}
	ev.Raw = ce.Data()
	if ct := ce.DataContentType(); ct != "" && !strings.HasPrefix(ct, "application/json") && !strings.HasSuffix(ct, "+json") {
		return ev, fmt.Errorf("%w: datacontenttype %q is not JSON", ErrMalformed, ct)
	}
	p := NewPayload(ev.Type)
	if p == nil {
		return ev, fmt.Errorf("%w: %s", ErrUnknownType, ev.Type)
	}
	if len(ev.Raw) > 0 {
		if err := json.Unmarshal(ev.Raw, p); err != nil {
			field, msg := ExplainJSON(err)
			if field != "" {
				msg = field + " " + msg
			}
			return ev, fmt.Errorf("%w: %s data: %s", ErrMalformed, ev.Type, msg)
		}
	}
	ev.Data = p
	return ev, nil
}

// normalizeHeader returns h with ce- and content-type keys in lower case,
// as the CloudEvents NATS binding spells them; NATS header keys are case
// sensitive, and people type "Ce-Id" as often as "ce-id".
func normalizeHeader(h nats.Header) nats.Header {
	out := make(nats.Header, len(h))
	for k, v := range h {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "ce-") || lk == "content-type" {
			if _, taken := h[lk]; taken && lk != k {
				continue // the lower-case spelling wins
			}
			k = lk
		}
		out[k] = v
	}
	return out
}

func looksStructured(data []byte) bool {
	t := bytes.TrimSpace(data)
	return len(t) > 0 && t[0] == '{' && bytes.Contains(t, []byte(`"specversion"`))
}
