package history_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
)

type testBundle struct {
	js jetstream.JetStream
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	return &testBundle{js: js}
}

var t0 = time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC)

func newEvent(id string, p events.Payload) events.Event {
	return events.New("test", id, "wf", t0, p)
}

func subjectMsgs(t *testing.T, js jetstream.JetStream, subject string) uint64 {
	t.Helper()
	stream, err := js.Stream(t.Context(), bus.StreamEvents)
	require.NoError(t, err)
	info, err := stream.Info(t.Context(), jetstream.WithSubjectFilter(subject))
	require.NoError(t, err)
	return info.State.Subjects[subject]
}

func TestAppend(t *testing.T) {
	t.Parallel()

	bundle := setup(t)
	// A retry below is answered by the stream's dedupe window: on a loaded
	// machine the subtests came more than the default 30 s after the
	// append they retry.
	natstest.ChangeStream(t, bundle.js, bus.StreamEvents, func(cfg *jetstream.StreamConfig) { cfg.Duplicates = 10 * time.Minute })
	ctx := t.Context()
	subj, other := bus.ExecutionSubject("wf", "x1"), bus.ExecutionSubject("wf", "x2")

	first := newEvent("x1", &events.ExecutionStarted{Workflow: "wf", Steps: []events.StepRef{{ID: "a", Kind: "noop"}}})
	seq1, err := history.Append(ctx, bundle.js, subj, 0, first)
	require.NoError(t, err)
	require.Positive(t, seq1)

	// Another execution's event moves the stream sequence on.
	otherSeq, err := history.Append(ctx, bundle.js, other, 0, newEvent("x2", &events.ExecutionStarted{Workflow: "wf"}))
	require.NoError(t, err)
	require.Greater(t, otherSeq, seq1)

	second := newEvent("x1", &events.StepScheduled{StepID: "a", Attempt: 1})
	seq2, err := history.Append(ctx, bundle.js, subj, seq1, second)
	require.NoError(t, err)
	require.Greater(t, seq2, otherSeq)

	t.Run("Concurrently", func(t *testing.T) {
		t.Run("StaleExpectedSeq", func(t *testing.T) {
			t.Parallel()

			for _, last := range []uint64{0, seq1, otherSeq, seq2 + 100} {
				_, err := history.Append(ctx, bundle.js, subj, last, newEvent("x1", &events.StepSending{StepID: "a", Attempt: 1}))
				require.ErrorIs(t, err, bus.ErrConflict, "expected seq %d", last)
				require.True(t, bus.IsConflict(err))
			}
		})

		t.Run("RetryOfStoredEvent", func(t *testing.T) {
			t.Parallel()

			// The same event with the same expected sequence: the server says
			// wrong last sequence, Append recognises its own message.
			seq, err := history.Append(ctx, bundle.js, subj, seq1, second)
			require.NoError(t, err)
			require.Equal(t, seq2, seq)
			// With the new sequence, the server's dedupe answers.
			seq, err = history.Append(ctx, bundle.js, subj, seq2, second)
			require.NoError(t, err)
			require.Equal(t, seq2, seq)
		})

		t.Run("RetryOfOlderEvent", func(t *testing.T) {
			t.Parallel()

			// first is stored but is no longer the subject's last message: a
			// stale retry is a conflict, which makes the caller re-read.
			_, err := history.Append(ctx, bundle.js, subj, 0, first)
			require.ErrorIs(t, err, bus.ErrConflict)
		})
	})

	// Whatever the subtests did, x1 holds exactly two messages.
	require.Equal(t, uint64(2), subjectMsgs(t, bundle.js, subj))
}

func TestAppendRetryStoresOnce(t *testing.T) {
	t.Parallel()

	bundle := setup(t)
	ctx := t.Context()
	subj := bus.ExecutionSubject("wf", "x1")

	ev := newEvent("x1", &events.ExecutionStarted{Workflow: "wf"})
	seq, err := history.Append(ctx, bundle.js, subj, 0, ev)
	require.NoError(t, err)
	for range 3 {
		again, err := history.Append(ctx, bundle.js, subj, 0, ev)
		require.NoError(t, err)
		require.Equal(t, seq, again)
	}
	require.Equal(t, uint64(1), subjectMsgs(t, bundle.js, subj))

	evs, err := history.Read(ctx, bundle.js, subj, 0)
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, ev.ID, evs[0].ID)
}

