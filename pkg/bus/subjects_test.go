package bus_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
)

func TestSubjects(t *testing.T) {
	t.Parallel()

	require.Equal(t, "jf.events.deploy.x1", bus.ExecutionSubject("deploy", "x1"))
	require.Equal(t, "jf.events.deploy.*", bus.WorkflowSubjects("deploy"))
	require.Equal(t, "jf.events.*.x1", bus.ExecutionFilter("x1"))
	require.Equal(t, "jf.tasks.builders", bus.TaskSubject("builders"))
	require.Equal(t, "jf.results.gpu.x1", bus.ResultSubject("gpu", "x1"))
	require.Equal(t, "jf.results.*.*.x1", bus.ExecutionResults("x1"))
	require.Equal(t, "jf.results.*.x1", bus.ExecutionResultsBefore("x1"))
	require.Equal(t, "jf.results.gpu.7.x1", bus.StoredResultSubject("gpu", 7, "x1"))
	require.Equal(t, "jf.results.gpu.*.x1", bus.QueueResults("gpu", "x1"))
	require.Equal(t, "jf.timers.3.x1", bus.PartitionTimerSubject(3, "x1"))
	require.Equal(t, "jf.inbox.3.x1", bus.InboxSubject(3, "x1"))

	r := bus.RejectionSubject("cli#1")
	require.Equal(t, r, bus.RejectionSubject("cli#1"))
	require.NotEqual(t, r, bus.RejectionSubject("cli#2"))
	require.True(t, strings.HasPrefix(r, bus.RejectionsPrefix+"."))
	require.NotContains(t, strings.TrimPrefix(r, bus.RejectionsPrefix+"."), ".")
	// Pinned: the api finds rejections stored by the dispatcher, of this
	// version or an earlier one, by this subject.
	h := sha256.Sum256([]byte("cli#1"))
	require.Equal(t, "jf.rejections."+hex.EncodeToString(h[:12]), r)
}

func TestMoreSubjects(t *testing.T) {
	t.Parallel()

	require.Equal(t, "jf.timers.x1", bus.TimerSubject("x1"))
	require.Equal(t, "jf.schedules.t-1", bus.ScheduleSubject("t-1"))
	require.Equal(t, "jf.kills.x1", bus.KillSubject("x1"))
}

func TestParseExecutionSubject(t *testing.T) {
	t.Parallel()

	w, id, ok := bus.ParseExecutionSubject(bus.ExecutionSubject("deploy", "x1"))
	require.True(t, ok)
	require.Equal(t, "deploy", w)
	require.Equal(t, "x1", id)
	for _, s := range []string{"", "jf.events.deploy", "jf.events.deploy.x1.y", "jf.events.2deploy.x1", "jf.events.deploy.-x1",
		"jf.events.deploy.*", "jf.tasks.deploy.x1", "xx.events.deploy.x1"} {
		w, id, ok := bus.ParseExecutionSubject(s)
		require.False(t, ok, s)
		require.Empty(t, w+id, s)
	}
}
