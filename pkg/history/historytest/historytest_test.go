package historytest_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history/historytest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// chain returns events whose (seq, prevseq) pairs are given.
func chain(pairs ...[2]uint64) []events.Event {
	evs := make([]events.Event, len(pairs))
	for i, p := range pairs {
		evs[i] = events.Event{Type: events.TypeStepSucceeded, Seq: p[0], PrevSeq: p[1]}
	}
	return evs
}

func TestLinear(t *testing.T) {
	t.Parallel()
	require.NoError(t, historytest.Linear(chain([2]uint64{3, 0}, [2]uint64{7, 3}, [2]uint64{8, 7})))
	for name, evs := range map[string][]events.Event{
		"Empty": nil,
		// Sequences increase, but the third event was appended after the
		// first, like the second: two writers appended at the same place.
		"Forked":         chain([2]uint64{3, 0}, [2]uint64{7, 3}, [2]uint64{8, 3}),
		"EventMissing":   chain([2]uint64{3, 0}, [2]uint64{9, 7}),
		"FirstHasPrev":   chain([2]uint64{3, 1}),
		"NotFromStream":  chain([2]uint64{0, 0}),
		"LaterHasNoPrev": chain([2]uint64{3, 0}, [2]uint64{7, 0}),
	} {
		t.Run(name, func(t *testing.T) {
			require.Error(t, historytest.Linear(evs))
		})
	}
}
