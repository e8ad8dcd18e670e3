package bus_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
)

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
