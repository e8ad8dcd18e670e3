// Package historytest checks execution histories in tests: the invariant
// that a history is linear, shared by the dispatcher's tests and the
// end-to-end tests so that both check the same thing.
package historytest

import (
	"testing"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
)

// Linear returns an error unless evs, read in stream order from the start
// of one execution's history, is linear: see [history.Linear].
func Linear(evs []events.Event) error { return history.Linear(evs) }

// RequireLinear fails the test at once unless [Linear] accepts evs.
func RequireLinear(t testing.TB, evs []events.Event) {
	t.Helper()
	if err := Linear(evs); err != nil {
		t.Fatal(err)
	}
}
