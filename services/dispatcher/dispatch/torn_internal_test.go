package dispatch

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/interp"
)

// TestAFailedAppendTearsTheState: an append applies its event to the
// execution's state in place before it writes it. When the write fails
// (here another writer moved the history underneath), the state is torn:
// nothing more is appended or carried out from it, even by a caller that
// goes past the error, and the handling runs again on the history read
// anew.
func TestAFailedAppendTearsTheState(t *testing.T) {
	t.Parallel()
	b := setupMem(t, Config{Workers: 2}, "name: tw\nsteps:\n  - {id: w, kind: wait, signal: go}\n")
	b.publish(t, bus.SubjectStart, &events.StartExecution{Workflow: "tw", ExecutionID: "t1"})
	subject := bus.ExecutionSubject("tw", "t1")
	var waiting projections.Execution
	natstest.Eventually(t, 15*time.Second, func() bool {
		evs, err := history.Read(t.Context(), b.js, subject, 0)
		if err != nil {
			return false
		}
		waiting, err = projections.Fold(evs)
		return err == nil && len(waiting.Steps) == 1 && waiting.Steps[0].Status == projections.OpWaiting
	}, "the execution waits for its signal")

	// A dispatcher of its own, not running: nothing else handles t1 through it.
	d, err := New(t.Context(), Config{Workers: 1, Member: "other"}, b.js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel))
	require.NoError(t, err)
	runs := 0
	err = d.withExecution(t.Context(), "tw", "t1", func(x *execState) error {
		if runs++; runs > 1 { // run again on the history read anew
			require.NoError(t, x.torn)
			require.Equal(t, projections.OpWaiting, x.state.Steps[0].Status, "read again: as the history says")
			require.JSONEq(t, `1`, string(x.state.Vars["k"]))
			return nil
		}
		require.Equal(t, waiting.LastSeq, x.state.LastSeq)
		steps := x.state.Steps
		// Another writer appends first.
		other := events.New("elsewhere", "t1", "tw", time.Now(), &events.VariablesSet{Vars: map[string]json.RawMessage{"k": json.RawMessage(`1`)}})
		other.PrevSeq = x.state.LastSeq
		_, err := history.Append(t.Context(), b.js, subject, x.state.LastSeq, other)
		require.NoError(t, err)

		err = d.append(t.Context(), x, &events.StepFailed{StepID: "w", Attempt: 1, Error: "given up"}, time.Time{})
		require.ErrorIs(t, err, bus.ErrConflict)
		require.Error(t, x.torn)
		require.Equal(t, projections.OpFailed, steps[0].Status, "applied in place before the write")

		err = d.append(t.Context(), x, &events.VariablesSet{Vars: map[string]json.RawMessage{"j": json.RawMessage(`2`)}}, time.Time{})
		require.ErrorIs(t, err, bus.ErrConflict, "nothing more is appended from a torn state")
		require.ErrorIs(t, d.carryOut(t.Context(), x, interp.Decision{After: []interp.Effect{interp.ArmTimer{}}}), bus.ErrConflict,
			"nor is a decision carried out")
		return nil // a caller that goes past the failure
	})
	require.NoError(t, err)
	require.Equal(t, 2, runs, "the handling ran again on the history read anew")

	evs, err := history.Read(t.Context(), b.js, subject, 0)
	require.NoError(t, err)
	require.Equal(t, events.TypeVariablesSet, evs[len(evs)-1].Type, "only the other writer's event was appended")
	require.Equal(t, waiting.LastSeq+1, evs[len(evs)-1].Seq)

	// An event the fold refuses (it may have changed the state part-way)
	// tears it too; the history has not moved, so only the tear stops the
	// next append. The refusal stays what the handling ends with: reading
	// the history again would not change it.
	runs = 0
	err = d.withExecution(t.Context(), "tw", "t1", func(x *execState) error {
		runs++
		err := d.append(t.Context(), x, &events.StepSucceeded{StepID: "nope", Attempt: 1}, time.Time{})
		var permanent permanentError
		require.ErrorAs(t, err, &permanent)
		require.Error(t, x.torn)
		err = d.append(t.Context(), x, &events.VariablesSet{Vars: map[string]json.RawMessage{"j": json.RawMessage(`2`)}}, time.Time{})
		require.ErrorAs(t, err, &permanent, "nothing more is appended from a torn state")
		_, err = d.perform(t.Context(), x, interp.ArmTimer{})
		require.ErrorAs(t, err, &permanent, "nor is an effect performed")
		return nil
	})
	var permanent permanentError
	require.ErrorAs(t, err, &permanent, "the refusal ends the handling")
	require.Equal(t, 1, runs, "not run again: the history would say the same")
	after, err := history.Read(t.Context(), b.js, subject, 0)
	require.NoError(t, err)
	require.Len(t, after, len(evs), "nothing was appended")
}
