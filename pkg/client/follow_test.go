package client_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
)

// down drops the connection of its first fails requests (an api that is
// restarting), then answers 204: the execution is settled, nothing more.
type down struct {
	fails, seen atomic.Int32
}

func (d *down) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if d.seen.Add(1) <= d.fails.Load() {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// TestFollowReconnectsUntilTheAPIIsBack: a stream that cannot be opened
// (the api restarting) is asked for again until the api answers; one
// that stays down is given up once FollowReconnectFor has passed without
// an event. (Not parallel: it sets FollowReconnectFor.)
func TestFollowReconnectsUntilTheAPIIsBack(t *testing.T) {
	d := &down{}
	d.fails.Store(3)
	srv := httptest.NewServer(d)
	t.Cleanup(srv.Close)
	c := client.New(srv.URL)
	require.NoError(t, c.Follow(t.Context(), "x1", 0, func(client.Event) error { return nil }))
	require.Equal(t, int32(4), d.seen.Load(), "three refused, then answered")

	defer func(old time.Duration) { client.FollowReconnectFor = old }(client.FollowReconnectFor)
	client.FollowReconnectFor = 500 * time.Millisecond
	d.seen.Store(0)
	d.fails.Store(1 << 30)
	began := time.Now()
	err := c.Follow(t.Context(), "x1", 0, func(client.Event) error { return nil })
	require.Error(t, err)
	require.GreaterOrEqual(t, time.Since(began), client.FollowReconnectFor, "kept trying for FollowReconnectFor")
}
