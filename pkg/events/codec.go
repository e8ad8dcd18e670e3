package events

import (
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// The direct codec. Every jetflow service encodes and decodes a CloudEvent
// per JetStream message, and the generic sdk-go binding (reflection,
// attribute maps, validation per call) cost about a sixth of all CPU in
// the benchmark. For the canonical binary form this package itself writes
// (spec version 1.0, known attributes, JSON data) the direct path below
// produces and accepts exactly what the sdk-go binding does; anything else
// (structured mode, unknown ce- headers, odd values) goes to sdk-go, which
// stays the reference. codec_test.go and FuzzDecode check the equivalence.

// knownHeaders are the ce- headers the direct decoder understands.
var knownHeaders = map[string]bool{
	"ce-specversion": true, "ce-id": true, "ce-source": true, "ce-type": true, "ce-time": true,
	"ce-subject": true, "ce-datacontenttype": true,
	"ce-" + ExtWorkflow: true, "ce-" + ExtIgnorable: true, "ce-" + ExtPrevSeq: true,
}

// fastEncode writes e in binary mode, or reports false if e needs sdk-go.
func fastEncode(subject string, e Event) (*nats.Msg, bool) {
	if e.ID == "" || e.Type == "" || !validSource(e.Source) || e.Data == nil {
		return nil, false
	}
	data, err := json.Marshal(e.Data)
	if err != nil {
		return nil, false
	}
	h := make(nats.Header, 10)
	h["ce-specversion"] = []string{"1.0"}
	h["ce-id"] = []string{e.ID}
	h["ce-source"] = []string{e.Source}
	h["ce-type"] = []string{string(e.Type)}
	if e.Subject != "" {
		h["ce-subject"] = []string{e.Subject}
	}
	if !e.Time.IsZero() {
		h["ce-time"] = []string{e.Time.UTC().Format(time.RFC3339Nano)}
	}
	h["ce-datacontenttype"] = []string{"application/json"}
	if e.Workflow != "" {
		h["ce-"+ExtWorkflow] = []string{e.Workflow}
	}
	if e.Ignorable {
		h["ce-"+ExtIgnorable] = []string{"true"}
	}
	if e.PrevSeq > 0 {
		h["ce-"+ExtPrevSeq] = []string{strconv.FormatUint(e.PrevSeq, 10)}
	}
	return &nats.Msg{Subject: subject, Header: h, Data: data}, true
}

// fastDecode reads the canonical binary form, or reports false if the
// message needs sdk-go (which also produces the precise error).
func fastDecode(h nats.Header, data []byte) (Event, bool) {
	for k, v := range h {
		if strings.HasPrefix(k, "ce-") && (!knownHeaders[k] || len(v) != 1 || v[0] == "" || strings.TrimSpace(v[0]) != v[0]) {
			return Event{}, false
		}
	}
	if h.Get("ce-specversion") != "1.0" {
		return Event{}, false
	}
	ev := Event{ID: h.Get("ce-id"), Type: Type(h.Get("ce-type")), Source: h.Get("ce-source"),
		Subject: h.Get("ce-subject"), Workflow: h.Get("ce-" + ExtWorkflow)}
	if ev.ID == "" || ev.Type == "" || !validSource(ev.Source) {
		return Event{}, false
	}
	if ct := h.Get("ce-datacontenttype"); ct != "application/json" && ct != "" {
		return Event{}, false
	}
	if ct, ok := h["content-type"]; ok && (len(ct) != 1 || ct[0] != "application/json") {
		return Event{}, false
	}
	if ts := h.Get("ce-time"); ts != "" {
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			return Event{}, false
		}
		ev.Time = t.UTC()
	}
	if ig := h.Get("ce-" + ExtIgnorable); ig != "" {
		ev.Ignorable = strings.EqualFold(ig, "true")
	}
	if ps := h.Get("ce-" + ExtPrevSeq); ps != "" {
		n, err := strconv.ParseUint(ps, 10, 64)
		if err != nil || strconv.FormatUint(n, 10) != ps {
			return Event{}, false
		}
		ev.PrevSeq = n
	}
	p := NewPayload(ev.Type)
	if p == nil || len(data) == 0 || !json.Valid(data) {
		return Event{}, false
	}
	if err := json.Unmarshal(data, p); err != nil {
		return Event{}, false
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
	u, err := url.Parse(s)
	return err == nil && u.String() == s
}
