package events_test

import (
	"reflect"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
)

// TestStepDispatchedIsScheduledAndSending: step.dispatched carries every
// field of step.scheduled and step.sending, and nothing else, each under
// the same JSON name and type, and gives both back whole: a field added
// to either later and forgotten here would be lost from the history.
func TestStepDispatchedIsScheduledAndSending(t *testing.T) {
	t.Parallel()
	fields := func(v any) map[string]reflect.Type {
		out := map[string]reflect.Type{}
		typ := reflect.TypeOf(v).Elem()
		for i := range typ.NumField() {
			out[typ.Field(i).Tag.Get("json")] = typ.Field(i).Type
		}
		return out
	}
	want := fields(&events.StepScheduled{})
	for k, v := range fields(&events.StepSending{}) {
		if have, ok := want[k]; ok {
			require.Equal(t, have, v, "%s is of one type in both", k)
		}
		want[k] = v
	}
	got := fields(&events.StepDispatched{})
	names := func(m map[string]reflect.Type) []string {
		var s []string
		for k := range m {
			s = append(s, k)
		}
		slices.Sort(s)
		return s
	}
	require.Equal(t, names(want), names(got))
	for k, v := range want {
		require.Equal(t, v, got[k], k)
	}

	// Filled in, it gives back both events with every field.
	d := &events.StepDispatched{StepID: "a", Kind: "noop", Attempt: 2, Input: []byte(`{"x":1}`),
		Retention: &events.Retention{}, TaskID: "x1.a.2", Queue: "q"}
	require.Equal(t, &events.StepScheduled{StepID: "a", Kind: "noop", Attempt: 2, Input: []byte(`{"x":1}`), Retention: &events.Retention{}}, d.Scheduled())
	require.Equal(t, &events.StepSending{StepID: "a", Attempt: 2, TaskID: "x1.a.2", Queue: "q"}, d.Sending())
}
