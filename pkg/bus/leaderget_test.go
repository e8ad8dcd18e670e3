package bus_test

import (
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
)

// TestLeaderGet: LeaderGet finds a message by sequence, the next on a
// subject, and the last on a subject or a wildcard, with its headers; a
// missing one is jetstream.ErrMsgNotFound. It asks the stream's API,
// never the direct gets any replica answers, even on a stream that
// allows them.
func TestLeaderGet(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "LG", Subjects: []string{"lg.>"}, AllowDirect: true})
	require.NoError(t, err)
	var direct atomic.Int64
	sub, err := nc.Subscribe("$JS.API.DIRECT.GET.>", func(*nats.Msg) { direct.Add(1) })
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	for _, p := range []struct{ subject, data string }{{"lg.a", "a1"}, {"lg.b", "b1"}, {"lg.a", "a2"}, {"lg.c.x", "c1"}} {
		_, err := js.PublishMsg(ctx, &nats.Msg{Subject: p.subject, Data: []byte(p.data), Header: nats.Header{"K": {p.data}}})
		require.NoError(t, err)
	}

	for _, c := range []struct {
		name string
		q    bus.MsgQuery
		seq  uint64
		data string
	}{
		{"by sequence", bus.MsgQuery{Seq: 2}, 2, "b1"},
		{"next on a subject", bus.MsgQuery{Seq: 2, NextBySubject: "lg.a"}, 3, "a2"},
		{"last on a subject", bus.MsgQuery{LastBySubject: "lg.a"}, 3, "a2"},
		{"last on a wildcard", bus.MsgQuery{LastBySubject: "lg.>"}, 4, "c1"},
		{"first on a wildcard", bus.MsgQuery{Seq: 1, NextBySubject: "lg.c.*"}, 4, "c1"},
	} {
		m, err := bus.LeaderGet(ctx, js, "LG", c.q)
		require.NoError(t, err, c.name)
		require.Equal(t, c.seq, m.Sequence, c.name)
		require.Equal(t, c.data, string(m.Data), c.name)
		require.Equal(t, c.data, m.Header.Get("K"), c.name)
		require.False(t, m.Time.IsZero(), c.name)
	}
	_, err = bus.LeaderGet(ctx, js, "LG", bus.MsgQuery{LastBySubject: "lg.none"})
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound)
	_, err = bus.LeaderGet(ctx, js, "LG", bus.MsgQuery{Seq: 5, NextBySubject: "lg.a"})
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound)
	_, err = bus.LeaderGet(ctx, js, "NOSUCH", bus.MsgQuery{Seq: 1})
	var apiErr *jetstream.APIError
	require.ErrorAs(t, err, &apiErr, "the server's error, for bus.Transient to judge")
	require.Equal(t, jetstream.JSErrCodeStreamNotFound, apiErr.ErrorCode)

	require.NoError(t, nc.Flush())
	require.Zero(t, direct.Load(), "no direct get")
}

// TestLeaderKVGet: a key's value as the leader stores it; a key never
// put, deleted or purged is jetstream.ErrKeyNotFound, as kv.Get says.
func TestLeaderKVGet(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "LKV", History: 3})
	require.NoError(t, err)
	for _, k := range []string{"a", "gone", "purged"} {
		_, err := kv.PutString(ctx, k, "v-"+k)
		require.NoError(t, err)
	}
	_, err = kv.PutString(ctx, "a", "v-a2")
	require.NoError(t, err)
	require.NoError(t, kv.Delete(ctx, "gone"))
	require.NoError(t, kv.Purge(ctx, "purged"))

	v, rev, err := bus.LeaderKVGet(ctx, js, "LKV", "a")
	require.NoError(t, err)
	require.Equal(t, "v-a2", string(v), "the last value")
	e, err := kv.Get(ctx, "a")
	require.NoError(t, err)
	require.Equal(t, e.Revision(), rev, "its revision")
	for _, k := range []string{"never", "gone", "purged"} {
		_, _, err := bus.LeaderKVGet(ctx, js, "LKV", k)
		require.ErrorIs(t, err, jetstream.ErrKeyNotFound, k)
		_, err = kv.Get(ctx, k)
		require.ErrorIs(t, err, jetstream.ErrKeyNotFound, k)
	}
}
