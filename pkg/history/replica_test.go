package history_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync/atomic"
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

// laggingReplica answers the direct gets of stream (which allows none
// itself, so that only it answers) as a replica does: its first behind
// answers come from a replica that has stored messages up to seq storedUpTo
// only, later ones from one that has stored them all. It reads what it
// sends from the stream's leader. It returns how many requests it answered.
func laggingReplica(t *testing.T, nc *nats.Conn, js jetstream.JetStream, stream string, storedUpTo uint64, behind int64) *atomic.Int64 {
	t.Helper()
	var asked atomic.Int64
	sub, err := nc.Subscribe("$JS.API.DIRECT.GET."+stream, func(req *nats.Msg) {
		n := asked.Add(1)
		var q struct {
			Seq   uint64 `json:"seq"`
			Next  string `json:"next_by_subj"`
			Batch int    `json:"batch"`
		}
		if err := json.Unmarshal(req.Data, &q); err != nil || q.Batch == 0 {
			_ = req.RespondMsg(&nats.Msg{Header: nats.Header{"Status": {"408"}, "Description": {"Bad Request"}}})
			return
		}
		var sent []*jetstream.RawStreamMsg
		for seq := q.Seq; len(sent) < q.Batch; {
			m, err := bus.LeaderGet(t.Context(), js, stream, bus.MsgQuery{Seq: seq, NextBySubject: q.Next})
			if err != nil || (n <= behind && m.Sequence > storedUpTo) {
				break
			}
			sent = append(sent, m)
			seq = m.Sequence + 1
		}
		if len(sent) == 0 {
			_ = req.RespondMsg(&nats.Msg{Header: nats.Header{"Status": {"404"}, "Description": {"Message Not Found"}}})
			return
		}
		for _, m := range sent {
			h := nats.Header{}
			for k, v := range m.Header {
				h[k] = v
			}
			h.Set(jetstream.StreamHeader, stream)
			h.Set(jetstream.SubjectHeader, m.Subject)
			h.Set(jetstream.SequenceHeader, strconv.FormatUint(m.Sequence, 10))
			h.Set(jetstream.TimeStampHeaer, m.Time.Format(time.RFC3339Nano))
			h.Set("Nats-Num-Pending", "0")
			_ = req.RespondMsg(&nats.Msg{Header: h, Data: m.Data})
		}
		_ = req.RespondMsg(&nats.Msg{Header: nats.Header{"Status": {"204"}, "Description": {"EOB"}}})
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, nc.Flush())
	return &asked
}

// lagging makes a stream holding a history of 20 events (with another
// history's events between them) whose direct gets laggingReplica answers,
// lacking the last five events in its first behind answers.
func lagging(t *testing.T, behind int64) (jetstream.JetStream, *atomic.Int64) {
	t.Helper()
	nc, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: lagStream, Subjects: []string{"lag.>"}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	var storedUpTo uint64
	for i := range 20 {
		if i%4 == 0 {
			_, err := js.Publish(ctx, "lag.other", []byte("{}"))
			require.NoError(t, err)
		}
		msg, err := bus.Encode(lagSubject, newEvent("x1", &events.VariablesSet{StepID: fmt.Sprintf("s%d", i)}))
		require.NoError(t, err)
		ack, err := js.PublishMsg(ctx, msg)
		require.NoError(t, err)
		if i == 14 {
			storedUpTo = ack.Sequence
		}
	}
	return js, laggingReplica(t, nc, js, lagStream, storedUpTo, behind)
}

const lagStream, lagSubject = "LAGGING", "lag.x1"

// TestAReadWaitsForALaggingReplica: history reads are direct gets that
// any replica may answer, and a replica may not have stored the latest
// events yet. A read asks the stream's leader where the history ends and
// reads until it has it all: here the first two answers come from a
// replica that lacks the last five events, and the read still returns
// every event, in order, once.
func TestAReadWaitsForALaggingReplica(t *testing.T) {
	t.Parallel()
	js, asked := lagging(t, 2)
	evs, err := history.ReadStream(t.Context(), js, lagStream, lagSubject, 0, 0)
	require.NoError(t, err)
	require.Len(t, evs, 20, "every event, the five the lagging replica lacked included")
	for i, ev := range evs {
		vs, ok := ev.Data.(*events.VariablesSet)
		require.True(t, ok, "event %d is a %s", i, ev.Type)
		require.Equal(t, fmt.Sprintf("s%d", i), vs.StepID, "in order, each once")
	}
	require.Equal(t, int64(3), asked.Load(), "two lagging answers, then one with the rest")
}

// TestAReadFailsRatherThanMissTheLatestEvents: a replica that stays
// behind makes the read fail, saying why, instead of returning a history
// without its latest events (a dispatcher would decide on it).
func TestAReadFailsRatherThanMissTheLatestEvents(t *testing.T) {
	t.Parallel()
	js, asked := lagging(t, 1_000)
	evs, err := history.ReadStream(t.Context(), js, lagStream, lagSubject, 0, 0)
	require.ErrorIs(t, err, bus.ErrBehind)
	require.True(t, bus.Transient(err), "a caller retries it (the api answers 503)")
	require.Len(t, evs, 15, "the events it was given, each once")
	require.Greater(t, asked.Load(), int64(2), "it asked again before it gave up")
}

// TestAReadThatRunsOutOfTimeSaysSo: a read whose context ends while a
// replica lags reports the context's end (the caller's deadline), not a
// lagging replica.
func TestAReadThatRunsOutOfTimeSaysSo(t *testing.T) {
	t.Parallel()
	js, _ := lagging(t, 1_000)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := history.ReadStream(ctx, js, lagStream, lagSubject, 0, 0)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
