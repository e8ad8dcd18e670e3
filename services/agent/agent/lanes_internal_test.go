package agent

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// TestAWorkerWaitsAtOnceOnlyAfterATaskAloneWhileTheBulkLaneIsIdle: the
// looks at both lanes are left out only when every condition holds: the
// worker's last task was alone on the normal lane, no task was taken from
// the bulk lane within bulkActive, and a look found the bulk lane empty
// within bulkRecheck.
func TestAWorkerWaitsAtOnceOnlyAfterATaskAloneWhileTheBulkLaneIsIdle(t *testing.T) {
	now := time.Now()
	const never = -1
	for _, c := range []struct {
		name            string
		alone           bool
		lastBulk, empty time.Duration // how long before now; never
		want            bool
	}{
		{"all hold", true, bulkActive, bulkRecheck / 2, true},
		{"never a bulk task", true, never, 0, true},
		{"the last task had others behind it, or came from the bulk lane", false, time.Hour, 0, false},
		{"a bulk task taken within bulkActive", true, bulkActive / 2, 0, false},
		{"the bulk lane not looked at within bulkRecheck", true, time.Hour, bulkRecheck, false},
		{"the bulk lane never looked at", true, never, never, false},
	} {
		l := &lanes{queue: "q"}
		if c.lastBulk != never {
			l.lastBulk.mark(now.Add(-c.lastBulk))
		}
		if c.empty != never {
			l.bulkEmpty.mark(now.Add(-c.empty))
		}
		require.Equal(t, c.want, l.waitAtOnce(&worker{alone: c.alone}, now), c.name)
	}
}

// TestAStampsAge: a stamp's age is the time since it was marked; never
// is older than any duration.
func TestAStampsAge(t *testing.T) {
	var s stamp
	require.Greater(t, s.age(time.Now()), 100*365*24*time.Hour, "never")
	now := time.Now()
	s.mark(now)
	require.Equal(t, time.Duration(0), s.age(now))
	require.Equal(t, time.Second, s.age(now.Add(time.Second)))
	s.mark(now.Add(time.Second))
	require.Equal(t, time.Duration(0), s.age(now.Add(time.Second)), "marked again")
}

// TestATaskIsAloneOnlyOnTheNormalLaneAtItsFirstDelivery: a task counts as
// alone when it came from the queue's normal lane, at its first delivery,
// with none pending behind it.
func TestATaskIsAloneOnlyOnTheNormalLaneAtItsFirstDelivery(t *testing.T) {
	alone := jetstream.MsgMetadata{Consumer: "agent-q", NumDelivered: 1, NumPending: 0}
	for _, c := range []struct {
		name   string
		change func(*jetstream.MsgMetadata)
		want   bool
	}{
		{"alone on the normal lane", func(*jetstream.MsgMetadata) {}, true},
		{"others behind it", func(md *jetstream.MsgMetadata) { md.NumPending = 1 }, false},
		{"delivered again", func(md *jetstream.MsgMetadata) { md.NumDelivered = 2 }, false},
		{"from the bulk lane", func(md *jetstream.MsgMetadata) { md.Consumer = "bulk-agent-q" }, false},
		{"another queue's", func(md *jetstream.MsgMetadata) { md.Consumer = "agent-other" }, false},
	} {
		md := alone
		c.change(&md)
		require.Equal(t, c.want, aloneOnNormal(&taskMsg{md: &md}, "q"), c.name)
	}
	require.False(t, aloneOnNormal(&taskMsg{}, "q"), "no metadata")
}