func TestAppendInvalidEvent(t *testing.T) {
	t.Parallel()

	bundle := setup(t)
	_, err := history.Append(t.Context(), bundle.js, bus.ExecutionSubject("wf", "x1"), 0,
		events.Event{Type: events.TypeExecutionStarted, Source: "s", Data: &events.ExecutionStarted{}})
	require.ErrorIs(t, err, events.ErrMalformed)
	require.False(t, bus.IsConflict(err))
}

func TestRead(t *testing.T) {
	t.Parallel()

	bundle := setup(t)
	ctx := t.Context()
	subj := bus.ExecutionSubject("wf", "x1")

	payloads := []events.Payload{
		&events.ExecutionStarted{Workflow: "wf", Steps: []events.StepRef{{ID: "a", Kind: "noop"}},
			Input: json.RawMessage(`{"n":1}`), Definition: json.RawMessage(`{"name":"wf"}`)},
		&events.StepScheduled{StepID: "a", Attempt: 1},
		&events.StepSending{StepID: "a", Attempt: 1, TaskID: "x1.a.1", Queue: "default"},
		&events.StepSent{StepID: "a", Attempt: 1, TaskID: "x1.a.1"},
		&events.StepSucceeded{StepID: "a", Attempt: 1},
		&events.ExecutionSucceeded{},
	}
	var written []events.Event
	var seqs []uint64
	var last uint64
	for i, p := range payloads {
		ev := newEvent("x1", p)
		ev.Time = t0.Add(time.Duration(i) * time.Second)
		var err error
		last, err = history.Append(ctx, bundle.js, subj, last, ev)
		require.NoError(t, err)
		written, seqs = append(written, ev), append(seqs, last)
		// Interleave another execution so that sequences are not contiguous.
		_, err = bundle.js.Publish(ctx, bus.ExecutionSubject("wf", "noise"), []byte("not an event"))
		require.NoError(t, err)
	}

	requireEvents := func(t *testing.T, want []events.Event, wantSeqs []uint64, got []events.Event) {
		t.Helper()
		require.Len(t, got, len(want))
		for i := range want {
			require.Equal(t, want[i].ID, got[i].ID)
			require.Equal(t, want[i].Type, got[i].Type)
			require.Equal(t, want[i].Data, got[i].Data)
			require.True(t, want[i].Time.Equal(got[i].Time))
			require.Equal(t, wantSeqs[i], got[i].Seq)
		}
	}

	t.Run("All", func(t *testing.T) {
		t.Parallel()

		for _, filter := range []string{subj, bus.ExecutionFilter("x1")} {
			for _, from := range []uint64{0, 1} {
				got, err := history.Read(ctx, bundle.js, filter, from)
				require.NoError(t, err)
				requireEvents(t, written, seqs, got)
			}
		}
	})

	t.Run("FromSeq", func(t *testing.T) {
		t.Parallel()

		got, err := history.Read(ctx, bundle.js, subj, seqs[3])
		require.NoError(t, err)
		requireEvents(t, written[3:], seqs[3:], got)

		got, err = history.Read(ctx, bundle.js, subj, seqs[3]-1) // a sequence of another subject
		require.NoError(t, err)
		requireEvents(t, written[3:], seqs[3:], got)

		got, err = history.Read(ctx, bundle.js, subj, seqs[len(seqs)-1]+10)
		require.NoError(t, err)
		require.Empty(t, got)
	})

	t.Run("Until", func(t *testing.T) {
		t.Parallel()

		got, err := history.ReadUntil(ctx, bundle.js, subj, 0, seqs[2])
		require.NoError(t, err)
		requireEvents(t, written[:3], seqs[:3], got)

		got, err = history.ReadUntil(ctx, bundle.js, subj, seqs[1], seqs[2]+1) // between two of ours
		require.NoError(t, err)
		requireEvents(t, written[1:3], seqs[1:3], got)

		got, err = history.ReadUntil(ctx, bundle.js, subj, 0, seqs[len(seqs)-1]+100)
		require.NoError(t, err)
		requireEvents(t, written, seqs, got)
	})

	t.Run("WholeStream", func(t *testing.T) {
		t.Parallel()

		// The events stream's whole subject (a re-projection) is read
		// without a filter, from a sequence, with the subject of each.
		var got []events.Event
		var subjects []string
		err := history.ScanStored(ctx, bundle.js, bus.StreamEvents, bus.EventsPrefix+".>", seqs[2], 0, func(subject string, ev events.Event) error {
			if subject == subj {
				got = append(got, ev)
			}
			subjects = append(subjects, subject)
			return nil
		})
		require.NoError(t, err)
		requireEvents(t, written[2:], seqs[2:], got)
		require.Len(t, subjects, 2*len(written[2:]), "ours and the other execution's, interleaved")
		require.Equal(t, bus.ExecutionSubject("wf", "noise"), subjects[1])
	})

	t.Run("EmptySubject", func(t *testing.T) {
		t.Parallel()

		start := time.Now()
		got, err := history.Read(ctx, bundle.js, bus.ExecutionSubject("wf", "nobody"), 0)
		require.NoError(t, err)
		require.Nil(t, got)
		require.Less(t, time.Since(start), time.Second)
	})

	t.Run("Malformed", func(t *testing.T) {
		t.Parallel()

		// A message that is no event comes back marked, not as an error:
		// the fold quarantines its execution, and nothing else stops.
		got, err := history.Read(ctx, bundle.js, bus.ExecutionSubject("wf", "noise"), 0)
		require.NoError(t, err)
		require.Len(t, got, len(payloads), "one per interleaved message")
		for _, ev := range got {
			require.Contains(t, ev.Invalid, "not a CloudEvent")
			require.False(t, ev.Time.IsZero(), "the time it was stored")
			require.Nil(t, ev.Data)
			require.Equal(t, "wf", ev.Workflow)
			require.Equal(t, "noise", ev.Subject)
			require.NotZero(t, ev.Seq)
		}
	})
}

