package projector

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
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
	require.Equal(t, projections.StepCounts{Steps: 5, Done: 5}, c)
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
// instance that encoding/json writes, or of the struct one points to,
// changes its fingerprint, so a field added to projections.Step (or to
// projections.AfterEnd) and not to stepPrint fails here rather than
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

	// changed returns v's value changed, of the same length where it has
	// one (a longer one would be told apart by its length alone).
	changed := func(t *testing.T, name string, v reflect.Value) reflect.Value {
		out := reflect.New(v.Type()).Elem()
		switch {
		case v.Type() == reflect.TypeFor[time.Time]():
			out.Set(reflect.ValueOf(v.Interface().(time.Time).Add(time.Nanosecond)))
		case v.Type() == reflect.TypeFor[json.RawMessage]():
			b := json.RawMessage(`1`)
			if n := v.Len(); n >= 2 { // a string as long
				b = json.RawMessage(`"` + strings.Repeat("x", n-2) + `"`)
			}
			out.Set(reflect.ValueOf(b))
		case v.Kind() == reflect.String:
			b := []byte(v.String())
			if len(b) == 0 {
				b = []byte("x")
			} else {
				b[0] ^= 1
			}
			out.SetString(string(b))
		case v.Kind() == reflect.Int:
			out.SetInt(v.Int() + 1)
		case v.Kind() == reflect.Uint64:
			out.SetUint(v.Uint() + 1)
		case v.Kind() == reflect.Bool:
			out.SetBool(!v.Bool())
		default:
			t.Fatalf("field %s of type %s: teach this test to change it, and stepPrint to cover it", name, v.Type())
		}
		return out
	}
	check := func(t *testing.T, name string, st projections.Step) {
		a, err := json.Marshal(base)
		require.NoError(t, err)
		b, err := json.Marshal(st)
		require.NoError(t, err)
		require.NotEqual(t, string(a), string(b), "field %s: the change must show in the encoding", name)
		require.NotEqual(t, stepPrint(&base), stepPrint(&st), "field %s changed, and its fingerprint did not", name)
	}
	typ := reflect.TypeFor[projections.Step]()
	checked := 0
	for i := range typ.NumField() {
		f := typ.Field(i)
		if !f.IsExported() || f.Tag.Get("json") == "-" {
			continue
		}
		if f.Type.Kind() == reflect.Pointer { // none, and each field of what it points to changed
			st := base
			reflect.ValueOf(&st).Elem().Field(i).SetZero()
			check(t, f.Name+" (none)", st)
			elem := f.Type.Elem()
			for k := range elem.NumField() {
				st := base
				p := reflect.New(elem)
				p.Elem().Set(reflect.ValueOf(&base).Elem().Field(i).Elem())
				p.Elem().Field(k).Set(changed(t, f.Name+"."+elem.Field(k).Name, p.Elem().Field(k)))
				reflect.ValueOf(&st).Elem().Field(i).Set(p)
				check(t, f.Name+"."+elem.Field(k).Name, st)
				checked++
			}
			continue
		}
		st := base
		v := reflect.ValueOf(&st).Elem().Field(i)
		v.Set(changed(t, f.Name, v))
		check(t, f.Name, st)
		checked++
	}
	require.Greater(t, checked, 30)
}

// TestStepCacheForgetsAfterAnError: a table that fails to encode leaves
// the cache empty, so that no later table is given an encoding of
// another instance (an encoding kept beside the wrong fingerprint).
func TestStepCacheForgetsAfterAnError(t *testing.T) {
	t.Parallel()
	c := &stepCache{}
	steps := sampleModel(cacheStepsOver + 8).Steps
	_, err := c.encode(steps)
	require.NoError(t, err)
	bad := append(slices.Clone(steps), sampleStep(100), sampleStep(101))
	bad[len(bad)-1].Output = json.RawMessage(`{bad`)
	_, err = c.encode(bad)
	require.Error(t, err)
	require.Equal(t, len(c.prints), len(c.enc))
	good := append(slices.Clone(steps), sampleStep(100), sampleStep(101))
	for _, out := range []string{`"B"`, `"A"`} {
		good[len(steps)].Output = json.RawMessage(out)
		got, err := c.encode(good)
		require.NoError(t, err)
		want, err := json.Marshal(good)
		require.NoError(t, err)
		require.Equal(t, string(want), string(got))
	}
}

