package projector_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natsserver"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/projector"
)

// manySteps is the history of an execution of n top-level steps of which
// all but the last succeeded (each with an output of out bytes) and the
// last runs.
func manySteps(n, out int) []events.Payload {
	refs := make([]events.StepRef, n)
	for i := range refs {
		refs[i] = events.StepRef{ID: fmt.Sprintf("s%04d", i), Kind: "let"}
	}
	ps := []events.Payload{&events.ExecutionStarted{Workflow: "wf", Version: 1, Input: json.RawMessage(`{}`), Steps: refs, Token: "t"}}
	output := json.RawMessage(`"` + strings.Repeat("o", out) + `"`)
	for i, r := range refs {
		ps = append(ps, &events.StepScheduled{StepID: r.ID, Attempt: 1})
		if i < n-1 {
			ps = append(ps, &events.StepSucceeded{StepID: r.ID, Attempt: 1, Output: output})
		}
	}
	return ps
}

func newProjector(t *testing.T, js jetstream.JetStream, maxModel int) *projector.Projector {
	t.Helper()
	p, err := projector.New(t.Context(), js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	p.MaxModel = maxModel
	return p
}

// TestBigExecutionsReadModelStaysSmall: the read model of an execution
// of hundreds of steps stays under the limit (large outputs noted,
// finished steps left out, oldest first, the running one kept), other
// executions project as usual, and the projector goes on with the big
// one after a restart (its stored model is not the whole state: it folds
// the history once).
func TestBigExecutionsReadModelStaysSmall(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	const limit = 32 << 10
	big := appendHistory(t, js, "wf", "big", manySteps(400, 3000)...)
	truth, err := projections.Fold(big)
	require.NoError(t, err)
	small := twoStepHistory(t, js, "small")
	smallTruth, err := projections.Fold(small)
	require.NoError(t, err)

	p := newProjector(t, js, limit)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	require.Eventually(t, func() bool {
		x, ok := storedModel(t, kv, "small")
		return ok && x.LastSeq == smallTruth.LastSeq
	}, 90*time.Second, 20*time.Millisecond, "the small execution is projected")
	require.Eventually(t, func() bool {
		x, ok := storedModel(t, kv, "big")
		return ok && x.LastSeq == truth.LastSeq
	}, 90*time.Second, 20*time.Millisecond, "the big execution is projected")

	e, err := kv.Get(t.Context(), "big")
	require.NoError(t, err)
	require.LessOrEqual(t, len(e.Value()), limit)
	x, _ := storedModel(t, kv, "big")
	require.NotNil(t, x.Truncated)
	require.Positive(t, x.Truncated.Steps)
	require.Equal(t, 399, x.Truncated.Values, "every output over 2 KiB is a note")
	require.Equal(t, 400-x.Truncated.Steps, len(x.Steps))
	last := x.Steps[len(x.Steps)-1]
	require.Equal(t, "s0399", last.ID)
	require.Equal(t, projections.OpPending, last.Status, "the step that runs is always kept")
	require.Equal(t, truth.Steps[len(truth.Steps)-2].ID, x.Steps[len(x.Steps)-2].ID, "the most recent finished steps are kept")
	got, _ := storedModel(t, kv, "small")
	requireSameModel(t, smallTruth, got)
	cancel()
	require.NoError(t, <-done)

	// A new projector (its cache empty) reads the truncated model: it
	// folds the history instead of applying onto it.
	more := appendFrom(t, js, "wf", "big", truth.LastSeq,
		&events.StepSucceeded{StepID: "s0399", Attempt: 1}, &events.ExecutionSucceeded{})
	p2 := newProjector(t, js, limit)
	natstest.Serve(t, p2.Run)
	require.Eventually(t, func() bool {
		x, ok := storedModel(t, kv, "big")
		return ok && x.LastSeq == more[len(more)-1].Seq
	}, 90*time.Second, 20*time.Millisecond)
	x, _ = storedModel(t, kv, "big")
	require.Equal(t, projections.StatusSucceeded, x.Status)
	require.Empty(t, p2.Parked())
}

// TestUnwritableReadModelIsParked: a read model that cannot be written
// (here: the failed steps it must keep are more than a message holds) is
// parked after its first failure to fit; the executions after it in the
// stream go on being projected (before, its events were redelivered
// until they filled the consumer's window and projection stopped for
// everyone), and the parked one is tried again on its own.
func TestUnwritableReadModelIsParked(t *testing.T) {
	t.Parallel()
	s, err := natsserver.StartOptions(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), MaxPayload: 96 << 10, NoLog: true, NoSigs: true})
	require.NoError(t, err)
	t.Cleanup(func() { natsserver.Stop(s) })
	_, js := natstest.Connect(t, s)
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)

	// More events than the projector's consumer lets be unacknowledged
	// (4096): retried in place, they would hold every later event back.
	// Getting through them takes about 10 s, 35 s with -race on a busy
	// 2-core machine, and past 3 min once when other test runs and a
	// benchmark loop shared it: the waits below are long (they end as soon
	// as the condition holds), else CI failed on a loaded machine.
	refs := make([]events.StepRef, 2100)
	ps := []events.Payload{nil}
	for i := range refs {
		refs[i] = events.StepRef{ID: fmt.Sprintf("f%04d", i), Kind: "let"}
		ps = append(ps, &events.StepScheduled{StepID: refs[i].ID, Attempt: 1},
			&events.StepFailed{StepID: refs[i].ID, Attempt: 1, Error: "exit status 1"})
	}
	ps[0] = &events.ExecutionStarted{Workflow: "wf", Version: 1, Input: json.RawMessage(`{}`), Steps: refs, Token: "t"}
	stuck := appendHistory(t, js, "wf", "stuck", ps...)
	after := twoStepHistory(t, js, "after")
	afterTruth, err := projections.Fold(after)
	require.NoError(t, err)

	p := newProjector(t, js, 0)
	natstest.Serve(t, p.Run)
	require.Eventually(t, func() bool {
		x, ok := storedModel(t, kv, "after")
		return ok && x.LastSeq == afterTruth.LastSeq
	}, 6*time.Minute, 20*time.Millisecond, "the execution after the unwritable one is projected")
	require.Eventually(t, func() bool {
		parked := p.Parked()
		return len(parked) == 1 && parked[0].ID == "stuck" && parked[0].Tries >= 2
	}, 6*time.Minute, 50*time.Millisecond, "parked, and tried again on its own")
	pk := p.Parked()[0]
	require.Equal(t, "wf", pk.Workflow)
	require.Contains(t, pk.Reason, "maximum payload")
	// What is stored is a summary as far as the history goes, without the
	// steps (GET .../steps folds them): never a state the history has gone past.
	x, ok := storedModel(t, kv, "stuck")
	require.True(t, ok)
	require.Equal(t, stuck[len(stuck)-1].Seq, x.LastSeq)
	require.Empty(t, x.Steps)
	require.Equal(t, &projections.Truncation{Steps: 2100, Summary: true}, x.Truncated)
	require.Equal(t, projections.StatusStarted, x.Status)
}