func TestReadUnknownType(t *testing.T) {
	t.Parallel()

	bundle := setup(t)
	ctx := t.Context()
	subj := bus.ExecutionSubject("wf", "x1")

	seq1, err := history.Append(ctx, bundle.js, subj, 0, newEvent("x1", &events.ExecutionStarted{Workflow: "wf"}))
	require.NoError(t, err)
	future := events.Event{ID: "future-1", Type: "io.jetflow.step.paused", Source: "newer", Subject: "x1", Time: t0,
		Ignorable: true, Raw: json.RawMessage(`{"step_id":"a"}`)}
	msg, err := bus.Encode(subj, future)
	require.NoError(t, err)
	_, err = bundle.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(seq1))
	require.NoError(t, err)

	got, err := history.Read(ctx, bundle.js, subj, 0)
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, events.Type("io.jetflow.step.paused"), got[1].Type)
	require.Nil(t, got[1].Data)
	require.True(t, got[1].Ignorable)
	require.Greater(t, got[1].Seq, seq1)
}

// TestFirst: an execution's first event, by its filter, among others'.
func TestFirst(t *testing.T) {
	t.Parallel()
	bundle := setup(t)
	ctx := t.Context()
	_, err := history.First(ctx, bundle.js, bus.ExecutionFilter("x1"))
	require.ErrorIs(t, err, history.ErrNoEvent)

	_, err = bundle.js.Publish(ctx, bus.ExecutionSubject("wf", "other"), []byte("not an event"))
	require.NoError(t, err)
	start := newEvent("x1", &events.ExecutionStarted{Workflow: "wf", Input: json.RawMessage(`{"n":1}`), Definition: json.RawMessage(`{"name":"wf"}`)})
	seq, err := history.Append(ctx, bundle.js, bus.ExecutionSubject("wf", "x1"), 0, start)
	require.NoError(t, err)
	_, err = history.Append(ctx, bundle.js, bus.ExecutionSubject("wf", "x1"), seq, newEvent("x1", &events.ExecutionSucceeded{}))
	require.NoError(t, err)

	ev, err := history.First(ctx, bundle.js, bus.ExecutionFilter("x1"))
	require.NoError(t, err)
	require.Equal(t, start.ID, ev.ID)
	require.Equal(t, seq, ev.Seq)
	require.Equal(t, start.Data, ev.Data)

	bad, err := history.First(ctx, bundle.js, bus.ExecutionFilter("other"))
	require.NoError(t, err, "a message that is no event comes back marked, as from Scan")
	require.Contains(t, bad.Invalid, "not a CloudEvent")
	require.Equal(t, "other", bad.Subject)
	require.NotZero(t, bad.Seq)
}

