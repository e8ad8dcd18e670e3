package projections_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// seq numbers events as a stream would.
func seq(evs ...events.Event) []events.Event {
	for i := range evs {
		evs[i].Seq = uint64(10 + i)
		evs[i].ID = evs[i].ID + string(rune('a'+i))
	}
	return evs
}

// TestFoldQuarantined: an event that cannot be decoded, is unknown, or is
// illegal where it stands stops the fold there and marks the execution
// damaged, without an error; a repair recorded later in the history has
// the fold pass over it, and the execution goes on.
func TestFoldQuarantined(t *testing.T) {
	t.Parallel()
	sched := at(1, &events.StepScheduled{StepID: "a", Attempt: 1})
	broken := events.Event{ID: "bad", Type: "io.jetflow.step.succeeded", Subject: "x1", Invalid: "the CloudEvent has no source"}
	illegal := at(2, &events.StepSucceeded{StepID: "nope", Attempt: 1})
	unknown := events.Event{ID: "new", Type: "io.jetflow.from.the.future", Subject: "x1"}
	misfiled := at(2, &events.StepScheduled{StepID: "a", Attempt: 2})
	misfiled.Subject = "x2" // another execution's event, written into x1's history
	repair := func(ignore uint64) events.Event {
		return at(3, &events.ExecutionRepaired{IgnoreSeq: ignore, ActionRecord: events.ActionRecord{
			Action: events.ActionRepair, Reason: "written by hand", Command: "api#r"}})
	}
	for _, tt := range []struct {
		name    string
		bad     events.Event
		reason  string
		unknown bool
	}{
		{"Undecodable", broken, "no source", false},
		{"Illegal", illegal, "nope", false},
		{"UnknownType", unknown, "unknown event", true},
		{"Misfiled", misfiled, `names execution "x2", in the history of "x1"`, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			evs := seq(started("a"), sched, tt.bad, at(4, &events.StepSending{StepID: "a", Attempt: 1, TaskID: "x1.a.1", Queue: "default"}))
			_, err := projections.Fold(evs)
			require.Error(t, err, "the strict fold refuses it")

			x := projections.FoldQuarantined("x1", evs)
			require.NotNil(t, x.Damaged)
			require.Equal(t, uint64(12), x.Damaged.Seq)
			require.Contains(t, x.Damaged.Reason, tt.reason)
			require.NotContains(t, x.Damaged.Reason, "projections:", "said for people")
			require.Equal(t, tt.unknown, x.Damaged.Unknown)
			require.Equal(t, uint64(13), x.LastSeq, "the position moves past what is not applied")
			require.Equal(t, projections.OpPending, x.Steps[0].Status, "nothing after the damage is applied")

			// The repair is appended after everything: the fold passes over
			// the damaged event and applies the rest.
			fixed := projections.FoldQuarantined("x1", append(clone(evs), withSeq(repair(12), 14)))
			require.Nil(t, fixed.Damaged)
			require.Equal(t, projections.OpSending, fixed.Steps[0].Status)
			require.Equal(t, []uint64{12}, fixed.Repairs)
			require.Equal(t, uint64(14), fixed.LastSeq)
			require.Equal(t, events.ActionRepair, fixed.Actions[len(fixed.Actions)-1].Action)

			// A repair of another event leaves the damage where it is.
			still := projections.FoldQuarantined("x1", append(clone(evs), withSeq(repair(11), 14)))
			require.NotNil(t, still.Damaged)
			require.Equal(t, uint64(12), still.Damaged.Seq)
		})
	}
}

func clone(evs []events.Event) []events.Event { return append([]events.Event(nil), evs...) }

func withSeq(ev events.Event, n uint64) events.Event {
	ev.Seq = n
	return ev
}

// TestFoldQuarantinedOwner: a history's first event that names another
// execution does not make the history that execution's: the fold of x1's
// history is x1's, damaged at that event.
func TestFoldQuarantinedOwner(t *testing.T) {
	t.Parallel()
	foreign := started("a")
	foreign.Subject = "x2"
	x := projections.FoldQuarantined("x1", seq(foreign, at(1, &events.StepScheduled{StepID: "a", Attempt: 1})))
	require.Equal(t, "x1", x.ID)
	require.Equal(t, projections.StatusNone, x.Status)
	require.NotNil(t, x.Damaged)
	require.Equal(t, uint64(10), x.Damaged.Seq)
	require.Contains(t, x.Damaged.Reason, `names execution "x2"`)
	require.Equal(t, uint64(11), x.LastSeq)
}

// TestFoldQuarantinedPrefix: the state at an earlier point of a repaired
// history passes over the event the later repair names, as the whole
// fold does.
func TestFoldQuarantinedPrefix(t *testing.T) {
	t.Parallel()
	bad := events.Event{ID: "bad", Subject: "x1", Invalid: "not a CloudEvent"}
	evs := seq(started("a"), at(1, &events.StepScheduled{StepID: "a", Attempt: 1}), bad,
		at(2, &events.StepSending{StepID: "a", Attempt: 1, TaskID: "x1.a.1", Queue: "default"}),
		at(3, &events.ExecutionRepaired{IgnoreSeq: 12, ActionRecord: events.ActionRecord{Action: events.ActionRepair, Command: "api#r"}}))
	before := projections.FoldQuarantinedPrefix("x1", evs, 4)
	require.Nil(t, before.Damaged, "the repair recorded later counts")
	require.Equal(t, projections.OpSending, before.Steps[0].Status)
	require.Equal(t, 4, before.Events, "the position counts the event passed over")
	require.NotNil(t, projections.FoldQuarantined("x1", evs[:4]).Damaged, "without the repair in view it is damage")
	require.Equal(t, projections.FoldQuarantined("x1", evs), projections.FoldQuarantinedPrefix("x1", evs, 99))
}
