package agent

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAWorkerWaitsAtOnceOnlyAfterATaskAloneWhileTheBulkLaneIsIdle: the
// looks at both lanes are left out only when every condition holds: the
// worker's last task was alone on the normal lane, no task was taken from
// the bulk lane within bulkActive, and a look found the bulk lane empty
// within bulkRecheck.
func TestAWorkerWaitsAtOnceOnlyAfterATaskAloneWhileTheBulkLaneIsIdle(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	ago := func(d time.Duration) int64 { return now.Add(-d).UnixNano() }
	for _, c := range []struct {
		name            string
		alone           bool
		lastBulk, empty int64 // unix nanoseconds
		want            bool
	}{
		{"all hold", true, ago(bulkActive), ago(bulkRecheck / 2), true},
		{"never a bulk task", true, 0, ago(0), true},
		{"the last task had others behind it, or came from the bulk lane", false, ago(time.Hour), ago(0), false},
		{"a bulk task taken within bulkActive", true, ago(bulkActive / 2), ago(0), false},
		{"the bulk lane not looked at within bulkRecheck", true, ago(time.Hour), ago(bulkRecheck), false},
		{"the bulk lane never looked at", true, 0, 0, false},
	} {
		l := &lanes{queue: "q"}
		l.lastBulk.Store(c.lastBulk)
		l.bulkEmpty.Store(c.empty)
		require.Equal(t, c.want, l.waitAtOnce(&worker{alone: c.alone}, now), c.name)
	}
}
