package api

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
)

// TestAStartWaitingWhenTheAPIStopsIsAccepted: a start whose command is
// stored and that waits for the dispatcher's answer when the api stops
// is answered 202 accepted, with its execution's id (a dispatcher handles
// the command later), not with an empty answer that a client reads as a
// failure and sends again; the api then stops without an error.
func TestAStartWaitingWhenTheAPIStopsIsAccepted(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	// No dispatcher runs: nothing answers the start before the api stops.
	srv, err := New(t.Context(), Config{Listener: ln, StartWait: time.Minute, Auth: AuthConfig{Disabled: true}}, js.Conn(), js, zerolog.Nop())
	require.NoError(t, err)
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	stopped := make(chan error, 1)
	go func() { stopped <- srv.Run(ctx) }()
	base := "http://" + ln.Addr().String()
	hc := &http.Client{Timeout: time.Minute}

	resp, err := hc.Post(base+"/v1/workflows", "application/yaml", strings.NewReader("name: waits\nsteps:\n  - {id: a, kind: noop}\n"))
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "%s", body)

	commands, err := js.Stream(t.Context(), bus.StreamCommands)
	require.NoError(t, err)
	info, err := commands.Info(t.Context())
	require.NoError(t, err)
	before := info.State.Msgs

	type answer struct {
		status int
		body   []byte
		err    error
	}
	answers := make(chan answer, 1)
	sent := time.Now()
	go func() {
		resp, err := hc.Post(base+"/v1/executions", "application/json", strings.NewReader(`{"workflow":"waits","id":"stopped-while-waiting"}`))
		if err != nil {
			answers <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		answers <- answer{status: resp.StatusCode, body: body, err: err}
	}()
	natstest.Eventually(t, time.Minute, func() bool {
		info, err := commands.Info(t.Context())
		return err == nil && info.State.Msgs > before
	}, "the start command is stored")
	stop()

	var a answer
	select {
	case a = <-answers:
	case <-time.After(time.Minute):
		t.Fatal("the start got no answer after the api stopped")
	}
	require.NoError(t, a.err)
	require.Less(t, time.Since(sent), time.Minute, "answered when StartWait passed, not when the api stopped")
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
	var started apiv1.Started
	require.NoError(t, json.Unmarshal(a.body, &started), "%q", a.body)
	require.Equal(t, "stopped-while-waiting", started.ID)
	require.Equal(t, "accepted", started.Status)
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		t.Fatal("the api did not stop")
	}
}
