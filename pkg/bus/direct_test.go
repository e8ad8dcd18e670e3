package bus_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
)

// TestParseTaskAck: the acknowledgement subject a report handed straight
// to a dispatcher names is read in both of JetStream's forms, and only a
// delivery from the tasks stream is taken.
func TestParseTaskAck(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		subject string
		want    bus.TaskAck
		err     string
	}{
		{subject: "$JS.ACK.JF_TASKS.agent-default.1.42.7.1700000000000000000.0", want: bus.TaskAck{Consumer: "agent-default", Seq: 42}},
		{subject: "$JS.ACK._.ABCHASH.JF_TASKS.bulk-agent-gpu.2.9.3.1700000000000000000.5.xyz", want: bus.TaskAck{Consumer: "bulk-agent-gpu", Seq: 9}},
		{subject: "$JS.ACK.dom.ABCHASH.JF_TASKS.agent-default.1.11.1.1700000000000000000.0", want: bus.TaskAck{Consumer: "agent-default", Seq: 11}},
		{subject: "$JS.ACK.JF_EVENTS.projector.1.42.7.1700000000000000000.0", err: "not of JF_TASKS"},
		{subject: "$JS.ACK.JF_TASKS.agent-default.1.x.7.1700000000000000000.0", err: "no consumer or stream sequence"},
		{subject: "$JS.ACK.JF_TASKS.agent-default.1.0.7.1700000000000000000.0", err: "no consumer or stream sequence"},
		{subject: "$JS.ACK.JF_TASKS.agent-default.1.42", err: "tokens"},
		{subject: "jf.tasks.default", err: "does not begin with"},
		{subject: "", err: "does not begin with"},
	} {
		got, err := bus.ParseTaskAck(c.subject)
		if c.err != "" {
			require.ErrorContains(t, err, c.err, c.subject)
			continue
		}
		require.NoError(t, err, c.subject)
		require.Equal(t, c.want, got, c.subject)
	}
}

// TestDirectSubjects: a direct report's subject names its queue, its
// execution's partition and the execution; a partition's holder takes
// those of every queue, an agent's permission covers its queue's.
func TestDirectSubjects(t *testing.T) {
	t.Parallel()
	require.Equal(t, "jf.direct.gpu.3.x1", bus.DirectResultSubject("gpu", 3, "x1"))
	require.Equal(t, "jf.direct.*.3.*", bus.DirectResults(3))
	require.Equal(t, "jf.direct.gpu.*.*", bus.DirectQueueSubjects("gpu"))
	for _, s := range bus.Streams(bus.Config{}) {
		for _, subj := range s.Subjects {
			require.NotContains(t, subj, bus.DirectPrefix, "no stream stores direct reports")
			require.NotEqual(t, "jf.>", subj, "no stream stores direct reports")
		}
	}
}