// TestProjectedModelWithKeptEncodings: a 40-step execution's events
// applied one by one in place, as the projector applies them, and its
// read model written after each with the encodings kept, is at every
// write the model encoded anew.
func TestProjectedModelWithKeptEncodings(t *testing.T) {
	t.Parallel()
	const n = cacheStepsOver + 8
	at := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	var refs []events.StepRef
	for i := range n {
		refs = append(refs, events.StepRef{ID: fmt.Sprintf("s%02d", i), Kind: "noop"})
	}
	evs := []events.Event{events.New("test", "x", "wf", at, &events.ExecutionStarted{Workflow: "wf", Version: 1, Steps: refs, Token: "t"})}
	for i, r := range refs {
		at = at.Add(time.Millisecond)
		evs = append(evs,
			events.New("test", "x", "wf", at, &events.StepScheduled{StepID: r.ID, Attempt: 1}),
			events.New("test", "x", "wf", at, &events.StepSending{StepID: r.ID, Attempt: 1, TaskID: r.ID + ".1", Queue: "q"}),
			events.New("test", "x", "wf", at, &events.StepSent{StepID: r.ID, Attempt: 1, TaskID: r.ID + ".1", TaskSeq: uint64(i + 1)}),
			events.New("test", "x", "wf", at, &events.StepStarted{StepID: r.ID, Attempt: 1, Agent: "a"}),
			events.New("test", "x", "wf", at, &events.StepSucceeded{StepID: r.ID, Attempt: 1, Output: json.RawMessage(fmt.Sprintf(`{"i":%d}`, i))}))
	}
	evs = append(evs, events.New("test", "x", "wf", at, &events.ExecutionSucceeded{}))
	var x projections.Execution
	c := &stepCache{}
	for i, ev := range evs {
		ev.Seq = uint64(i + 1)
		var err error
		x, err = projections.ApplyOwned(x, ev)
		require.NoError(t, err, "event %d", i)
		if i%2 == 0 && i != len(evs)-1 { // a write every other event, as under load
			continue
		}
		got, err := encodeModel(x, c)
		require.NoError(t, err)
		want, err := projections.EncodeStored(x, nil)
		require.NoError(t, err)
		require.Equal(t, string(want), string(got), "after event %d", i)
	}
	require.Equal(t, projections.StatusSucceeded, x.Status)
	require.Len(t, c.enc, n)
}

// TestTruncationLeavesRetiredInstancesOutFirst: a read model too large
// for its limit leaves out the instances a move to another version
// retired first, and says how many apart from the step table's: they
// count neither in its steps nor in those done, as when they are kept.
func TestTruncationLeavesRetiredInstancesOutFirst(t *testing.T) {
	t.Parallel()
	x := sampleModel(20)
	for i := 15; i < 20; i++ {
		x.Steps[i].Status = projections.OpStarted
	}
	kept, err := marshalModel(x, 1<<20, nil)
	require.NoError(t, err)
	for i := range 50 {
		st := sampleStep(100 + i)
		st.Output = json.RawMessage(`"` + strings.Repeat("r", 1000) + `"`)
		x.RetiredSteps = append(x.RetiredSteps, st)
	}
	b, err := marshalModel(x, len(kept)+100, nil)
	require.NoError(t, err)
	require.LessOrEqual(t, len(b), len(kept)+100)
	var got decoded
	require.NoError(t, json.Unmarshal(b, &got))
	require.Equal(t, &projections.Truncation{Retired: 50}, got.Truncated)
	require.Empty(t, got.RetiredSteps)
	require.Len(t, got.Steps, 20, "the step table is whole")
	require.Equal(t, &projections.StepCounts{Steps: 20, Done: 15}, got.StepCounts)
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
