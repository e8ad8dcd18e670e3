package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// TestLockCheckingSeedExample runs Brooklyn's "lock checking" example as
// examples/lock-checking.yaml writes it in jetflow: an execution holds
// the lock (asleep for an hour inside it); another tries to take the lock
// four times (lock_timeout, and a retry in on-error), then goes to
// lock-not-available, force-clears the lock with a clear-lock step, goes
// back to claim, gets the lock and ends. The cleared holder learns it in
// its history (lock.cleared, naming the step that asked and why), keeps
// sleeping without the lock, and does not take it back.
func TestLockCheckingSeedExample(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	def, err := os.ReadFile(filepath.Join("..", "..", "examples", "lock-checking.yaml"))
	require.NoError(t, err)
	s.apply(t, string(def))
	const name = "checking-first-example"

	_, err = s.c.Start(ctx, client.StartRequest{Workflow: "lock-checking", ID: "holder", Input: map[string]any{"hold": 1}})
	require.NoError(t, err)
	poll(t, doneAtLeast, "holder holds the lock", func() (bool, string) {
		l, err := s.c.Lock(ctx, name)
		if err != nil {
			return false, err.Error()
		}
		return len(l.Holders) == 1 && l.Holders[0].ExecutionID == "holder", strings.Join(entryIDs(l.Holders), ",")
	})

	checker := s.runToEnd(t, client.StartRequest{Workflow: "lock-checking", ID: "checker"})
	require.Equal(t, projections.StatusSucceeded, checker.Status, describe(checker))

	hist := s.history(t, "checker")
	var timedOut, clearAt, acquiredAfter int
	for i, ev := range hist {
		switch p := ev.Data.(type) {
		case *events.LockReleased:
			if p.Reason == "not acquired within 200ms (lock_timeout)" {
				timedOut++
			}
		case *events.StepSucceeded:
			if strings.HasPrefix(p.StepID, "clear~") && clearAt == 0 { // reached by a goto: a later round
				clearAt = i
				require.JSONEq(t, `{"lock":"`+name+`","cleared":[{"execution_id":"holder","path":"claim"}]}`, string(p.Output))
			}
		case *events.LockAcquired:
			if clearAt > 0 && acquiredAfter == 0 {
				acquiredAfter = i
			}
		}
	}
	require.GreaterOrEqual(t, timedOut, 4, "four tries, each leaving the queue: %v", typesOfEvents(hist))
	require.NotZero(t, clearAt, "the clear-lock step ran: %v", typesOfEvents(hist))
	require.NotZero(t, acquiredAfter, "the lock was acquired after the clear: %v", typesOfEvents(hist))
	ran := false
	for _, st := range checker.Steps {
		ran = ran || strings.HasPrefix(st.ID, "claim~") && strings.HasSuffix(st.ID, "/got-it") && st.Status == projections.OpSucceeded
	}
	require.True(t, ran, "a later round ran inside the lock: %s", describe(checker))

	// The holder was told, and goes on sleeping without the lock.
	var cleared *events.LockCleared
	for _, ev := range s.history(t, "holder") {
		if p, ok := ev.Data.(*events.LockCleared); ok {
			cleared = p
		}
	}
	require.NotNil(t, cleared, "the holder's history records the clear")
	require.Regexp(t, `^execution checker \(workflow lock-checking\), step clear~\d+$`, cleared.RequestedBy)
	require.Equal(t, "held too long; cleared by checker", cleared.Reason)
	holder, err := s.c.Execution(ctx, "holder")
	require.NoError(t, err)
	require.Equal(t, projections.StatusStarted, holder.Status)
	l, ok := holder.LockAt("claim")
	require.True(t, ok)
	require.Equal(t, projections.LockCleared, l.Status)
	poll(t, 20*time.Second, "nobody holds the lock once the checker is done", func() (bool, string) {
		l, err := s.c.Lock(ctx, name)
		var apiErr *client.Error
		if errors.As(err, &apiErr) && apiErr.Status == http.StatusNotFound {
			return true, ""
		}
		if err != nil {
			return false, err.Error()
		}
		return false, "holders " + strings.Join(entryIDs(l.Holders), ",") + " waiters " + strings.Join(entryIDs(l.Waiters), ",")
	})
}
