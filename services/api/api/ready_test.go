package api

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natsserver"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/services/api/projector"
)

// TestReadyzSaysWhatIsMissing: /readyz is 200 with the parked count while
// the streams and buckets are there, and 503 naming what is missing while
// one is not; /healthz (liveness) stays 200.
func TestReadyzSaysWhatIsMissing(t *testing.T) {
	t.Parallel()
	ns := natstest.RunJetStream(t)
	_, js := natstest.Connect(t, ns)
	var missing atomic.Value
	missing.Store([]string(nil))
	srv, err := New(t.Context(), Config{Auth: AuthConfig{Disabled: true},
		Missing: func() []string { return missing.Load().([]string) }}, js.Conn(), js, zerolog.Nop())
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	get := func(path string) (int, []byte) {
		resp, err := http.Get(hs.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		var raw json.RawMessage
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&raw))
		return resp.StatusCode, raw
	}

	code, body := get("/readyz")
	require.Equal(t, http.StatusOK, code)
	var ready apiv1.Ready
	require.NoError(t, json.Unmarshal(body, &ready))
	require.Equal(t, apiv1.Ready{Status: "ok", Parked: 0}, ready)

	missing.Store([]string{"stream JF_REJECTIONS"})
	code, body = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, string(body), "stream JF_REJECTIONS")
	require.Contains(t, string(body), "jetflow bootstrap")
	code, _ = get("/healthz")
	require.Equal(t, http.StatusOK, code, "liveness does not depend on it")

	// NATS away: not ready, but alive (a restart would cure nothing).
	missing.Store([]string(nil))
	natsserver.Stop(ns)
	natstest.Eventually(t, 10*time.Second, func() bool {
		code, _ := get("/readyz")
		return code == http.StatusServiceUnavailable
	}, "not ready while NATS is away")
	code, body = get("/healthz")
	require.Equal(t, http.StatusOK, code)
	var health apiv1.Health
	require.NoError(t, json.Unmarshal(body, &health))
	require.Equal(t, "ok", health.Status)
	require.NotEqual(t, "CONNECTED", health.NATS, "it says the connection's state")
}

// TestReadyzWaitsForTheReadModelsAndTheIndex: /readyz is 503 while the
// projector is not bound, while the oldest event not projected is older
// than ReadyMaxLag, and while the visibility index is being fed, saying
// which (naming no namespace: the answer is public); 200 with the figures
// once all three are done. Caught up once, a backlog is reported, not
// waited for (every replica would go out of service at once); a projector
// that stops is.
func TestReadyzWaitsForTheReadModelsAndTheIndex(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t, natstest.RunJetStream(t))
	cons, err := bus.Bind(t.Context(), js, true, bus.ProjectorConsumerSpec(), nil)
	require.NoError(t, err)
	// An event not projected yet; /readyz's clock is two minutes ahead, so
	// it has waited past the bound (a minute).
	appendStart := func(id string) {
		ev := events.New("test", id, "wf", time.Now(), &events.ExecutionStarted{Workflow: "wf", Version: 1, Input: json.RawMessage(`{}`),
			Steps: []events.StepRef{{ID: "s1", Kind: "noop"}}, Token: "t"})
		_, err := history.Append(t.Context(), js, bus.ExecutionSubject("wf", id), 0, ev)
		require.NoError(t, err)
	}
	appendStart("lagging")
	// The stream acknowledges the append before its consumers are told of
	// it: on a busy machine the consumer can show nothing pending a moment
	// longer, and /readyz reads the backlog from it.
	natstest.Eventually(t, 10*time.Second, func() bool {
		ci, err := cons.Info(t.Context())
		return err == nil && ci.NumPending == 1
	}, "the projector's consumer has the append pending")
	log := zerolog.New(zerolog.NewTestWriter(t))
	srv, err := New(t.Context(), Config{Auth: AuthConfig{Disabled: true}, clock: func() time.Time { return time.Now().Add(2 * time.Minute) }},
		nc, js, log)
	require.NoError(t, err)
	proj, err := projector.New(t.Context(), js, log)
	require.NoError(t, err)
	feed, err := openFeed(t.Context(), Config{}, DefaultNamespace, js, srv.tenants[DefaultNamespace].defs, log)
	require.NoError(t, err)
	t.Cleanup(func() { _ = feed.Store().Close() })
	srv.projectors[DefaultNamespace], srv.feeds[DefaultNamespace] = proj, feed
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	get := func() (int, string) {
		resp, err := http.Get(hs.URL + "/readyz")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}

	code, body := get()
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	for _, why := range []string{"the projector is binding its consumer",
		"behind the events (1 events to project; the bound is 1m0s: -ready-max-lag)",
		"the visibility index is being fed"} {
		require.Contains(t, body, why)
	}
	require.NotContains(t, body, DefaultNamespace, "the answer is public: no namespace named")
	// Two minutes, and however long this test took since the append.
	require.Regexp(t, `the read models are 2m\d+s behind`, body)

	projCtx, stopProj := context.WithCancel(t.Context())
	projDone := make(chan error, 1)
	go func() { projDone <- proj.Run(projCtx) }()
	t.Cleanup(func() {
		stopProj()
		if err := <-projDone; err != nil {
			t.Errorf("the projector stopped with an error: %v", err)
		}
	})
	natstest.Serve(t, feed.Run)
	var ready apiv1.Ready
	natstest.Eventually(t, 30*time.Second, func() bool {
		code, body = get()
		return code == http.StatusOK && json.Unmarshal([]byte(body), &ready) == nil
	}, "ready once the projector is bound and caught up and the index is live")
	require.Equal(t, apiv1.Ready{Status: "ok", IndexLive: true}, ready)

	// The projector stops: not ready, for that alone; the backlog that
	// builds meanwhile is reported, no longer waited for.
	stopProj()
	require.NoError(t, <-projDone)
	projDone <- nil // for the cleanup
	appendStart("later")
	natstest.Eventually(t, 30*time.Second, func() bool {
		code, body = get()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "the projector is binding its consumer")
	}, "not ready without a projector")
	require.NotContains(t, body, "behind the events", "caught up once: the lag is reported, not waited for")
}
