package events_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/events/eventstest"
)

// TestLockEventsRoundTrip covers the lock and the expiry events.
func TestLockEventsRoundTrip(t *testing.T) {
	t.Parallel()

	for _, p := range []events.Payload{
		&events.LockRequested{Lock: "apt-web-1", Path: "install", Limit: 3},
		&events.LockAcquired{Lock: "apt-web-1", Path: "install"},
		&events.LockReleased{Lock: "db", Reason: "the execution ends"},
		&events.LockCleared{ActionRecord: events.ActionRecord{Action: "clear-lock", Reason: "stuck", RequestedBy: "alice", Command: "cli#1"},
			Lock: "db", Path: "each[2]/blk"},
		&events.ClearLock{Lock: "db", Entries: []events.LockEntry{{ExecutionID: "x1", Workflow: "deploy", Path: "blk", Request: 2}},
			OnlyEnded: true, Reason: "holder ended", RequestedBy: "jetflow/janitor"},
		&events.ExpireExecution{ExecutionID: "x1", Workflow: "deploy", LastSeq: 41, Rule: "3", Group: "deploy"},
		&events.ExecutionExpired{Rule: "3", Group: "deploy", RequestedBy: "jetflow/janitor"},
	} {
		t.Run(typeName(p.EventType()), func(t *testing.T) {
			t.Parallel()
			ev := eventstest.Event(p)
			msg, err := events.Encode("jf.events.deploy.x1", ev)
			require.NoError(t, err)
			require.Equal(t, string(p.EventType()), msg.Header.Get("ce-type"))
			got, err := events.Decode(msg.Header, msg.Data)
			require.NoError(t, err)
			requireSameEvent(t, ev, got)
		})
	}
}

func TestValidLockName(t *testing.T) {
	t.Parallel()

	for _, ok := range []string{"db", "apt-web-1", "A.b_c-d", "9lives", "x.y.z"} {
		require.True(t, events.ValidLockName(ok), ok)
	}
	for _, bad := range []string{"", ".a", "a.", "a..b", "-a", "a b", "a/b", "a*", "a>", string(make([]byte, 129))} {
		require.False(t, events.ValidLockName(bad), bad)
	}
}
