package events

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"
)

// Errors of decoding: [FromCloudEvent] and [StrictData] return them, and
// so does the NATS codec, [jetflow.dev/pkg/bus.Decode].
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

// ExtTraceParent and ExtTraceState are the CloudEvents distributed-tracing
// extension: the W3C trace context the event was produced in. A start
// command's is the caller's; the dispatcher records it on the execution's
// start, and sends each task with its step attempt's (package tracing).
// Optional: an event without them is in no trace, and a malformed value
// is read as none.
const (
	ExtTraceParent = "traceparent"
	ExtTraceState  = "tracestate"
)

// ExtSchema is the CloudEvents extension attribute carrying the schema
// version an event was written with, when it is above 1 (absent: 1).
const ExtSchema = "jfschema"

// SchemaVersion is the latest version of the events' data this jetflow
// writes, and the highest it reads. A release that changes an event
// type's data so that an older reader would misread it (a member whose
// absence means something else, a value read differently) raises it, and
// the events that hold such data carry ExtSchema (SchemaOf): a reader
// that finds a version above its own treats the event as one of a type it
// does not know (ErrUnknownType: its execution waits for a newer
// dispatcher, shown "unknown", instead of being misread). Adding an event
// type, or a member older readers may ignore, needs no new version.
// docs/upgrades.md.
//
// Version 2: a step's success, or an execution's start, may carry the
// next operation's dispatch (StepSucceeded.Then, ExecutionStarted.Then),
// which an older dispatcher would pass over and dispatch the step again.
// Version 3: an execution's success may carry its last step's success
// (ExecutionSucceeded.Step), which an older reader would pass over and
// leave the step running in an ended execution.
// Version 4: a sleep's success may carry its timer's firing
// (StepSucceeded.Fired), which an older reader would pass over and
// leave the timer armed: its schedule's message would then record a
// firing after the sleep's end.
//
// Version 5: a wait may carry its timer's arming (StepWaiting.Timer),
// which an older reader would pass over: the timer would be unknown to
// it, and its firing ignored.
const SchemaVersion = 5

// SchemaOf is the schema version p is written with: 5 for a wait that
// carries its timer's arming, 4 for a success that
// carries a timer's firing (or an end carrying one), 3 for an end that
// carries a step's success, 2 for a success or a start that carries a
// dispatch, 1 (written as no ExtSchema) for the rest.
func SchemaOf(p Payload) int {
	switch e := p.(type) {
	case *StepSucceeded:
		switch {
		case e.Fired != "":
			return 4
		case e.Then != nil:
			return 2
		}
	case *ExecutionStarted:
		if e.Then != nil {
			return 2
		}
	case *ExecutionSucceeded:
		if e.Step != nil {
			return max(3, SchemaOf(e.Step))
		}
	case *StepWaiting:
		if e.Timer != nil {
			return 5
		}
	}
	return 1
}

// ArmingOf is the timer arming p records: a timer.armed's, or that of the
// timer a wait carries (StepWaiting.Timer: docs/adr/0018); nil for any
// other event. It is p's own: not to be changed.
func ArmingOf(p Payload) *TimerArmed {
	switch e := p.(type) {
	case *TimerArmed:
		return e
	case *StepWaiting:
		return e.Timer
	}
	return nil
}

// FiringOf is the timer whose firing p records: a timer.fired's, or
// that of the sleep whose success carries it (StepSucceeded.Fired: docs/adr/0017),
// alone or carried by the execution's end; "" for any other event.
func FiringOf(p Payload) string {
	switch e := p.(type) {
	case *TimerFired:
		return e.TimerID
	case *StepSucceeded:
		return e.Fired
	case *ExecutionSucceeded:
		if e.Step != nil {
			return e.Step.Fired
		}
	}
	return ""
}

// CheckSchema returns an ErrUnknownType error for an ExtSchema value
// above SchemaVersion (or one that is no version), nil otherwise.
func CheckSchema(typ Type, v string) error {
	if v == "" {
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return fmt.Errorf("%w: extension %s %q is not a schema version", ErrMalformed, ExtSchema, v)
	}
	if n > SchemaVersion {
		return fmt.Errorf("%w: %s written with schema %d by a newer jetflow (this one reads up to %d)", ErrUnknownType, typ, n, SchemaVersion)
	}
	return nil
}

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
	// TraceParent and TraceState are the distributed-tracing extension
	// (ExtTraceParent): "" when the event is in no trace.
	TraceParent string `json:"traceparent,omitempty"`
	TraceState  string `json:"tracestate,omitempty"`
	// Data is the typed payload; nil for an unknown type.
	Data Payload `json:"data"`
	// Raw is the JSON data as received (set by [FromCloudEvent] and by the
	// NATS codec).
	Raw json.RawMessage `json:"-"`
	// Invalid, on an event read from a history, says why the stored
	// message is not a valid event (it could not be decoded); Data is nil
	// then, and folds treat the execution as damaged at it.
	Invalid string `json:"-"`
}

