package dispatch_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/dispatcher/dispatch"
)

// tasksOn counts the tasks stored on each subject of the tasks stream
// (nil when it cannot be read just now).
func tasksOn(t *testing.T, js jetstream.JetStream) map[string]uint64 {
	t.Helper()
	s, err := js.Stream(t.Context(), bus.StreamTasks)
	if err != nil {
		return nil
	}
	info, err := s.Info(t.Context(), jetstream.WithSubjectFilter(bus.TasksPrefix+".>"))
	if err != nil {
		return nil
	}
	delete(info.State.Subjects, bus.TasksKeeperSubject) // not a task (keeper.go)
	return info.State.Subjects
}

// TestAFanOutGoesToTheBulkLane: of a foreach's 20 operations sent at once,
// the first BulkAfter go to the queue's lane and the rest, sent while
// the execution had that many in flight there, to its bulk lane; with
// NoBulkLane they all go to the lane.
func TestAFanOutGoesToTheBulkLane(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name             string
		bulkAfter        int
		normal, bulkLane uint64
	}{
		{"BulkAfter5", 5, 5, 15},
		{"NoBulkLane", dispatch.NoBulkLane, 20, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			runDispatcher(t, b.js, dispatch.Config{BulkAfter: tc.bulkAfter})
			d, err := workflow.Parse([]byte(`
name: fan
steps:
  - id: each
    kind: foreach
    items: ${0..19}
    concurrency: 20
    steps:
      - {id: work, kind: noop}
`))
			require.NoError(t, err)
			_, _, err = b.defs.Apply(t.Context(), d)
			require.NoError(t, err)
			b.start(t, "fan", "f1")
			normal, bulk := bus.TaskSubject(workflow.DefaultQueue), bus.BulkTaskSubject(workflow.DefaultQueue)
			var got map[string]uint64
			natstest.Eventually(t, waitFor, func() bool {
				got = tasksOn(t, b.js)
				return got[normal]+got[bulk] >= 20
			}, "20 tasks sent")
			want := withoutZeros(map[string]uint64{normal: tc.normal, bulk: tc.bulkLane})
			require.Equal(t, want, withoutZeros(got))
		})
	}
}

func withoutZeros(m map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range m {
		if v > 0 {
			out[k] = v
		}
	}
	return out
}
