package dispatch_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
	"jetflow.dev/services/internal/metrics/metricstest"
)

// TestGroupCommitRunsExecutions: with group commit, executions of local
// steps and timers run to success, every history linear and folding as
// without it, and their appends were written in atomic batches (their
// messages carry the batch's headers, which a reader ignores).
func TestGroupCommitRunsExecutions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var wf strings.Builder
	wf.WriteString("name: grouped\nsteps:\n")
	// Enough at once for appends to gather into batches. On a loaded
	// machine (the dispatcher's leases lapsing) 40 executions of 10 steps
	// took longer than waitFor: fewer, and a longer wait for the first.
	const pairs, executions = 3, 20
	for i := range pairs {
		fmt.Fprintf(&wf, "  - {id: n%d, kind: noop, local: true}\n  - {id: w%d, kind: sleep, duration: 20ms}\n", i, i)
	}
	b.applyYAML(t, wf.String())
	for i := range executions {
		b.start(t, "grouped", fmt.Sprintf("g%d", i))
	}
	// Started once the starts wait: they are handled at once.
	runDispatcher(t, b.js, dispatch.Config{GroupCommit: true})
	batched := 0
	for i := range executions {
		id := fmt.Sprintf("g%d", i)
		wait := waitFor
		if i == 0 {
			wait = 4 * waitFor // while the others run too
		}
		s, evs := waitStatusWithin(t, wait, b.js, "grouped", id, projections.StatusSucceeded)
		require.NoError(t, history.Linear(evs), id)
		require.Len(t, s.Steps, 2*pairs, id)
		for _, st := range s.Steps {
			require.Equal(t, projections.OpSucceeded, st.Status, "%s %s", id, st.ID)
		}
	}
	stream, err := b.js.Stream(t.Context(), bus.StreamEvents)
	require.NoError(t, err)
	info, err := stream.Info(t.Context())
	require.NoError(t, err)
	cons, err := stream.OrderedConsumer(t.Context(), jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	for read := uint64(0); read < info.State.Msgs; {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		got := 0
		for m := range batch.Messages() {
			got++
			if m.Headers().Get(jetstreamext.BatchIDHeader) != "" {
				batched++
			}
		}
		require.NoError(t, batch.Error())
		require.Positive(t, got, "read %d of the %d events", read, info.State.Msgs)
		read += uint64(got)
	}
	require.Positive(t, batched, "appends were written in atomic batches")
	t.Logf("%d of %d events written in atomic batches", batched, info.State.Msgs)
}

// TestGroupCommitPublishesTasks: with group commit, the tasks of
// executions started at once are published in atomic batches, each
// answered with its own sequence (the agent's report names it), and the
// executions run to success on their reports.
func TestGroupCommitPublishesTasks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const executions = 30
	startTwoTaskExecutions(t, b, "tasked", executions)
	// Started once the starts wait: they are handled at once, their
	// first tasks published together.
	reg, m := newMetrics(t)
	runDispatcher(t, b.js, dispatch.Config{GroupCommit: true, Metrics: m})
	batched := 0
	runTwoTaskExecutions(t, b, "tasked", executions, func(task fetchedTask) {
		if task.header.Get(jetstreamext.BatchIDHeader) != "" {
			batched++
		}
	})
	require.Positive(t, batched, "tasks were published in atomic batches")
	t.Logf("%d of %d tasks published in atomic batches", batched, 2*executions)
	// The metrics count them: every task a message of a write, fewer
	// writes than messages.
	tasks := metricstest.Value(t, reg, "jetflow_dispatcher_group_commit_messages_total", "stream", bus.StreamTasks)
	require.InDelta(t, 2*executions, tasks, 0)
	require.Less(t, metricstest.Value(t, reg, "jetflow_dispatcher_group_commit_writes_total", "stream", bus.StreamTasks), tasks)
	require.Positive(t, metricstest.Value(t, reg, "jetflow_dispatcher_group_commit_messages_total", "stream", bus.StreamEvents))
	require.Zero(t, metricstest.Value(t, reg, "jetflow_dispatcher_group_commit_failed_total", "stream", bus.StreamTasks))
}

// TestGroupCommitNeedsAtomicBatches: a dispatcher with group commit does
// not start on streams made without atomic batches (an older release's
// bootstrap), saying what to do; without it, it does.
func TestGroupCommitNeedsAtomicBatches(t *testing.T) {
	t.Parallel()
	for _, name := range []string{bus.StreamEvents, bus.StreamTasks} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			natstest.ChangeStream(t, b.js, name, func(cfg *jetstream.StreamConfig) { cfg.AllowAtomicPublish = false })
			_, err := dispatch.New(t.Context(), dispatch.Config{GroupCommit: true}, b.js, zerolog.Nop())
			require.ErrorContains(t, err, "does not allow atomic batches, which group commit needs: run jetflow bootstrap")
			_, err = dispatch.New(t.Context(), dispatch.Config{}, b.js, zerolog.Nop())
			require.NoError(t, err)
		})
	}
}

