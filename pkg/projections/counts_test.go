package projections_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// TestStoredHead: of a read model stored with its step counts before its
// step table, StoredHead returns the members before the table, which
// decode as the whole model does but for the table, and the counts; any
// other document is left to be decoded whole.
func TestStoredHead(t *testing.T) {
	t.Parallel()
	x := projections.Execution{ID: "x", Workflow: "w", Version: 3, Status: projections.StatusSucceeded, Retention: "1h",
		EndedAt: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC), LastSeq: 9, Vars: map[string]json.RawMessage{"a": json.RawMessage(`{"steps":[1]}`)},
		Steps: []projections.Step{{ID: "a", Status: projections.OpSucceeded}, {ID: "b", Status: projections.OpFailed}}}
	doc, err := projections.EncodeStored(x, nil)
	require.NoError(t, err)
	var whole projections.Execution
	require.NoError(t, json.Unmarshal(doc, &whole))
	require.Equal(t, x, whole, "decoded whole, a stored model is the execution")
	i, j := strings.Index(string(doc), `"step_counts":{"steps":2,"done":1}`), strings.LastIndex(string(doc), `"steps":[`)
	require.True(t, i > 0 && j > i && strings.HasSuffix(string(doc), "]}"), "the counts, then the table, last: %s", doc)
	head, counts, ok := projections.StoredHead(doc)
	require.True(t, ok, "%s", doc)
	require.Equal(t, projections.StepCounts{Steps: 2, Done: 1}, counts)
	var got projections.Execution
	require.NoError(t, json.Unmarshal(head, &got), "%s", head)
	want := x
	want.Steps = nil
	require.Equal(t, want, got, "a variable holding a steps member is a value, not the table")

	head, counts, ok = projections.StoredHead([]byte(" {\n \"id\" : \"y\" ,\n \"step_counts\" : {\"steps\":0,\"succeeded\":0} , \"steps\" : [] } "))
	require.True(t, ok)
	require.Equal(t, projections.StepCounts{}, counts)
	require.NoError(t, json.Unmarshal(head, &got), "%s", head)
	require.Equal(t, "y", got.ID)

	plain, err := json.Marshal(x)
	require.NoError(t, err)
	for name, doc := range map[string]string{
		"stored before the counts": string(plain),
		"counts after the table":   `{"id":"x","steps":[],"step_counts":{"steps":0,"done":0}}`,
		"the table first":          `{"steps":[],"step_counts":{"steps":0,"done":0}}`,
		"no table":                 `{"id":"x","step_counts":{"steps":0,"done":0}}`,
		"counts not counts":        `{"step_counts":"two","steps":[]}`,
		"broken":                   `{"id":"x","step_counts":{"steps":0,"done":0},"id"`,
		"not an object":            `[1]`,
		"empty":                    ``,
	} {
		_, _, ok := projections.StoredHead([]byte(doc))
		require.False(t, ok, name)
	}
}

// storedHeadByTokens is StoredHead as it was written first, with
// encoding/json's Decoder: FuzzStoredHead holds StoredHead to its answers.
func storedHeadByTokens(b []byte) (head []byte, counts projections.StepCounts, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, counts, false
	}
	seen := false
	var skip json.RawMessage
	for dec.More() {
		end := dec.InputOffset()
		t, err := dec.Token()
		key, isKey := t.(string)
		if err != nil || !isKey {
			return nil, counts, false
		}
		switch key {
		case "steps":
			if !seen {
				return nil, counts, false
			}
			head = make([]byte, 0, end+1)
			return append(append(head, b[:end]...), '}'), counts, true
		case "step_counts":
			counts, seen = projections.StepCounts{}, true
			if dec.Decode(&counts) != nil {
				return nil, counts, false
			}
		default:
			if dec.Decode(&skip) != nil {
				return nil, counts, false
			}
		}
	}
	return nil, counts, false
}

