package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"jetflow.dev/pkg/natstest"
)

// stream makes a stream G on g.> (atomic batches allowed when atomic)
// on a server of its own.
func stream(t *testing.T, atomic bool) (jetstream.JetStream, jetstream.Stream) {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	s, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "G", Subjects: []string{"g.>"},
		Storage: jetstream.FileStorage, AllowAtomicPublish: atomic})
	require.NoError(t, err)
	return js, s
}

// msg is an append to subject after its lastSeq, with id.
func msg(subject string, lastSeq uint64, id string) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Data = []byte(id)
	m.Header.Set(jetstream.MsgIDHeader, id)
	m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(lastSeq, 10))
	return m
}

// manual is a committer whose loop the test starts.
func manual(js jetstream.JetStream) *Committer {
	c := newCommitter(js, Config{})
	c.start.Do(func() {})
	return c
}

// submitAll hands ms to a committer whose loop has not started, so that
// its first batch holds every one it may, then starts the loop.
func submitAll(t *testing.T, js jetstream.JetStream, ms ...*nats.Msg) (*Committer, []<-chan Result) {
	t.Helper()
	c := manual(js)
	var out []<-chan Result
	for _, m := range ms {
		out = append(out, c.Submit(m))
	}
	go c.loop()
	t.Cleanup(c.Stop)
	return c, out
}

func result(t *testing.T, r <-chan Result) Result {
	t.Helper()
	select {
	case res := <-r:
		return res
	case <-time.After(30 * time.Second):
		t.Fatal("no answer")
		return Result{}
	}
}

