package projector

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/projections"
)

// sampleStep is a step instance with every field encoding/json writes
// set, different for each i.
func sampleStep(i int) projections.Step {
	at := time.Date(2026, 12, 3, 10, 0, i, 0, time.UTC)
	return projections.Step{ID: fmt.Sprintf("s%d", i), Kind: "operation", Status: projections.OpSucceeded, Attempt: 1 + i%3,
		TaskID: fmt.Sprintf("t%d", i), TaskSeq: uint64(100 + i), Queue: "q", Agent: "a", Delivery: 1,
		Input: json.RawMessage(fmt.Sprintf(`{"n":%d,"html":"<b>&</b>"}`, i)), Output: json.RawMessage(`{"ok":true}`),
		Error: "", Child: "", ChildWorkflow: "", Token: "tok", RetryBase: 0, Entered: 2 * i, Completed: 2*i + 1,
		ScheduledAt: at, SentAt: at, StartedAt: at, EndedAt: at.Add(time.Millisecond)}
}

func sampleModel(steps int) projections.Execution {
	x := projections.Execution{ID: "e1", Workflow: "wf", Version: 2, Status: projections.StatusStarted,
		Input: json.RawMessage(`{"a":1}`), Vars: map[string]json.RawMessage{"v": json.RawMessage(`"x"`)},
		StartedAt: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC), LastSeq: 42, Events: 7}
	for i := range steps {
		x.Steps = append(x.Steps, sampleStep(i))
	}
	return x
}

// decoded is a stored model decoded, with its step counts.
type decoded struct {
	projections.Execution
	StepCounts *projections.StepCounts `json:"step_counts"`
}

// TestEncodeModelStoresTheExecution: a stored model decodes to the
// execution it encodes, whatever its steps (none, an empty table, some),
// counts the table's instances and those that succeeded, and ends with
// the table, after its counts.
func TestEncodeModelStoresTheExecution(t *testing.T) {
	t.Parallel()
	for _, n := range []int{-1, 0, 1, 5} {
		x := sampleModel(max(n, 0))
		if n == 0 {
			x.Steps = []projections.Step{}
		}
		if n == 5 {
			x.Steps[2].Status = projections.OpFailed
		}
		b, err := encodeModel(x, &stepCache{})
		require.NoError(t, err)
		require.True(t, json.Valid(b), "%s", b)
		var got decoded
		require.NoError(t, json.Unmarshal(b, &got))
		want, err := json.Marshal(x)
		require.NoError(t, err)
		again, err := json.Marshal(got.Execution)
		require.NoError(t, err)
		require.JSONEq(t, string(want), string(again))
		require.NotNil(t, got.StepCounts, "%s", b)
		require.Equal(t, projections.CountSteps(x.Steps), *got.StepCounts)
		i := bytes.Index(b, []byte(`"step_counts":`))
		j := bytes.Index(b, []byte(`"steps":[`))
		if x.Steps == nil {
			j = bytes.Index(b, []byte(`"steps":null}`))
		}
		require.True(t, i > 0 && j > i, "the counts, then the table: %s", b)
		require.True(t, bytes.HasSuffix(b, []byte("]}")) || bytes.HasSuffix(b, []byte("null}")), "the table last: %s", b)
	}
	c := projections.CountSteps(sampleModel(5).Steps)
	require.Equal(t, projections.StepCounts{Steps: 5, Succeeded: 5}, c)
}

// TestStepCacheEncodesAsAnew: through a random run of changes to a
// model's steps (one changed, added, removed, replaced, the table
// emptied or made nil), the table encoded with the cache kept between
// writes is always the table encoded anew.
func TestStepCacheEncodesAsAnew(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	c := &stepCache{}
	steps := sampleModel(cacheStepsOver + 8).Steps
	for round := range 2000 {
		switch k := rng.IntN(10); {
		case k < 5 && len(steps) > 0: // one instance changes, in place (as the projector applies)
			i := rng.IntN(len(steps))
			st := &steps[i]
			switch rng.IntN(5) {
			case 0:
				st.Status = projections.OpFailed
			case 1:
				st.Output = json.RawMessage(fmt.Sprintf(`{"round":%d}`, round))
			case 2:
				st.Attempt++
			case 3:
				st.AfterEnd = &projections.AfterEnd{Outcome: projections.OpSucceeded, At: time.Unix(int64(round), 0).UTC()}
			case 4:
				st.EndedAt = st.EndedAt.Add(time.Second)
			}
		case k < 7:
			steps = append(steps, sampleStep(round))
		case k < 8 && len(steps) > 0:
			steps = steps[:rng.IntN(len(steps))]
		case k < 9 && len(steps) > 1: // a whole new table (a replay, a refold)
			steps = sampleModel(rng.IntN(3 * cacheStepsOver)).Steps
		default:
			if rng.IntN(2) == 0 {
				steps = nil
			} else {
				steps = []projections.Step{}
			}
		}
		got, err := c.encode(steps)
		require.NoError(t, err)
		want, err := json.Marshal(steps)
		require.NoError(t, err)
		require.Equal(t, string(want), string(got), "round %d", round)
		require.Equal(t, len(c.prints), len(c.enc))
		if len(steps) > cacheStepsOver {
			require.Len(t, c.enc, len(steps), "a large table's encodings are kept")
			require.Positive(t, c.size())
		} else {
			require.Empty(t, c.enc, "a small table's are not")
		}
	}
}