// New returns an event with a fresh id and the given time.
func New(source, subject, workflow string, at time.Time, data Payload) Event {
	return Event{ID: uuid.NewString(), Type: data.EventType(), Source: source, Subject: subject,
		Workflow: workflow, Time: at.UTC(), Data: data, Ignorable: ignorable[data.EventType()]}
}

// ignorable are the types of history events that change no status: a
// fold that does not know one (an older dispatcher's) may skip it (it
// then reads what they note from elsewhere: see docs/events.md).
var ignorable = map[Type]bool{TypeResultAfterEnd: true}

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
	if v := SchemaOf(e.Data); v > 1 {
		ce.SetExtension(ExtSchema, strconv.Itoa(v))
	}
	if e.TraceParent != "" {
		ce.SetExtension(ExtTraceParent, e.TraceParent)
		if e.TraceState != "" {
			ce.SetExtension(ExtTraceState, e.TraceState)
		}
	}
	var data any = e.Data
	if e.Data == nil && e.Raw != nil {
		data = e.Raw
	}
	if err := ce.SetData(event.ApplicationJSON, data); err != nil {
		return ce, fmt.Errorf("encode %s data: %w", e.Type, err)
	}
	if err := ce.Validate(); err != nil {
		return ce, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return ce, nil
}

// EncodeStructured returns e in CloudEvents structured JSON mode.
func EncodeStructured(e Event) ([]byte, error) {
	ce, err := e.ToCloudEvent()
	if err != nil {
		return nil, err
	}
	return json.Marshal(ce)
}

var (
	missingAttrRe = regexp.MustCompile(`^(\w+): (?:MUST be a non-empty string|REQUIRED)$`)
	specVersionRe = regexp.MustCompile(`^specversion: unknown value: (.*)$`)
	// attrNameRe is a CloudEvents attribute name.
	attrNameRe = regexp.MustCompile(`^[a-z0-9]+$`)
	// sdk-go reads a structured event's data as a string when its
	// datacontenttype is not JSON, and says so in these words.
	dataNotStringRe = regexp.MustCompile(`^unexpected data payload for media type ("(?:[^"\\]|\\.)*"), expected a string`)
	// sdk-go reads a binary-mode attribute header it cannot convert (a
	// ce-time that is no RFC 3339 timestamp) and says so in these words.
	invalidValueRe = regexp.MustCompile(`^invalid value for ([a-z0-9]+): (.*)$`)
)

// FieldError is a malformed CloudEvent (it is [ErrMalformed]) with the
// attribute (specversion, id, source, type, time, datacontenttype,
// prevseq) or the member of its data (workflow, input.count, ...) at
// fault: an answer to its sender names it.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return ErrMalformed.Error() + ": " + e.Reason }

// FieldName is e's field, "" for a nil e.
func (e *FieldError) FieldName() string {
	if e == nil {
		return ""
	}
	return e.Field
}

// Unwrap makes a FieldError an [ErrMalformed].
func (e *FieldError) Unwrap() error { return ErrMalformed }

func malformed(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// attributes are the CloudEvents context attributes, in the order an
// error about several of them names the first.
var attributes = []string{"specversion", "id", "source", "type", "datacontenttype", "dataschema", "subject", "time"}

// IsAttributeName reports whether name may name a CloudEvents attribute:
// lower-case letters and digits.
func IsAttributeName(name string) bool { return attrNameRe.MatchString(name) }

// IsJSONMediaType reports whether a datacontenttype says the data is
// JSON, as the CloudEvents JSON format reads it: application/json,
// text/json or any type with the +json suffix, in any case, with any
// parameters (charset=utf-8).
func IsJSONMediaType(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	return mt == "application/json" || mt == "text/json" || strings.HasSuffix(mt, "+json")
}

// StructuredJSONData makes a structured CloudEvent's JSON data readable
// by sdk-go. The CloudEvents JSON format carries data inline as JSON for
// every JSON media type (application/vnd.x+json, Application/JSON); sdk-go
// reads it so only for application/json and text/json, and for any other
// type wants a string. Such a body is returned to be decoded as
// application/json, and restore is the datacontenttype to put back on the
// decoded event ("" when body is returned as it is).
func StructuredJSONData(body []byte) (out []byte, restore string) {
	var head struct {
		DataContentType *string `json:"datacontenttype"`
	}
	if json.Unmarshal(body, &head) != nil || head.DataContentType == nil || !IsJSONMediaType(*head.DataContentType) {
		return body, ""
	}
	ct := *head.DataContentType
	// sdk-go's media type: the type before a ';', trimmed; without one,
	// the whole value as it is.
	mt := ct
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		mt = strings.TrimSpace(ct[:i])
	}
	if mt == event.ApplicationJSON || mt == event.TextJSON {
		return body, "" // sdk-go reads the data inline itself
	}
	var members map[string]json.RawMessage
	if json.Unmarshal(body, &members) != nil {
		return body, ""
	}
	members["datacontenttype"] = json.RawMessage(`"` + event.ApplicationJSON + `"`)
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // the data as it was sent, < and > included
	if enc.Encode(members) != nil {
		return body, ""
	}
	return bytes.TrimRight(b.Bytes(), "\n"), ct
}

