package workflow

import (
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/expression"
)

// checkLock validates a lock and its semaphore (on the workflow, or on a
// workflow step). A literal name must be a valid lock name; an expression
// is checked when it is rendered.
func checkLock(add func(string, string, ...any), addErr func(string, error), f func(string) string, lock string, semaphore int, roots []string) {
	if semaphore != 0 {
		switch {
		case lock == "":
			add(f("semaphore"), "applies to a lock: give lock too")
		case semaphore < 1 || semaphore > events.MaxSemaphore:
			add(f("semaphore"), "must be between 1 and %d (how many may hold the lock at once)", events.MaxSemaphore)
		}
	}
	if lock == "" {
		return
	}
	if expression.IsTemplate(lock) {
		addErr(f("lock"), expression.Compile(lock, roots))
		return
	}
	if !events.ValidLockName(lock) {
		add(f("lock"), "%q is not a lock name: %s", lock, events.LockNameRule)
	}
}
