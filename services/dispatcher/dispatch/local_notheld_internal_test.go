package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/services/internal/metrics/metricstest"
)

// A decision about an execution whose partition this dispatcher does not
// hold (a clear-lock routed here, a renewal late) with its local step
// sending: the holder is nudged once and the step noted sent here; the
// decision settles (it used to take the same turn again, nudging each
// time, until "did not settle", found by an independent review).
func TestALocalStepOfAPartitionNotHeldIsLeftToItsHolder(t *testing.T) {
	t.Parallel()
	running := make(chan struct{}, 1)
	block := operation.HandlerFunc(func(ctx context.Context, _ operation.Task) (any, error) {
		running <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	src := "name: lp\nsteps:\n  - {id: slow, kind: call, local: true, idempotent: yes, operation: slow}\n"
	b := setupMem(t, Config{Workers: 2, LocalHandlers: map[string]operation.Handler{"slow": block}}, src)
	b.publish(t, bus.SubjectStart, &events.StartExecution{Workflow: "lp", ExecutionID: "l1"})
	select {
	case <-running:
	case <-time.After(15 * time.Second):
		t.Fatal("not started")
	}
	other, err := New(t.Context(), Config{Workers: 1, Member: "other"}, b.js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel))
	require.NoError(t, err)
	other.local.start(t.Context(), func(job) {}) // running, but holds nothing (as for a clear-lock routed to it)
	sub, err := b.js.Conn().SubscribeSync(bus.InboxPrefix + ".>")
	require.NoError(t, err)
	require.NoError(t, b.js.Conn().Flush())
	err = other.withExecution(t.Context(), "lp", "l1", func(x *execState) error { return other.advance(t.Context(), x) })
	n := 0
	for {
		m, err := sub.NextMsg(500 * time.Millisecond)
		if err != nil {
			break
		}
		if m.Header.Get("ce-type") == string(events.TypeReconcileExecution) {
			n++
		}
	}
	require.NoError(t, err, "one decision about a not-held execution settles")
	require.Equal(t, 1, n, "its holder is nudged once")
}

// A local run's report handed back (its handling failed, or its
// partition's lease was late) and due again after Run returned is
// dropped: the next holder runs the step again, so the run counts in
// jetflow_dispatcher_local_runs_again_total; one whose handler never ran
// does not.
func TestAReportDroppedAfterRunIsCounted(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	require.NoError(t, err)
	d, err := New(t.Context(), Config{Workers: 1, Metrics: m}, js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel))
	require.NoError(t, err)
	d.local.start(t.Context(), func(job) { t.Error("a report was queued after Run returned") })
	d.local.over.Store(true) // Run has returned
	ev := events.New("test", "x1", "wf", time.Now(), &events.OperationSucceeded{TaskRef: events.TaskRef{TaskID: "t", ExecutionID: "x1", Workflow: "wf", StepID: "s", Attempt: 1}})
	never := &localMsg{d: d, ev: ev, run: &localRun{exec: "x1"}, task: "t0"}
	ran := &localMsg{d: d, ev: ev, run: &localRun{exec: "x1", ran: true}, task: "t1"}
	require.NoError(t, never.NakWithDelay(0))
	require.NoError(t, ran.NakWithDelay(0))
	natstest.Eventually(t, 5*time.Second, func() bool {
		return metricstest.Value(t, reg, "jetflow_dispatcher_local_runs_again_total") == 1
	}, "the dropped report's run counted")
	require.NoError(t, ran.NakWithDelay(0)) // handed back again: counted once
	time.Sleep(3 * retryFirst)
	require.Equal(t, 1.0, metricstest.Value(t, reg, "jetflow_dispatcher_local_runs_again_total"), "the run that never reached its handler, and the second drop, are not counted")
}