// FuzzStoredHead: StoredHead gives the Decoder's answers (whether there
// is a head, the head, the counts) for any document, but refuses a head
// the Decoder took that does not decode (TestStoredHeadThatDoesNotDecode).
func FuzzStoredHead(f *testing.F) {
	x := projections.Execution{ID: "x", Workflow: "w", Version: 3, Status: projections.StatusStarted, Retention: "1h",
		Input: json.RawMessage(`{"a":[1,{"b":"}"}],"steps":2}`), Error: "a \"quoted\" ,\"steps\": error",
		Vars:  map[string]json.RawMessage{"v": json.RawMessage(`{"steps":[1]}`)},
		Steps: []projections.Step{{ID: "a", Status: projections.OpSucceeded}, {ID: "b", Status: projections.OpFailed}}}
	doc, err := projections.EncodeStored(x, nil)
	require.NoError(f, err)
	f.Add(doc)
	for _, s := range []string{
		" {\n \"id\" : \"y\" ,\n \"step_counts\" : {\"steps\":0,\"succeeded\":0} , \"steps\" : [] } ",
		`{"step_counts":{"steps":1,"done":1},"st\u0065ps":[]}`,
		`{"step_counts":{"steps":1,"done":1},"steps" 5}`,
		`{"a":1e5,"b":true,"c":null,"step_counts":null,"steps":`,
		`{"a":"x\"y","step_counts":{"steps":1},"steps":[`,
		`{"step_counts":"two","steps":[]}`,
		`{"id":"x","steps":[],"step_counts":{"steps":0,"done":0}}`,
		`{"a":[}],"step_counts":{},"steps":[]}`,
		`{"a":tru,"step_counts":{},"steps":[]}`,
		`{"a" 1,"step_counts":{},"steps":[]}`,
		`{"a":1,,"step_counts":{},"steps":[]}`,
		`{"\x":1,"step_counts":{},"steps":[]}`,
		`[1]`, ``, `{`, `{}`, `{"steps"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		head, counts, ok := projections.StoredHead(b)
		wantHead, wantCounts, wantOK := storedHeadByTokens(b)
		if wantOK && !ok {
			require.False(t, json.Valid(wantHead), "%q: refused a head that decodes", b)
			return
		}
		require.Equal(t, wantOK, ok, "%q", b)
		if ok {
			require.Equal(t, string(wantHead), string(head), "%q", b)
			require.Equal(t, wantCounts, counts, "%q", b)
		}
		// DecodeStoredHead is StoredHead and a decode of its head, in one
		// check of the head's bytes.
		var got, want projections.Execution
		gotCounts, gotOK := projections.DecodeStoredHead(b, &got)
		wantDecoded := ok && json.Unmarshal(head, &want) == nil
		require.Equal(t, wantDecoded, gotOK, "%q", b)
		if gotOK {
			require.Equal(t, want, got, "%q", b)
			require.Equal(t, counts, gotCounts, "%q", b)
		}
	})
}

// TestStoredHeadThatDoesNotDecode: a member nested exactly as deep as
// encoding/json allows (10,000) was a value to the v1 implementation's
// Decoder, read alone, but makes a head one level too deep to decode
// (the v2 implementation's Decoder, Go 1.27's, counts the object
// the member is in, and refuses it too): StoredHead refuses it (its
// callers then decode the document whole, and fail as they did on the
// head), and takes one a level shallower.
func TestStoredHeadThatDoesNotDecode(t *testing.T) {
	t.Parallel()
	doc := func(depth int) []byte {
		v := strings.Repeat("[", depth) + strings.Repeat("]", depth)
		return []byte(`{"a":` + v + `,"step_counts":{"steps":1,"done":0},"steps":[]}`)
	}
	_, _, tokensOK := storedHeadByTokens(doc(10000))
	require.Equal(t, !events.JSONv2, tokensOK)
	_, _, ok := projections.StoredHead(doc(10000))
	require.False(t, ok)
	var x struct{ A any }
	_, ok = projections.DecodeStoredHead(doc(10000), &x)
	require.False(t, ok, "nor does it decode")
	head, counts, ok := projections.StoredHead(doc(9999))
	require.True(t, ok)
	require.Equal(t, projections.StepCounts{Steps: 1}, counts)
	require.True(t, json.Valid(head))
	counts, ok = projections.DecodeStoredHead(doc(9999), &x)
	require.True(t, ok)
	require.Equal(t, projections.StepCounts{Steps: 1}, counts)
}

// BenchmarkDecodeStoredHead: decoding a one-step execution's stored
// model's head (most of such a model), as the janitor's index and the
// visibility index do at each write of a model, with StoredHead and a
// decode, or with DecodeStoredHead.
func BenchmarkDecodeStoredHead(b *testing.B) {
	x := projections.Execution{ID: "bench-timers-1764903000000000000-4242", Workflow: "bench-timers", Version: 1,
		Status: projections.StatusStarted, Input: json.RawMessage(`{"due":"2026-12-05T03:40:00.123456789Z"}`),
		StartedAt: time.Date(2026, 12, 5, 3, 39, 30, 0, time.UTC), UpdatedAt: time.Date(2026, 12, 5, 3, 39, 30, 0, time.UTC),
		LastSeq: 123456, Events: 3, Timers: map[string]projections.Timer{"nap": {Due: time.Date(2026, 12, 5, 3, 40, 0, 0, time.UTC), Purpose: "sleep"}},
		Steps: []projections.Step{{ID: "nap", Status: projections.OpStarted}}}
	doc, err := projections.EncodeStored(x, nil)
	require.NoError(b, err)
	type head struct {
		ID        string             `json:"id"`
		Workflow  string             `json:"workflow"`
		Status    projections.Status `json:"status"`
		LastSeq   uint64             `json:"last_seq"`
		UpdatedAt time.Time          `json:"updated_at"`
	}
	b.Run("StoredHead+Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var h head
			hd, _, ok := projections.StoredHead(doc)
			if !ok || json.Unmarshal(hd, &h) != nil {
				b.Fatal("no head")
			}
		}
	})
	b.Run("DecodeStoredHead", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var h head
			if _, ok := projections.DecodeStoredHead(doc, &h); !ok {
				b.Fatal("no head")
			}
		}
	})
}
