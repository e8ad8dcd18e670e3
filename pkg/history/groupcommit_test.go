package history_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
)

// groupStore is a store with group commit on a server of its own.
func groupStore(t *testing.T) (jetstream.JetStream, *history.Store) {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	store, err := history.OpenWith(t.Context(), js, history.Options{GroupCommit: true})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	return js, store
}

// TestGroupCommitAppends: with group commit, appends made at once are
// written together and each is answered with the sequence its event was
// stored at (each next append names it as its history's last: a wrong
// one would conflict), and every history holds its events in order.
func TestGroupCommitAppends(t *testing.T) {
	t.Parallel()
	_, store := groupStore(t)
	ctx := t.Context()
	const executions, each = 40, 10
	var wg sync.WaitGroup
	errs := make(chan error, executions)
	for x := range executions {
		wg.Go(func() {
			id := fmt.Sprintf("g%d", x)
			subj := bus.ExecutionSubject("wf", id)
			var last uint64
			for i := range each {
				seq, err := store.Append(ctx, subj, last, newEvent(id, &events.StepSending{StepID: "a", Attempt: i + 1}))
				if err != nil {
					errs <- fmt.Errorf("%s append %d: %w", id, i, err)
					return
				}
				last = seq
			}
			if got, err := store.LastSeq(ctx, subj); err != nil || got != last {
				errs <- fmt.Errorf("%s: answered %d, its last event is at %d (%w)", id, last, got, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st := store.GroupCommits()
	require.Equal(t, int64(executions*each), st.Messages)
	require.Less(t, st.Writes, st.Messages, "appends made at once are written together")
	require.Zero(t, st.Failed)
	for x := range executions {
		evs, err := store.Read(ctx, bus.ExecutionSubject("wf", fmt.Sprintf("g%d", x)), 0)
		require.NoError(t, err)
		require.Len(t, evs, each)
		for i, ev := range evs {
			require.Equal(t, i+1, ev.Data.(*events.StepSending).Attempt)
		}
	}
}

// TestGroupCommitConflict: a stale append in a batch fails that batch
// whole; its members are then appended on their own, so each gets its
// own answer: the others are stored, the stale one is a conflict, and an
// append of an event already stored (a retry) is recognised by its id.
func TestGroupCommitConflict(t *testing.T) {
	t.Parallel()
	js, store := groupStore(t)
	ctx := t.Context()
	retried := newEvent("r", &events.ExecutionStarted{Workflow: "wf"})
	first, err := store.Append(ctx, bus.ExecutionSubject("wf", "r"), 0, retried)
	require.NoError(t, err)
	_, err = store.Append(ctx, bus.ExecutionSubject("wf", "stale"), 0, newEvent("stale", &events.ExecutionStarted{Workflow: "wf"}))
	require.NoError(t, err)

	var batch []history.Pending
	for i := range 8 {
		id := fmt.Sprintf("ok%d", i)
		batch = append(batch, history.Pending{Subject: bus.ExecutionSubject("wf", id), Event: newEvent(id, &events.ExecutionStarted{Workflow: "wf"})})
	}
	batch = append(batch,
		history.Pending{Subject: bus.ExecutionSubject("wf", "stale"), Event: newEvent("stale", &events.ExecutionStarted{Workflow: "wf"})},
		history.Pending{Subject: bus.ExecutionSubject("wf", "r"), Event: retried})
	out := store.AppendBatch(ctx, batch)
	require.Len(t, out, len(batch))
	for i := range 8 {
		require.NoError(t, out[i].Err, "append %d", i)
		require.Equal(t, uint64(1), subjectMsgs(t, js, batch[i].Subject))
	}
	require.True(t, errors.Is(out[8].Err, bus.ErrConflict), "the stale append conflicts: %v", out[8].Err)
	require.Equal(t, uint64(1), subjectMsgs(t, js, bus.ExecutionSubject("wf", "stale")), "and is not stored")
	for i := range 8 {
		last, err := store.LastSeq(ctx, batch[i].Subject)
		require.NoError(t, err)
		require.Equal(t, last, out[i].Seq, "append %d answered with where it was stored", i)
	}
	require.NoError(t, out[9].Err, "an append stored before is recognised")
	require.Equal(t, first, out[9].Seq)
	require.Equal(t, uint64(1), subjectMsgs(t, js, bus.ExecutionSubject("wf", "r")))
	require.Positive(t, store.GroupCommits().Failed, "the stale and the stored appends failed their writes")
}

// TestGroupCommitNeedsAtomicBatches: a store with group commit is refused
// on an events stream made without atomic batches (an older release's
// bootstrap), saying what to do.
func TestGroupCommitNeedsAtomicBatches(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	natstest.ChangeStream(t, js, bus.StreamEvents, func(cfg *jetstream.StreamConfig) {
		require.True(t, cfg.AllowAtomicPublish, "the bootstrap allows atomic batches")
		cfg.AllowAtomicPublish = false
	})
	_, err := history.OpenWith(ctx, js, history.Options{GroupCommit: true})
	require.ErrorIs(t, err, history.ErrNoAtomicBatches)
	store, err := history.Open(ctx, js)
	require.NoError(t, err, "without group commit it is not needed")
	store.Close()

	// The bootstrap allows them again (an events stream of an older
	// release is brought up to this one's).
	require.NoError(t, bus.Ensure(ctx, js, bus.Config{}))
	store, err = history.OpenWith(ctx, js, history.Options{GroupCommit: true})
	require.NoError(t, err)
	store.Close()
}

// TestGroupCommitAppendConflict: appends made at once through Append,
// one of them stale: a batch it shares fails whole, and each of its
// appends is made again on its own, so the others are stored and the
// stale one alone is a conflict.
func TestGroupCommitAppendConflict(t *testing.T) {
	t.Parallel()
	js, store := groupStore(t)
	ctx := t.Context()
	_, err := store.Append(ctx, bus.ExecutionSubject("wf", "stale"), 0, newEvent("stale", &events.ExecutionStarted{Workflow: "wf"}))
	require.NoError(t, err)
	shared := func() bool { st := store.GroupCommits(); return st.FailedMessages > st.Failed }
	for round := 0; !shared() && round < 20; round++ {
		const n = 40
		start := make(chan struct{})
		errs := make([]error, n)
		seqs := make([]uint64, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				<-start
				id := fmt.Sprintf("r%dx%d", round, i)
				subject, last := bus.ExecutionSubject("wf", id), uint64(0)
				if i == n/2 {
					id, subject = "stale", bus.ExecutionSubject("wf", "stale") // its history has an event
				}
				seqs[i], errs[i] = store.Append(ctx, subject, last, newEvent(id, &events.StepSending{StepID: "a", Attempt: round + 1}))
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if i == n/2 {
				require.ErrorIs(t, err, bus.ErrConflict, "round %d", round)
				continue
			}
			require.NoError(t, err, "round %d append %d", round, i)
			last, err := store.LastSeq(ctx, bus.ExecutionSubject("wf", fmt.Sprintf("r%dx%d", round, i)))
			require.NoError(t, err)
			require.Equal(t, last, seqs[i], "answered with where it was stored")
		}
	}
	require.Equal(t, uint64(1), subjectMsgs(t, js, bus.ExecutionSubject("wf", "stale")), "the stale appends stored nothing")
	require.True(t, shared(), "a stale append shared a failed batch with others: %+v", store.GroupCommits())
}
