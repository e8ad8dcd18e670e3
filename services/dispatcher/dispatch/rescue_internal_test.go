package dispatch

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/partition"
)

// A take that finds no trace of the lease does not look for what its last
// holder left: the dispatchers' bucket must keep an expiry's marker for
// longer than a rescue looks back (with the longest lease TTL), or a
// holder that died within the window would look like none.
func TestExpiryMarkersOutliveTheRescueWindow(t *testing.T) {
	t.Parallel()
	require.Less(t, rescueWindow+Ranges.LeaseTTL.Max, bus.DispatchersMarkerTTL)
	for _, c := range []struct {
		v    partition.Vacancy
		died bool
	}{{partition.VacancyNever, false}, {partition.VacancyReleased, false}, {partition.VacancyExpired, true}, {partition.VacancyUnknown, true}} {
		require.Equal(t, c.died, mayHaveDied(c.v), c.v.String())
	}
}
