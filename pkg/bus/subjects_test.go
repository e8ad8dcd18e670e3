package bus_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
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
	require.Equal(t, "jf.timers.notices.3.x1", bus.PartitionNoticeSubject(3, "x1"))
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

// TestPartitionConsumersTakeTheirOwnSubjects: each consumer of partition
// p takes what is published for p, and nothing published for another
// partition; no two consumers of a work-queue stream (every consumer of
// a deployment) take one subject, which the server would refuse.
func TestPartitionConsumersTakeTheirOwnSubjects(t *testing.T) {
	t.Parallel()
	const n = 8
	d := bus.Durables{Partitions: n}
	subjects := map[string]func(p int) string{
		bus.PartitionNoticesConsumer(0): func(p int) string { return bus.PartitionNoticeSubject(p, "x1") },
		bus.PartitionInboxConsumer(0):   func(p int) string { return bus.InboxSubject(p, "x1") },
		bus.PartitionResultsConsumer(0): func(p int) string { return bus.StoredResultSubject("default", p, "x1") },
		bus.PartitionTimersConsumer(0):  func(p int) string { return bus.PartitionTimerSubject(p, "x1") },
	}
	kinds := bus.PartitionConsumers(d, 0)
	require.Len(t, kinds, len(subjects))
	for p := range n {
		for i, c := range bus.PartitionConsumers(d, p) {
			subject, ok := subjects[kinds[i].Config.Durable]
			require.True(t, ok, "no subject known for %s", kinds[i].Config.Durable)
			for q := range n {
				require.Equal(t, p == q, server.SubjectMatchesFilter(subject(q), c.Config.FilterSubject),
					"%s (filter %s) and %s", c.Config.Durable, c.Config.FilterSubject, subject(q))
			}
		}
	}
	all := bus.AllConsumers(d)
	for i, a := range all {
		for _, b := range all[i+1:] {
			if a.Stream != b.Stream || a.Stream == bus.StreamEvents {
				continue // the events stream is no work queue
			}
			require.False(t, server.SubjectsCollide(a.Config.FilterSubject, b.Config.FilterSubject),
				"%s (%s) and %s (%s) on %s", a.Config.Durable, a.Config.FilterSubject, b.Config.Durable, b.Config.FilterSubject, a.Stream)
		}
	}
}