// TestStepPrintCoversEveryField: a change to any field of a step
// instance that encoding/json writes changes its fingerprint, so a field
// added to projections.Step and not to stepPrint fails here rather than
// leaving a stale encoding in a read model; equal instances in other
// memory have the same one.
func TestStepPrintCoversEveryField(t *testing.T) {
	t.Parallel()
	base := sampleStep(3)
	base.AfterEnd = &projections.AfterEnd{Outcome: projections.OpFailed, Error: "e", Agent: "a", At: time.Unix(5, 0).UTC()}
	same := base
	same.Input = append(json.RawMessage(nil), base.Input...)
	same.AfterEnd = &projections.AfterEnd{Outcome: projections.OpFailed, Error: "e", Agent: "a", At: time.Unix(5, 0).UTC()}
	require.Equal(t, stepPrint(&base), stepPrint(&same))
	moved := base
	moved.ID, moved.Kind = "s", "3operation" // the same bytes, split elsewhere
	require.NotEqual(t, stepPrint(&base), stepPrint(&moved))
	zoned := base
	zoned.EndedAt = base.EndedAt.In(time.FixedZone("x", 3600)) // the same instant, encoded with another offset
	require.NotEqual(t, stepPrint(&base), stepPrint(&zoned))
	typ := reflect.TypeFor[projections.Step]()
	checked := 0
	for i := range typ.NumField() {
		f := typ.Field(i)
		if !f.IsExported() || f.Tag.Get("json") == "-" {
			continue
		}
		changes := []projections.Step{base, base}
		for k := range changes {
			v := reflect.ValueOf(&changes[k]).Elem().Field(i)
			switch {
			case f.Type == reflect.TypeFor[time.Time]():
				v.Set(reflect.ValueOf(v.Interface().(time.Time).Add(time.Duration(k + 1))))
			case f.Type == reflect.TypeFor[json.RawMessage]():
				v.Set(reflect.ValueOf(json.RawMessage(fmt.Sprintf(`{"other":%d}`, k))))
			case f.Type.Kind() == reflect.Pointer && k == 0:
				v.Set(reflect.Zero(f.Type)) // set to none
			case f.Type.Kind() == reflect.Pointer:
				e := reflect.New(f.Type.Elem())
				e.Elem().Set(v.Elem())
				e.Elem().Field(1).SetString("another") // AfterEnd.Error
				v.Set(e)
			case f.Type.Kind() == reflect.String:
				v.SetString(v.String() + "x")
			case f.Type.Kind() == reflect.Int:
				v.SetInt(v.Int() + int64(k+1))
			case f.Type.Kind() == reflect.Uint64:
				v.SetUint(v.Uint() + uint64(k+1))
			case f.Type.Kind() == reflect.Bool:
				v.SetBool(!v.Bool())
			default:
				t.Fatalf("field %s of type %s: teach this test to change it, and stepPrint to cover it", f.Name, f.Type)
			}
			a, err := json.Marshal(base)
			require.NoError(t, err)
			b, err := json.Marshal(changes[k])
			require.NoError(t, err)
			require.NotEqual(t, string(a), string(b), "field %s: the change must show in the encoding", f.Name)
			require.NotEqual(t, stepPrint(&base), stepPrint(&changes[k]), "field %s changed, and its fingerprint did not", f.Name)
		}
		checked++
	}
	require.Greater(t, checked, 25)
}

// BenchmarkEncodeModel encodes a 200-step read model after one instance
// changed, as the projector writes it: anew (every instance encoded)
// and with the instances' encodings kept.
func BenchmarkEncodeModel(b *testing.B) {
	for _, kept := range []bool{false, true} {
		b.Run(map[bool]string{false: "anew", true: "kept"}[kept], func(b *testing.B) {
			x := sampleModel(200)
			var c *stepCache
			if kept {
				c = &stepCache{}
			}
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				x.Steps[i%len(x.Steps)].Attempt++
				if _, err := encodeModel(x, c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
