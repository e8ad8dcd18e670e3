package projections_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// TestFoldRetention: the workflow's rule comes with ExecutionStarted, and
// a step with retention: changes rule and group when it is scheduled; the
// events round-trip through the codec as stored events do.
func TestFoldRetention(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)
	mk := func(seq uint64, p events.Payload) events.Event {
		ev := events.New("test", "x1", "provision", at.Add(time.Duration(seq)*time.Second), p)
		ev.Seq = seq
		b, err := events.EncodeStructured(ev)
		require.NoError(t, err)
		back, err := decodeStructured(b)
		require.NoError(t, err)
		back.Seq = seq
		return back
	}
	started := mk(1, &events.ExecutionStarted{Workflow: "provision", Version: 1, Steps: []events.StepRef{{ID: "a", Kind: "noop"}, {ID: "keep", Kind: "workflow"}},
		Retention: &events.Retention{Rule: "max(parent, 6h)"}})
	x, err := projections.Fold([]events.Event{started})
	require.NoError(t, err)
	require.Equal(t, "max(parent, 6h)", x.Retention)
	require.Empty(t, x.RetentionKey)

	evs := []events.Event{started,
		mk(2, &events.StepScheduled{StepID: "a", Attempt: 1}),
		mk(3, &events.StepSkipped{StepID: "keep"}),
	}
	x, err = projections.Fold(evs)
	require.NoError(t, err)
	require.Equal(t, "max(parent, 6h)", x.Retention, "a step without retention changes nothing")

	evs[2] = mk(3, &events.StepScheduled{StepID: "keep", Attempt: 1, Retention: &events.Retention{Rule: "forever", Key: "provision failed"}})
	x, err = projections.Fold(evs)
	require.NoError(t, err)
	require.Equal(t, "forever", x.Retention)
	require.Equal(t, "provision failed", x.RetentionKey)

	none, err := projections.Fold([]events.Event{mk(1, &events.ExecutionStarted{Workflow: "provision", Version: 1})})
	require.NoError(t, err)
	require.Empty(t, none.Retention, "no rule: the system default applies")
}

// TestFoldExpired: execution.expired may only follow an end, and nothing
// may follow it, not even a resume, a replay or a lock event.
func TestFoldExpired(t *testing.T) {
	t.Parallel()
	begin := at(1, &events.ExecutionStarted{Workflow: "provision", Version: 1, Steps: []events.StepRef{{ID: "a", Kind: "noop"}}})
	expired := at(3, &events.ExecutionExpired{Rule: "1", Group: "provision", RequestedBy: "jetflow/janitor"})

	_, err := projections.Fold([]events.Event{begin, expired})
	var te *projections.TransitionError
	require.ErrorAs(t, err, &te, "a running execution cannot expire")

	for _, end := range []events.Payload{&events.ExecutionSucceeded{}, &events.ExecutionFailed{Error: "boom"},
		&events.ExecutionCancelled{ActionRecord: events.ActionRecord{Action: events.ActionForceCancel}}} {
		x, err := projections.Fold([]events.Event{begin, at(2, end), expired})
		require.NoError(t, err, "%T", end)
		require.Equal(t, expired.Time, x.ExpiredAt)
		require.True(t, x.Status.Terminal(), "the status stays the end's")

		for _, after := range []events.Payload{
			&events.ExecutionResumed{ActionRecord: events.ActionRecord{Action: events.ActionResume}, Token: "t2"},
			&events.ExecutionReplayed{ActionRecord: events.ActionRecord{Action: events.ActionReplay}, Token: "t2"},
			&events.LockCleared{Lock: "db"},
			&events.ExecutionExpired{Rule: "1"},
		} {
			_, err := projections.Fold([]events.Event{begin, at(2, end), expired, at(4, after)})
			require.ErrorAs(t, err, &te, "%T after expired", after)
			require.Equal(t, "expired", te.From)
		}
	}
}
