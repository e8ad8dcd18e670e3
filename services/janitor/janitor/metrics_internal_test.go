package janitor

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
)

// TestFailedTasksAreCountedOnce: a task's failure the janitor reports
// again (a sweep, an advisory redelivered) is dropped by the results
// stream as a repeat, and counted once, by why.
func TestFailedTasksAreCountedOnce(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	j, err := New(Config{}, js, zerolog.Nop())
	require.NoError(t, err)
	ref := events.TaskRef{TaskID: events.TaskID("x", "ship", 1), ExecutionID: "x", Workflow: "wf", StepID: "ship", Attempt: 1, Queue: "default", Agent: "janitor"}
	for range 2 {
		require.NoError(t, j.fail(t.Context(), ref, failVanished, "gone"))
		require.NoError(t, j.fail(t.Context(), ref, failLost, "deliveries exhausted"))
	}
	require.Equal(t, 1.0, testutil.ToFloat64(j.metrics.failedTasks.WithLabelValues(failVanished)))
	require.Equal(t, 1.0, testutil.ToFloat64(j.metrics.failedTasks.WithLabelValues(failLost)))
}

// TestSweepEndedCountsWhatASweepDid: a sweep's errors are counted,
// failed or not; the idle executions it looked at only for one that
// ended well (a failed one leaves the last good sweep's).
func TestSweepEndedCountsWhatASweepDid(t *testing.T) {
	t.Parallel()
	m, err := newMetrics(nil)
	require.NoError(t, err)
	began := time.Now()
	m.sweepEnded(began, began.Add(time.Second), Result{Checked: 3, Errors: 2}, nil)
	require.Equal(t, 3.0, testutil.ToFloat64(m.idle))
	require.Equal(t, 2.0, testutil.ToFloat64(m.sweepErrors))
	m.sweepEnded(began, began.Add(time.Second), Result{Checked: 1, Errors: 1}, errors.New("no executions bucket"))
	require.Equal(t, 3.0, testutil.ToFloat64(m.idle), "a failed sweep's partial look is not the count")
	require.Equal(t, 3.0, testutil.ToFloat64(m.sweepErrors))
	require.Equal(t, 1.0, testutil.ToFloat64(m.sweeps.WithLabelValues(sweepFailed)))
}
