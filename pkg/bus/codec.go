package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/nats-io/nats.go"

	"jetflow.dev/pkg/events"
)

// The CloudEvents NATS binding: every JetStream message jetflow writes or
// reads is an [events.Event] in binary mode (ce- headers, JSON data), and
// structured mode is read too. Package events holds the event and its
// sdk-go conversion, which know nothing of NATS; this file puts them on
// NATS messages.

// Encode returns a NATS message for e in CloudEvents binary mode (ce-
// headers, JSON data). The caller sets publish options (Nats-Msg-Id,
// expected sequences). Events in canonical form take a direct path that
// writes exactly what the sdk-go binding writes ([fastEncode]); anything
// else goes through sdk-go.
func Encode(subject string, e events.Event) (*nats.Msg, error) {
	if m, ok := fastEncode(subject, e); ok {
		return m, nil
	}
	return encodeSDK(subject, e)
}

// encodeSDK is Encode through the sdk-go binding, the reference.
func encodeSDK(subject string, e events.Event) (*nats.Msg, error) {
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

// Decode parses a CloudEvent in binary or structured mode from a NATS
// message's header and data. An unknown type returns the event with a nil
// Data and an error wrapping [events.ErrUnknownType]; malformed input
// returns an error wrapping [events.ErrMalformed]. Decode never panics.
func Decode(header nats.Header, data []byte) (ev events.Event, err error) {
	defer func() {
		if r := recover(); r != nil { // the sdk must not take the process down on hostile input
			ev, err = events.Event{}, fmt.Errorf("%w: %v", events.ErrMalformed, r)
		}
	}()
	h := header
	if !normalized(header) {
		h = normalizeHeader(header)
	}
	if ev, ok := fastDecode(h, data); ok {
		return ev, nil
	}
	return decodeSDK(normalizeHeader(header), data) // a copy: it may set content-type
}

// normalized reports whether h's ce- and content-type keys are all in
// lower case already (as jetflow and the CloudEvents SDKs write them):
// the fast path then reads h itself, not a copy.
func normalized(h nats.Header) bool {
	for k := range h {
		ce := len(k) >= 3 && strings.EqualFold(k[:3], "ce-")
		if (ce || strings.EqualFold(k, "content-type")) && hasUpper(k) {
			return false
		}
	}
	return true
}

// hasUpper reports whether s has an ASCII upper-case letter (header keys
// are ASCII).
func hasUpper(s string) bool {
	for i := range len(s) {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return true
		}
	}
	return false
}

