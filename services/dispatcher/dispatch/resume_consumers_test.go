package dispatch_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// TestConsumersDeletedUnderTheDispatcherAreBoundAgain: every consumer of
// a running dispatcher (the shared ones and every partition's) is
// deleted; the dispatcher makes them again and binds them, and an
// execution started afterwards runs to its end, its task sent and its
// report taken.
func TestConsumersDeletedUnderTheDispatcherAreBoundAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.register(t, "again", "a")
	b.start(t, "again", "before")
	b.finishTask(t, b.nextTask(t))
	waitStatus(t, b.js, "again", "before", projections.StatusSucceeded)

	n, err := bus.Partitions(t.Context(), b.js)
	require.NoError(t, err)
	d := bus.Durables{Partitions: n}
	all := bus.DispatcherConsumers(d)
	for p := range n {
		all = append(all, bus.PartitionConsumers(d, p)...)
	}
	for _, c := range all {
		require.NoError(t, b.js.DeleteConsumer(t.Context(), c.Stream, c.Config.Durable), c.Config.Durable)
	}
	natstest.Eventually(t, waitFor, func() bool {
		for _, c := range all {
			if _, err := b.js.Consumer(t.Context(), c.Stream, c.Config.Durable); err != nil {
				return false
			}
		}
		return true
	}, "every consumer made again")

	b.start(t, "again", "after")
	b.finishTask(t, b.nextTask(t))
	waitStatus(t, b.js, "again", "after", projections.StatusSucceeded)
}