// SDKErrorField is the attribute an sdk-go validation error is about (the
// first, when it is about several), or "" when it names none (a
// structured event that is not JSON).
func SDKErrorField(err error) string {
	if dataNotStringRe.MatchString(err.Error()) {
		return "datacontenttype"
	}
	if m := invalidValueRe.FindStringSubmatch(strings.TrimSpace(err.Error())); m != nil {
		return m[1]
	}
	var named []string
	for _, line := range strings.Split(err.Error(), "\n") {
		// Attribute names are lower-case letters and digits: a decoder's
		// own words ("ReadString: expects ...") name none.
		if attr, _, ok := strings.Cut(strings.TrimSpace(line), ": "); ok && IsAttributeName(attr) {
			named = append(named, attr)
		}
	}
	for _, a := range attributes {
		if slices.Contains(named, a) {
			return a
		}
	}
	if len(named) > 0 {
		return slices.Min(named)
	}
	return ""
}

// ExplainSDKError turns an sdk-go decoding or validation error into one line
// that says what to fix. An error about several attributes names them in
// the order of the spec (sdk-go lists them in any order).
func ExplainSDKError(err error) string {
	lines := strings.Split(strings.TrimSpace(err.Error()), "\n")
	slices.SortStableFunc(lines, func(a, b string) int { return attrRank(a) - attrRank(b) })
	msg := strings.Join(strings.Fields(strings.Join(lines, " ")), " ")
	if m := missingAttrRe.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("the CloudEvent has no %s: every CloudEvent needs one (in binary mode, the header ce-%s)", m[1], m[1])
	}
	if m := specVersionRe.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("specversion is %q; jetflow speaks CloudEvents 1.0", m[1])
	}
	if m := invalidValueRe.FindStringSubmatch(msg); m != nil {
		if m[1] == "time" {
			return fmt.Sprintf("time %s is not an RFC 3339 time (e.g. 2026-01-02T03:04:05Z; in binary mode, the header ce-time), or leave it out", m[2])
		}
		return fmt.Sprintf("%s %s is not a value that attribute can take", m[1], m[2])
	}
	if m := dataNotStringRe.FindStringSubmatch(msg); m != nil {
		return fmt.Sprintf("datacontenttype %s is not JSON, yet data is not a string: "+
			"jetflow reads data as JSON; set datacontenttype to application/json, or leave it out", m[1])
	}
	if strings.HasPrefix(msg, "unexpected end of JSON input") || strings.Contains(msg, "invalid character") {
		return "the structured CloudEvent is not valid JSON: " + msg
	}
	return msg
}

// attrRank orders a line of an sdk-go validation error by the attribute
// it names.
func attrRank(line string) int {
	attr, _, _ := strings.Cut(strings.TrimSpace(line), ": ")
	if i := slices.Index(attributes, attr); i >= 0 {
		return i
	}
	return len(attributes)
}

// FromCloudEvent converts an sdk-go event to an Event with a typed payload.
func FromCloudEvent(ce event.Event) (Event, error) {
	if err := ce.Validate(); err != nil {
		return Event{}, malformed(SDKErrorField(err), "%s", ExplainSDKError(err))
	}
	if v := ce.SpecVersion(); v != "1.0" {
		return Event{}, malformed("specversion", "specversion is %q; jetflow speaks CloudEvents 1.0", v)
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
			return ev, malformed(ExtPrevSeq, "extension %s %q is not a sequence", ExtPrevSeq, ps)
		}
		ev.PrevSeq = n
	}
	if tp, ok := ce.Extensions()[ExtTraceParent]; ok {
		ev.TraceParent = fmt.Sprint(tp)
		if ts, ok := ce.Extensions()[ExtTraceState]; ok {
			ev.TraceState = fmt.Sprint(ts)
		}
	}
	ev.Raw = ce.Data()
	if s, ok := ce.Extensions()[ExtSchema]; ok {
		if err := CheckSchema(ev.Type, fmt.Sprint(s)); err != nil {
			return ev, err
		}
	}
	if ct := ce.DataContentType(); ct != "" && !IsJSONMediaType(ct) {
		return ev, malformed("datacontenttype", "datacontenttype %q is not JSON: jetflow reads data as JSON; set it to application/json, or leave it out", ct)
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
			return ev, malformed(cmp.Or(field, "data"), "%s data: %s", ev.Type, msg)
		}
	}
	ev.Data = p
	return ev, nil
}