// TestGroupCommitWarnsWhenBatchesFail: a stream that stops allowing
// atomic batches under a running dispatcher (an older release's
// bootstrap) fails every batch: the appends are made one by one, the
// executions go on, and the dispatcher says why, once.
func TestGroupCommitWarnsWhenBatchesFail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs lockedBuffer
	d, err := dispatch.New(t.Context(), dispatch.Config{GroupCommit: true}, b.js, zerolog.New(&logs))
	require.NoError(t, err)
	natstest.ChangeStream(t, b.js, bus.StreamEvents, func(cfg *jetstream.StreamConfig) { cfg.AllowAtomicPublish = false })
	b.applyYAML(t, "name: unbatched\nsteps:\n  - {id: a, kind: noop, local: true}\n  - {id: b, kind: noop, local: true}\n")
	const executions = 20
	for i := range executions {
		b.start(t, "unbatched", fmt.Sprintf("u%d", i))
	}
	natstest.Serve(t, d.Run)
	for i := range executions {
		_, evs := waitStatus(t, b.js, "unbatched", fmt.Sprintf("u%d", i), projections.StatusSucceeded)
		require.NoError(t, history.Linear(evs))
	}
	out := logs.String()
	require.Contains(t, out, "the stream no longer allows atomic batches")
	require.Contains(t, out, `"stream":"JF_EVENTS"`)
	require.Equal(t, 1, strings.Count(out, "no longer allows atomic batches"), "once a minute at most: %s", out)
}

// TestGroupCommitPublishesTasksAloneWhenBatchesFail: a tasks stream that
// stops allowing atomic batches under a running dispatcher fails every
// batch of tasks: each task is then published on its own, as it was
// before the batch's headers were set (it carries none of them), and
// the executions run to success.
func TestGroupCommitPublishesTasksAloneWhenBatchesFail(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const executions = 30
	startTwoTaskExecutions(t, b, "alone", executions)
	reg, m := newMetrics(t)
	var logs lockedBuffer
	d, err := dispatch.New(t.Context(), dispatch.Config{GroupCommit: true, Metrics: m}, b.js, zerolog.New(&logs))
	require.NoError(t, err)
	natstest.ChangeStream(t, b.js, bus.StreamTasks, func(cfg *jetstream.StreamConfig) { cfg.AllowAtomicPublish = false })
	// Started once the starts wait: their first tasks go at once.
	natstest.Serve(t, d.Run)
	runTwoTaskExecutions(t, b, "alone", executions, func(task fetchedTask) {
		require.Empty(t, task.header.Get(jetstreamext.BatchIDHeader), "a task published alone carries no batch header")
	})
	// Batches were tried, and failed: the tasks above went alone.
	require.Positive(t, metricstest.Value(t, reg, "jetflow_dispatcher_group_commit_failed_total", "stream", bus.StreamTasks))
	// Each at once, not on a retry of the step (which a publish timing
	// out on a loaded machine may take: not counted).
	refused := 0
	for line := range strings.Lines(logs.String()) {
		if strings.Contains(line, "publish task") && strings.Contains(line, "atomic publish is disabled") {
			refused++
		}
	}
	require.Zero(t, refused, "tasks whose publish was refused and waited for a retry")
}

// startTwoTaskExecutions registers workflow wf, two tasks one after the
// other, and starts n executions of it, wf0 to wf<n-1>.
func startTwoTaskExecutions(t *testing.T, b *testBundle, wf string, n int) {
	t.Helper()
	b.register(t, wf, "a", "b")
	for i := range n {
		b.start(t, wf, fmt.Sprintf("%s%d", wf, i))
	}
}

// runTwoTaskExecutions takes the 2n tasks of the executions
// startTwoTaskExecutions started, checking each, and reports each
// succeeded; then each execution succeeds, its history linear, every
// step sent once.
func runTwoTaskExecutions(t *testing.T, b *testBundle, wf string, n int, check func(fetchedTask)) {
	t.Helper()
	for range 2 * n {
		task := b.nextTask(t)
		check(task)
		b.report(t, &events.OperationSucceeded{TaskRef: task.ref("test-agent", 1)})
	}
	for i := range n {
		id := fmt.Sprintf("%s%d", wf, i)
		s, evs := waitStatus(t, b.js, wf, id, projections.StatusSucceeded)
		require.NoError(t, history.Linear(evs), id)
		for _, st := range s.Steps {
			require.Equal(t, 1, st.Attempt, "%s %s sent once", id, st.ID)
		}
	}
}
