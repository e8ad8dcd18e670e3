// Package historytest checks execution histories in tests: the invariant
// that a history is linear, shared by the dispatcher's tests and the
// end-to-end tests so that both check the same thing.
package historytest

import (
	"errors"
	"fmt"
	"testing"

	"jetflow.dev/pkg/events"
)

// Linear returns an error unless every event of evs, read in stream order
// from the start of one execution's history, was appended right after the
// one before it: the first event names no previous event and each later
// one's PrevSeq is the Seq of the event before it. A history that forked
// (two events appended after the same event), that lost an event, or
// that was read in pieces out of order fails. Sequences that merely
// increase are not enough: an ordered consumer always gives those.
func Linear(evs []events.Event) error {
	if len(evs) == 0 {
		return errors.New("historytest: the history is empty")
	}
	var prev uint64
	for i, ev := range evs {
		if ev.Seq == 0 {
			return fmt.Errorf("historytest: event %d (%s) has no stream sequence: not read from the stream", i, ev.Type)
		}
		if ev.PrevSeq != prev {
			return fmt.Errorf("historytest: history not linear at event %d (%s, seq %d): appended after seq %d, not after the previous event (seq %d)",
				i, ev.Type, ev.Seq, ev.PrevSeq, prev)
		}
		prev = ev.Seq
	}
	return nil
}

// RequireLinear fails the test at once unless [Linear] accepts evs.
func RequireLinear(t testing.TB, evs []events.Event) {
	t.Helper()
	if err := Linear(evs); err != nil {
		t.Fatal(err)
	}
}
