package visibility

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

func storedModel(t *testing.T, x projections.Execution) []byte {
	t.Helper()
	b, err := projections.EncodeStored(x, nil)
	require.NoError(t, err)
	return b
}

// TestDecodeHeadStopsAtTheStepTable: of a model stored with its step
// counts first, decodeHead reads the same row as decoding it whole
// (json.Unmarshal), without reading the table; it leaves any other model
// to the whole decoding.
func TestDecodeHeadStopsAtTheStepTable(t *testing.T) {
	t.Parallel()
	attrs := []workflow.SearchAttribute{{Name: "customer", From: workflow.SearchFromInput}, {Name: "tier", From: workflow.SearchFromVars}}
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	for n := range 40 {
		x := projections.Execution{ID: fmt.Sprintf("x%d", n), Workflow: "w", Version: 1 + n%3, Status: projections.StatusStarted,
			Input: json.RawMessage(`{"customer":"acme"}`), Vars: map[string]json.RawMessage{"tier": json.RawMessage(`"gold"`)},
			StartedAt: at, UpdatedAt: at.Add(time.Duration(n) * time.Second), Token: "t", LastSeq: uint64(n)}
		for i := range n {
			st := projections.OpSucceeded
			switch i % 4 {
			case 2:
				st = projections.OpSkipped
			case 3:
				st = projections.OpFailed
			}
			x.Steps = append(x.Steps, projections.Step{ID: fmt.Sprintf("s%d", i), Status: st, Output: json.RawMessage(`{"big":"x"}`)})
		}
		switch n % 5 {
		case 1:
			x.Status, x.EndedAt, x.Error = projections.StatusFailed, at.Add(time.Hour), "boom"
		case 2:
			x.Truncated = &projections.Truncation{Steps: 3}
		case 3:
			x.Damaged = &projections.Damage{Seq: 4, Reason: "bad"}
		case 4:
			x.Steps = []projections.Step{}
		}
		b := storedModel(t, x)
		head, ok := decodeHead(b)
		require.True(t, ok, "%s", b)
		var whole model
		require.NoError(t, json.Unmarshal(b, &whole))
		require.Nil(t, head.Steps, "the table is not read")
		require.Equal(t, whole.row(attrs), head.row(attrs), "%s", b)
		viaDecode, err := decodeModel(b)
		require.NoError(t, err)
		require.Equal(t, whole.row(attrs), viaDecode.row(attrs))
	}

	// Read whole: no counts, counts after the table, no table, a broken
	// document.
	x := projections.Execution{ID: "x", Workflow: "w", Version: 1, Status: projections.StatusSucceeded,
		Steps: []projections.Step{{ID: "a", Status: projections.OpSucceeded}, {ID: "b", Status: projections.OpSucceeded}}}
	plain, err := json.Marshal(x)
	require.NoError(t, err)
	for name, doc := range map[string]string{
		"no counts":          string(plain),
		"counts after":       `{"id":"x","steps":[{"status":"succeeded"}],"step_counts":{"steps":9,"done":9}}`,
		"no table":           `{"id":"x","status":"started","step_counts":{"steps":9,"done":9}}`,
		"broken before":      `{"id":"x","status":`,
		"not an object":      `[1,2]`,
		"counts not numbers": `{"id":"x","step_counts":{"steps":"many"},"steps":[]}`,
	} {
		_, ok := decodeHead([]byte(doc))
		require.False(t, ok, name)
	}
	m, err := decodeModel(plain)
	require.NoError(t, err)
	require.Equal(t, 2, m.row(nil).Done, "decoded whole")
	m, ok := decodeHead([]byte(`{"id":"x","Status":"failed","step_counts":{"steps":1,"done":0},"steps":[{"status":"failed"}]}`))
	require.True(t, ok)
	require.Equal(t, projections.StatusFailed, m.Status, "a member in another case, as json.Unmarshal reads it")
	require.Equal(t, 1, m.row(nil).Steps)
	_, err = decodeModel([]byte(`{"id":"x","status":`))
	require.Error(t, err)
}

// BenchmarkDecodeModel decodes the row's part of stored read models of
// 10 and 200 step instances: up to the table (decodeHead) and whole.
func BenchmarkDecodeModel(b *testing.B) {
	for _, n := range []int{10, 200} {
		x := projections.Execution{ID: "x", Workflow: "w", Version: 1, Status: projections.StatusStarted,
			Input: json.RawMessage(`{"customer":"acme"}`), StartedAt: time.Unix(1, 0).UTC(), LastSeq: 9}
		for i := range n {
			x.Steps = append(x.Steps, projections.Step{ID: fmt.Sprintf("s%d", i), Kind: "noop", Status: projections.OpSucceeded,
				Attempt: 1, TaskID: fmt.Sprintf("x.s%d.1", i), Queue: "local", Output: json.RawMessage(`{"ok":true}`),
				ScheduledAt: time.Unix(2, 0).UTC(), SentAt: time.Unix(2, 0).UTC(), EndedAt: time.Unix(3, 0).UTC()})
		}
		doc, err := projections.EncodeStored(x, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("head/%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := decodeHead(doc); !ok {
					b.Fatal("not stored")
				}
			}
		})
		b.Run(fmt.Sprintf("whole/%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var m model
				if err := json.Unmarshal(doc, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