// decodeSDK is Decode through the sdk-go binding, the reference; header
// must be normalized.
func decodeSDK(header nats.Header, data []byte) (ev events.Event, err error) {
	defer func() {
		if r := recover(); r != nil {
			ev, err = events.Event{}, fmt.Errorf("%w: %v", events.ErrMalformed, r)
		}
	}()
	spec := header.Get("ce-specversion")
	if spec != "" && spec != "1.0" {
		return events.Event{}, fmt.Errorf("%w: ce-specversion is %q; jetflow speaks CloudEvents 1.0", events.ErrMalformed, spec)
	}
	structured := strings.HasPrefix(header.Get("content-type"), "application/cloudevents")
	if spec == "" && !structured {
		if header.Get("content-type") != "" || !looksStructured(data) {
			return events.Event{}, fmt.Errorf("%w: %s: in binary mode it needs the headers ce-specversion: 1.0, ce-id, ce-source and ce-type; "+
				"in structured mode the whole event is the JSON body, with the header content-type: application/cloudevents+json", events.ErrMalformed, notCloudEvent)
		}
		header.Set("content-type", "application/cloudevents+json")
	}
	var restoreType string
	if spec == "" { // structured, as the sdk's NATS binding reads it: with ce-specversion, binary whatever content-type says
		data, restoreType = events.StructuredJSONData(data)
	}
	ce, err := binding.ToEvent(context.Background(), cejs.NewMessage(&nats.Msg{Header: header, Data: data}))
	if err != nil {
		if field := events.SDKErrorField(err); field != "" {
			return events.Event{}, &events.FieldError{Field: field, Reason: events.ExplainSDKError(err)}
		}
		return events.Event{}, fmt.Errorf("%w: %s", events.ErrMalformed, events.ExplainSDKError(err))
	}
	if restoreType != "" {
		ce.SetDataContentType(restoreType)
	}
	return events.FromCloudEvent(*ce)
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

// looksStructured reports whether data, sent without headers, may be a
// structured-mode CloudEvent.
func looksStructured(data []byte) bool {
	t := bytes.TrimSpace(data)
	return len(t) > 0 && t[0] == '{' && bytes.Contains(t, []byte(`"specversion"`))
}

// notCloudEvent is how Decode starts to say a message is no CloudEvent.
const notCloudEvent = "the message is not a CloudEvent"

// InvalidEvent stands for a message stored on subject that is no valid
// event (Decode returned cause): what its headers and subject tell of it,
// and Invalid saying why. Readers of histories hand it on instead of
// failing, and folds mark its execution damaged at it.
func InvalidEvent(subject string, h nats.Header, cause error) events.Event {
	why := strings.TrimPrefix(cause.Error(), events.ErrMalformed.Error()+": ")
	if strings.HasPrefix(why, notCloudEvent+":") {
		// What a publisher should send is no help to whoever reads a
		// history: say what it is.
		why = notCloudEvent + " (no ce- headers, and no CloudEvent in the body)"
	}
	ev := events.Event{ID: h.Get(nats.MsgIdHdr), Type: events.Type(h.Get("ce-type")), Invalid: why}
	if ev.ID == "" {
		ev.ID = h.Get("ce-id")
	}
	ev.Workflow, ev.Subject, _ = ParseExecutionSubject(subject)
	return ev
}

// The direct codec. Every jetflow service encodes and decodes a CloudEvent
// per JetStream message, and the generic sdk-go binding (reflection,
// attribute maps, validation per call) cost about a sixth of all CPU in
// the benchmark. For the canonical binary form jetflow itself writes
// (spec version 1.0, known attributes, JSON data) the direct path below
// produces and accepts exactly what the sdk-go binding does; anything else
// (structured mode, unknown ce- headers, odd values) goes to sdk-go, which
// stays the reference. codec_test.go (TestDirectCodecMatchesSDK,
// FuzzDirectDecode) and FuzzDecode check the equivalence.

// knownHeaders are the ce- headers the direct decoder understands.
var knownHeaders = map[string]bool{
	"ce-specversion": true, "ce-id": true, "ce-source": true, "ce-type": true, "ce-time": true,
	"ce-subject": true, "ce-datacontenttype": true,
	"ce-" + events.ExtWorkflow: true, "ce-" + events.ExtIgnorable: true, "ce-" + events.ExtPrevSeq: true,
	"ce-" + events.ExtSchema: true, "ce-" + events.ExtTraceParent: true, "ce-" + events.ExtTraceState: true,
}

// fastEncode writes e in binary mode, or reports false if e needs sdk-go.
func fastEncode(subject string, e events.Event) (*nats.Msg, bool) {
	if e.ID == "" || e.Type == "" || !validSource(e.Source) || e.Data == nil {
		return nil, false
	}
	data, err := json.Marshal(e.Data)
	if err != nil {
		return nil, false
	}
	// One array holds every value (each header's slice capped at its
	// one value, so that a caller's Add copies rather than overwrites a
	// neighbour): an allocation per message, not one per header.
	vals := make([]string, 0, 11)
	h := make(nats.Header, 11)
	set := func(k, v string) {
		vals = append(vals, v)
		n := len(vals)
		h[k] = vals[n-1 : n : n]
	}
	set("ce-specversion", "1.0")
	set("ce-id", e.ID)
	set("ce-source", e.Source)
	set("ce-type", string(e.Type))
	if e.Subject != "" {
		set("ce-subject", e.Subject)
	}
	if !e.Time.IsZero() {
		set("ce-time", e.Time.UTC().Format(time.RFC3339Nano))
	}
	set("ce-datacontenttype", "application/json")
	if e.Workflow != "" {
		set("ce-"+events.ExtWorkflow, e.Workflow)
	}
	if e.Ignorable {
		set("ce-"+events.ExtIgnorable, "true")
	}
	if e.PrevSeq > 0 {
		set("ce-"+events.ExtPrevSeq, strconv.FormatUint(e.PrevSeq, 10))
	}
	if v := events.SchemaOf(e.Data); v > 1 {
		set("ce-"+events.ExtSchema, strconv.Itoa(v))
	}
	if e.TraceParent != "" {
		set("ce-"+events.ExtTraceParent, e.TraceParent)
		if e.TraceState != "" {
			set("ce-"+events.ExtTraceState, e.TraceState)
		}
	}
	return &nats.Msg{Subject: subject, Header: h, Data: data}, true
}

// fastDecode reads the canonical binary form, or reports false if the
// message needs sdk-go (which also produces the precise error).
func fastDecode(h nats.Header, data []byte) (events.Event, bool) {
	for k, v := range h {
		if strings.HasPrefix(k, "ce-") && (!knownHeaders[k] || len(v) != 1 || v[0] == "" || strings.TrimSpace(v[0]) != v[0]) {
			return events.Event{}, false
		}
	}
	if h.Get("ce-specversion") != "1.0" {
		return events.Event{}, false
	}
	ev := events.Event{ID: h.Get("ce-id"), Type: events.Type(h.Get("ce-type")), Source: h.Get("ce-source"),
		Subject: h.Get("ce-subject"), Workflow: h.Get("ce-" + events.ExtWorkflow),
		TraceParent: h.Get("ce-" + events.ExtTraceParent), TraceState: h.Get("ce-" + events.ExtTraceState)}
	if ev.ID == "" || ev.Type == "" || !validSource(ev.Source) {
		return events.Event{}, false
	}
	if ct := h.Get("ce-datacontenttype"); ct != "application/json" && ct != "" {
		return events.Event{}, false
	}
	if ct, ok := h["content-type"]; ok && (len(ct) != 1 || ct[0] != "application/json") {
		return events.Event{}, false
	}
	if ts := h.Get("ce-time"); ts != "" {
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			return events.Event{}, false
		}
		ev.Time = t.UTC()
	}
	if ig := h.Get("ce-" + events.ExtIgnorable); ig != "" {
		ev.Ignorable = strings.EqualFold(ig, "true")
	}
	if ps := h.Get("ce-" + events.ExtPrevSeq); ps != "" {
		n, err := strconv.ParseUint(ps, 10, 64)
		if err != nil || strconv.FormatUint(n, 10) != ps {
			return events.Event{}, false
		}
		ev.PrevSeq = n
	}
	if events.CheckSchema(ev.Type, h.Get("ce-"+events.ExtSchema)) != nil {
		return events.Event{}, false // sdk-go's path says why
	}
	p := events.NewPayload(ev.Type)
	if p == nil || len(data) == 0 {
		return events.Event{}, false
	}
	// Unmarshal checks the whole of data is valid JSON before it decodes
	// any of it: no json.Valid first (a second scan, 1% of a step's CPU).
	if err := json.Unmarshal(data, p); err != nil {
		return events.Event{}, false
	}
	ev.Raw, ev.Data = data, p
	return ev, true
}

// validSource reports whether s is a non-empty URI reference that sdk-go
// keeps as written.
func validSource(s string) bool {
	if s == "" {
		return false
	}
	if _, ok := validSources.Load(s); ok {
		return true
	}
	u, err := url.Parse(s)
	if err != nil || u.String() != s {
		return false
	}
	// A deployment's sources are few (its services, agents and clients):
	// each is parsed once. Past maxValidSources (a client naming a new
	// source per event), the others are parsed each time.
	if validSourcesKept.Add(1) <= maxValidSources {
		validSources.Store(s, struct{}{})
	}
	return true
}

// validSources holds sources found valid, up to maxValidSources.
var (
	validSources     sync.Map
	validSourcesKept atomic.Int64
)

const maxValidSources = 1024
