// Package redact hides sensitive values in text and JSON: the secrets an
// agent resolved, in what its operations report, and the input members a
// workflow's input schema marks writeOnly, in read models and api answers.
// It is pure: no I/O, no clock, no logger.
//
// Values are hidden wherever they appear as text: a value that is also an
// ordinary word of the output is hidden there too (hiding too much is the
// safe side). A value transformed before it was shown (encoded, split,
// reversed...) is not recognised.
package redact

import (
	"bytes"
	"cmp"
	"encoding/json"
	"maps"
	"slices"
	"strings"
)

// Replacer replaces each of a set of values, wherever it appears in a
// string, with its mask. The nil *Replacer hides nothing. A Replacer is
// safe for concurrent use.
type Replacer struct {
	masks  map[string]string
	values []string // longest first
	r      *strings.Replacer
	// kept are the masks that hold a value: text already masked is kept
	// as it is, so that masking twice changes nothing.
	kept []string
}

// New returns a Replacer that replaces each key of masks with its value;
// empty keys are ignored. It returns nil when there is nothing to hide.
// Where two values overlap, the longer one wins.
func New(masks map[string]string) *Replacer {
	values := slices.DeleteFunc(slices.Collect(maps.Keys(masks)), func(v string) bool { return v == "" })
	if len(values) == 0 {
		return nil
	}
	slices.SortFunc(values, func(a, b string) int { return cmp.Or(len(b)-len(a), strings.Compare(a, b)) })
	pairs := make([]string, 0, 2*len(values))
	for _, v := range values {
		pairs = append(pairs, v, masks[v])
	}
	var kept []string
	for _, m := range masks {
		if !slices.Contains(kept, m) && slices.ContainsFunc(values, func(v string) bool { return strings.Contains(m, v) }) {
			kept = append(kept, m)
		}
	}
	return &Replacer{masks: masks, values: values, r: strings.NewReplacer(pairs...), kept: kept}
}

// String returns s with every value replaced by its mask. Masks already
// in s are left as they are: String(String(s)) == String(s).
func (r *Replacer) String(s string) string {
	if r == nil {
		return s
	}
	if len(r.kept) == 0 {
		return r.r.Replace(s)
	}
	var b strings.Builder
	for s != "" {
		at, mask := len(s), ""
		for _, m := range r.kept {
			if i := strings.Index(s, m); i >= 0 && i < at {
				at, mask = i, m
			}
		}
		b.WriteString(r.r.Replace(s[:at]))
		b.WriteString(mask)
		s = s[at+len(mask):]
	}
	return b.String()
}

// Tail is String for text cut at a size limit: a value cut off by the
// limit leaves its beginning at the end of the text, which Tail hides
// too.
func (r *Replacer) Tail(s string) string {
	if r == nil {
		return s
	}
	s = r.String(s)
	for _, v := range r.values {
		for n := len(v) - 1; n > 0; n-- {
			if strings.HasSuffix(s, v[:n]) {
				return s[:len(s)-n] + r.masks[v]
			}
		}
	}
	return s
}

// Value returns a copy of a JSON-shaped value (as encoding/json decodes
// into any) with every string and member name masked, and every number
// whose text is a value replaced by its mask.
func (r *Replacer) Value(v any) any {
	out, _ := r.value(v)
	return out
}

// value is Value, also telling whether anything was masked.
func (r *Replacer) value(v any) (any, bool) {
	if r == nil {
		return v, false
	}
	switch t := v.(type) {
	case string:
		m := r.String(t)
		return m, m != t
	case json.Number:
		if m, ok := r.masks[t.String()]; ok {
			return m, true
		}
	case float64:
		b, _ := json.Marshal(t)
		if m, ok := r.masks[string(b)]; ok {
			return m, true
		}
	case map[string]any:
		out, changed := make(map[string]any, len(t)), false
		for k, e := range t {
			mk := r.String(k)
			me, c := r.value(e)
			out[mk], changed = me, changed || c || mk != k
		}
		return out, changed
	case []any:
		out, changed := make([]any, len(t)), false
		for i, e := range t {
			var c bool
			out[i], c = r.value(e)
			changed = changed || c
		}
		return out, changed
	}
	return v, false
}

// JSON returns raw with its strings, member names and numbers masked as
// [Replacer.Value] does. raw is returned as it is when nothing in it is
// masked; text that is not JSON is masked as text.
func (r *Replacer) JSON(raw json.RawMessage) json.RawMessage {
	if r == nil || len(raw) == 0 {
		return raw
	}
	v, err := decode(raw)
	if err != nil || !json.Valid(raw) {
		return json.RawMessage(r.String(string(raw)))
	}
	masked, changed := r.value(v)
	if !changed {
		return raw
	}
	out, err := marshal(masked)
	if err != nil {
		return json.RawMessage(r.String(string(raw)))
	}
	return out
}

func decode(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return v, nil
}

// marshal encodes v as encoding/json does, without escaping <, > and &
// (the values are shown, not embedded in HTML).
func marshal(v any) (json.RawMessage, error) {
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
