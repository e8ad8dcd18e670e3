package workflow_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/workflow"
)

func TestParseLocks(t *testing.T) {
	t.Parallel()

	d, err := workflow.Parse([]byte(`
name: apt
lock: apt-${input.host}
semaphore: 2
steps:
  - id: install
    kind: workflow
    lock: dpkg
    steps:
      - id: run
        kind: noop
`))
	require.NoError(t, err)
	require.Equal(t, "apt-${input.host}", d.Lock)
	require.Equal(t, 2, d.Semaphore)
	require.Equal(t, "dpkg", d.Steps[0].Lock)
	require.Zero(t, d.Steps[0].Semaphore)
}

func TestParseLockErrors(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name, input, field, msg string
	}{
		{"BadLiteralName", "name: wf\nlock: a b\nsteps:\n  - id: a\n    kind: noop\n", "lock", "is not a lock name"},
		{"BadExpression", "name: wf\nlock: x-${nope.y}\nsteps:\n  - id: a\n    kind: noop\n", "lock", "nope"},
		{"SemaphoreWithoutLock", "name: wf\nsemaphore: 2\nsteps:\n  - id: a\n    kind: noop\n", "semaphore", "give lock too"},
		{"SemaphoreTooBig", "name: wf\nlock: x\nsemaphore: 1001\nsteps:\n  - id: a\n    kind: noop\n", "semaphore", "between 1 and 1000"},
		{"NegativeSemaphore", "name: wf\nlock: x\nsemaphore: -1\nsteps:\n  - id: a\n    kind: noop\n", "semaphore", "between 1 and 1000"},
		{"LockOnAnOperation", "name: wf\nsteps:\n  - id: a\n    kind: noop\n    lock: x\n", "steps[0].lock", "does not apply to a noop step (only to clear-lock, workflow)"},
		{"LockTimeoutWithoutLock", "name: wf\nsteps:\n  - id: b\n    kind: workflow\n    lock_timeout: 1m\n    steps:\n      - id: a\n        kind: noop\n",
			"steps[0].lock_timeout", "give lock too"},
		{"LockTimeoutNotADuration", "name: wf\nsteps:\n  - id: b\n    kind: workflow\n    lock: x\n    lock_timeout: soon\n    steps:\n      - id: a\n        kind: noop\n",
			"steps[0].lock_timeout", "is not a positive duration"},
		{"LockTimeoutOnAnOperation", "name: wf\nsteps:\n  - id: a\n    kind: noop\n    lock_timeout: 1m\n", "steps[0].lock_timeout", "does not apply to a noop step (only to workflow)"},
		{"ClearLockWithoutLock", "name: wf\nsteps:\n  - id: a\n    kind: clear-lock\n", "steps[0].lock", "is required for a clear-lock step"},
		{"ClearLockBadName", "name: wf\nsteps:\n  - id: a\n    kind: clear-lock\n    lock: \"a b\"\n", "steps[0].lock", "is not a lock name"},
		{"ClearLockSemaphore", "name: wf\nsteps:\n  - id: a\n    kind: clear-lock\n    lock: x\n    semaphore: 2\n", "steps[0].semaphore", "does not apply to a clear-lock step"},
		{"ClearLockBadReason", "name: wf\nsteps:\n  - id: a\n    kind: clear-lock\n    lock: x\n    reason: \"${nope.x}\"\n", "steps[0].reason", "nope"},
		{"ReasonOnALog", "name: wf\nsteps:\n  - id: a\n    kind: log\n    message: hi\n    reason: why\n", "steps[0].reason", "does not apply to a log step (only to clear-lock)"},
		{"StepSemaphoreWithoutLock", "name: wf\nsteps:\n  - id: b\n    kind: workflow\n    semaphore: 2\n    steps:\n      - id: a\n        kind: noop\n",
			"steps[0].semaphore", "give lock too"},
		{"StepBadName", "name: wf\nsteps:\n  - id: b\n    kind: workflow\n    lock: \"a..b\"\n    steps:\n      - id: a\n        kind: noop\n",
			"steps[0].lock", "is not a lock name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			requireProblem(t, tc.input, tc.field, tc.msg)
		})
	}
}