// A scan that keeps messages by their data hands on only those, and one
// with a Share waits before each batch after the first (1,000 events
// each) at least (1-Share)/Share times what the batch before took.
func TestAScanIfKeepsByDataAndPaces(t *testing.T) {
	t.Parallel()
	bundle := setup(t)
	ctx := t.Context()
	const n = 2500
	publishSendings(t, bundle.js, n)

	const share = 0.25
	var seen []time.Time // when Keep saw each message
	var got []string
	err := history.ScanReportsIf(ctx, bundle.js, bus.StreamEvents, bus.EventsPrefix+".>", 1, history.ScanIf{
		Share: share,
		Keep: func(subject string, h nats.Header, data []byte) bool {
			seen = append(seen, time.Now())
			return bytes.Contains(data, []byte(`"queue":"wanted"`))
		},
	}, func(ev events.Event) error {
		got = append(got, ev.Subject)
		return nil
	})
	require.NoError(t, err)
	require.Len(t, seen, n)
	require.Len(t, got, n/100)
	for i, id := range got {
		require.Equal(t, fmt.Sprintf("x%d", i*100+7), id)
	}
	// A batch took at least from its first message to its last; the wait
	// before the next is at least three times that.
	for _, b := range []int{1000, 2000} {
		batch := seen[b-1].Sub(seen[b-1000])
		require.GreaterOrEqual(t, seen[b].Sub(seen[b-1]), time.Duration(float64(batch)*(1-share)/share),
			"the wait before the batch from %d", b)
	}
}

// A scan's wait between batches ends with its context.
func TestAScanIfWaitEndsWithItsContext(t *testing.T) {
	t.Parallel()
	bundle := setup(t)
	publishSendings(t, bundle.js, 1500)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	const share = 1e-5 // a wait of 99,999 times the first batch's time
	var first, last, cancelled time.Time
	var mu sync.Mutex
	seen := 0
	err := history.ScanReportsIf(ctx, bundle.js, bus.StreamEvents, bus.EventsPrefix+".>", 1, history.ScanIf{
		Share: share,
		Keep: func(string, nats.Header, []byte) bool {
			switch seen++; seen {
			case 1:
				first = time.Now()
			case 1000: // the end of the first batch: cancelled during the wait
				last = time.Now()
				time.AfterFunc(time.Second, func() {
					mu.Lock()
					defer mu.Unlock()
					cancelled = time.Now()
					cancel()
				})
			}
			return false
		},
	}, func(events.Event) error { return nil })
	require.ErrorIs(t, err, context.Canceled)
	require.Equal(t, 1000, seen, "no batch after the wait")
	wait := time.Duration(float64(last.Sub(first)) * (1 - share) / share)
	mu.Lock()
	defer mu.Unlock()
	require.False(t, cancelled.IsZero(), "the scan ended before its context did")
	require.Less(t, time.Since(cancelled), wait/2, "the scan ended with its context, not after its wait of %s", wait)
}

// publishSendings stores n step.sending events of executions x0..x(n-1),
// every hundredth (from x7) for queue "wanted", the others for "default".
func publishSendings(t *testing.T, js jetstream.JetStream, n int) {
	t.Helper()
	for i := range n {
		queue := "default"
		if i%100 == 7 {
			queue = "wanted"
		}
		ev := newEvent(fmt.Sprintf("x%d", i), &events.StepSending{StepID: "a", Attempt: 1, TaskID: fmt.Sprintf("x%d.a.1", i), Queue: queue})
		msg, err := bus.Encode(bus.ExecutionSubject("wf", ev.Subject), ev)
		require.NoError(t, err)
		_, err = js.PublishMsgAsync(msg)
		require.NoError(t, err)
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-t.Context().Done():
		t.Fatal(t.Context().Err())
	}
}