// TestConcurrentAppendsAreBatched: publishers appending to subjects of
// their own, each naming its subject's last sequence, are answered with
// the sequences the stream stored them at (a wrong one fails the next
// append's check), and are written in fewer writes than appends.
func TestConcurrentAppendsAreBatched(t *testing.T) {
	t.Parallel()
	js, s := stream(t, true)
	c := New(js, Config{})
	t.Cleanup(c.Stop)
	const publishers, each = 32, 20
	var wg sync.WaitGroup
	errs := make(chan error, publishers)
	for w := range publishers {
		wg.Go(func() {
			subject := fmt.Sprintf("g.w%d", w)
			var last uint64
			for i := range each {
				seq, err := c.Publish(t.Context(), msg(subject, last, fmt.Sprintf("%s-%d", subject, i)))
				if err != nil {
					errs <- fmt.Errorf("%s append %d: %w", subject, i, err)
					return
				}
				last = seq
			}
			// The stream's last message of the subject is at last.
			m, err := s.GetLastMsgForSubject(t.Context(), subject)
			if err != nil {
				errs <- err
				return
			}
			if m.Sequence != last || string(m.Data) != fmt.Sprintf("%s-%d", subject, each-1) {
				errs <- fmt.Errorf("%s: answered %d, stored last at %d (%s)", subject, last, m.Sequence, m.Data)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st := c.Stats()
	require.Equal(t, int64(publishers*each), st.Messages)
	require.Less(t, st.Writes, st.Messages, "appends waiting together are written together")
	require.Zero(t, st.Failed)
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	require.Equal(t, uint64(publishers*each), info.State.Msgs)
}

// TestBatchStandsOrFallsWhole: one stale append fails the batch it is in,
// and nothing of the batch is stored; each message is answered with the
// batch's error (its publisher then learns alone which failed).
func TestBatchStandsOrFallsWhole(t *testing.T) {
	t.Parallel()
	js, s := stream(t, true)
	c, rs := submitAll(t, js, msg("g.a", 0, "a1"), msg("g.b", 7, "b1"), msg("g.c", 0, "c1"))
	for i, r := range rs {
		res := result(t, r)
		require.Error(t, res.Err, "message %d", i)
		require.Contains(t, res.Err.Error(), "10071", "the wrong last sequence, for the whole batch")
	}
	require.Equal(t, Stats{Writes: 1, Messages: 3, Failed: 1, FailedMessages: 3}, c.Stats(), "one batch, failed")
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs, "nothing of a failed batch is stored")
}

// TestSameSubjectWaitsForTheNextBatch: a second append checking a subject
// the batch already writes goes in the next batch (ADR-50 refuses it in
// the same one), where its check sees the first.
func TestSameSubjectWaitsForTheNextBatch(t *testing.T) {
	t.Parallel()
	js, s := stream(t, true)
	c, rs := submitAll(t, js, msg("g.a", 0, "a1"), msg("g.b", 0, "b1"), msg("g.a", 1, "a2"), msg("g.c", 0, "c1"))
	var seqs []uint64
	for i, r := range rs {
		res := result(t, r)
		require.NoError(t, res.Err, "message %d", i)
		seqs = append(seqs, res.Seq)
	}
	// a1, b1, c1 in the first batch (1, 2, 3), a2 in the second (4).
	require.Equal(t, []uint64{1, 2, 4, 3}, seqs)
	require.Equal(t, Stats{Writes: 2, Messages: 4}, c.Stats())
	for i, want := range []string{"a1", "b1", "c1", "a2"} {
		m, err := s.GetMsg(t.Context(), uint64(i+1))
		require.NoError(t, err)
		require.Equal(t, want, string(m.Data))
	}
}

// TestLoneMessageIsAPlainPublish: a message alone is published without a
// batch's headers, and its own refusal answers it.
func TestLoneMessageIsAPlainPublish(t *testing.T) {
	t.Parallel()
	js, s := stream(t, true)
	c := New(js, Config{})
	t.Cleanup(c.Stop)
	seq, err := c.Publish(t.Context(), msg("g.a", 0, "a1"))
	require.NoError(t, err)
	require.Equal(t, uint64(1), seq)
	m, err := s.GetMsg(t.Context(), 1)
	require.NoError(t, err)
	require.Empty(t, m.Header.Get(jetstreamext.BatchIDHeader))
	_, err = c.Publish(t.Context(), msg("g.a", 0, "a2"))
	require.ErrorContains(t, err, "10071")
}

// TestStreamWithoutAtomicBatches: a stream that does not allow atomic
// batches refuses a batch (10174) and stores nothing of it.
func TestStreamWithoutAtomicBatches(t *testing.T) {
	t.Parallel()
	js, s := stream(t, false)
	_, rs := submitAll(t, js, msg("g.a", 0, "a1"), msg("g.b", 0, "b1"))
	for _, r := range rs {
		require.ErrorContains(t, result(t, r).Err, "10174")
	}
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	require.Zero(t, info.State.Msgs)
}

// TestStopWritesWhatItWasHanded: Stop writes every message handed to the
// committer before it; one handed after is refused, not published.
func TestStopWritesWhatItWasHanded(t *testing.T) {
	t.Parallel()
	js, s := stream(t, true)
	c := manual(js)
	var rs []<-chan Result
	for i := range 10 {
		rs = append(rs, c.Submit(msg(fmt.Sprintf("g.s%d", i), 0, fmt.Sprint(i))))
	}
	// Stopped before the loop takes any: it still writes them all.
	c.mu.Lock()
	c.stopped = true
	close(c.quit)
	c.mu.Unlock()
	go c.loop()
	c.Stop()
	for _, r := range rs {
		require.NoError(t, result(t, r).Err)
	}
	_, err := c.Publish(context.Background(), msg("g.late", 0, "late"))
	require.ErrorIs(t, err, ErrStopped)
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	require.Equal(t, uint64(10), info.State.Msgs)
	c.Stop() // a second Stop returns
}

// TestUnusedCommitterStops: a committer never handed a message runs no
// goroutine, and stops at once.
func TestUnusedCommitterStops(t *testing.T) {
	t.Parallel()
	js, _ := stream(t, true)
	c := New(js, Config{})
	c.Stop()
	_, err := c.Publish(t.Context(), msg("g.a", 0, "a1"))
	require.ErrorIs(t, err, ErrStopped)
}

// TestStopRacesPublish: publishers going on while the committer stops
// are each answered, stored or refused (ErrStopped), and what was
// answered stored is in the stream.
func TestStopRacesPublish(t *testing.T) {
	t.Parallel()
	js, s := stream(t, true)
	c := New(js, Config{})
	var stored atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := 0; ; i++ {
				_, err := c.Publish(context.Background(), msg(fmt.Sprintf("g.p%d.%d", w, i), 0, fmt.Sprintf("%d-%d", w, i)))
				if errors.Is(err, ErrStopped) {
					return
				}
				if err != nil {
					t.Errorf("publisher %d: %v", w, err)
					return
				}
				stored.Add(1)
			}
		})
	}
	time.Sleep(200 * time.Millisecond)
	c.Stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a publisher was never answered")
	}
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	require.Equal(t, uint64(stored.Load()), info.State.Msgs)
	require.Equal(t, stored.Load(), c.Stats().Messages)
}

// TestFailedIsTold: each failed write is told to Config.Failed, with its
// error and its messages' count.
func TestFailedIsTold(t *testing.T) {
	t.Parallel()
	js, _ := stream(t, true)
	var mu sync.Mutex
	var told []int
	var errs []error
	c := New(js, Config{Failed: func(err error, n int) { // on the committer's goroutine: no require there
		mu.Lock()
		defer mu.Unlock()
		told, errs = append(told, n), append(errs, err)
	}})
	t.Cleanup(c.Stop)
	_, err := c.Publish(t.Context(), msg("g.a", 3, "a1"))
	require.Error(t, err)
	_, err = c.Publish(t.Context(), msg("g.a", 0, "a2"))
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{1}, told, "the failed write only")
	require.ErrorContains(t, errs[0], "10071")
}
