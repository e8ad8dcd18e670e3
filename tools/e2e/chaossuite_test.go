package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/tools/internal/chaos"
)

// chaosBinaries builds nats-server and the four services for a chaos run.
func chaosBinaries(t *testing.T) chaos.Binaries {
	t.Helper()
	return chaos.Binaries{
		NATS: buildBinary(t, "github.com/nats-io/nats-server/v2", "nats-server"),
		API:  buildService(t, "api"), Dispatcher: buildService(t, "dispatcher"),
		Agent: buildService(t, "agent"), Janitor: buildService(t, "janitor"),
	}
}

// TestChaosSuiteShort is `make chaos` with small numbers: 60 mixed
// executions (exec, http, sleep, wait and signal, a mutex, a semaphore,
// foreach) through a standalone nats-server and the four services, each
// its own process with its own identity, while every one of them is
// SIGKILLed once, each kill landing while an operation runs. The checker
// must find no violation in any history, every execution but the wait
// never signalled must succeed, and the path where an operation runs
// again (its agent died under it) must have been taken.
func TestChaosSuiteShort(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos test: builds the programs and kills them")
	}
	t.Parallel()
	var progress strings.Builder
	rep, err := chaos.Run(t.Context(), chaos.Config{Bin: chaosBinaries(t), Dir: t.TempDir(),
		Executions: 60, Rate: 6, KillsPerKind: 1, MaxDowntime: 500 * time.Millisecond, Settle: time.Minute,
		Progress: &progress})
	require.NoError(t, err, progress.String())
	var out strings.Builder
	rep.Write(&out)
	t.Log("\n" + progress.String() + out.String())
	require.Empty(t, rep.Check.Violations)
	require.Empty(t, rep.Failures, "requests the api never accepted")
	require.Equal(t, 60, rep.Accepted)
	require.Equal(t, 60, rep.Check.Executions)
	require.Equal(t, map[string]int{"nats": 1, "api": 1, "dispatcher": 1, "agent": 1, "janitor": 1}, rep.KillsBy())
	require.Positive(t, rep.Check.RunTwice, "no operation ran again: the kills did not land while operations ran")
	require.Equal(t, 1, rep.Check.Waiting, "the wait never signalled, on purpose")
	require.Equal(t, 59, rep.Check.ByStatus[projections.StatusSucceeded], "failed: %v", rep.Check.FailedWhy)
}
