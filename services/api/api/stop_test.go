package api

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
)

// TestTheAPIStopsAnsweringWhatIsUnderWay: when the api stops, a start
// whose command is stored and that waits for the dispatcher's answer is
// answered 202 accepted, with its execution's id (a dispatcher handles
// the command later), not with an empty answer that a client reads as a
// failure and sends again; an event stream under way ends cleanly (its
// client reconnects from the last event's id), not cut when the grace
// runs out; and Run returns.
func TestTheAPIStopsAnsweringWhatIsUnderWay(t *testing.T) {
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

	// An execution claimed with no history yet: its event stream opens
	// and waits for its first event.
	ids, err := claim.Open(t.Context(), js)
	require.NoError(t, err)
	_, err = ids.Claim(t.Context(), "followed", claim.Record{CommandKey: "test#followed", Workflow: "waits", ClaimedAt: time.Now()})
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/v1/executions/followed/events", nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/event-stream")
	type opening struct {
		status int
		ctype  string
		err    error
	}
	type ending struct {
		body string
		err  error
	}
	opened, streamed := make(chan opening, 1), make(chan ending, 1)
	go func() {
		resp, err := hc.Do(req)
		if err != nil {
			opened <- opening{err: err}
			return
		}
		defer resp.Body.Close()
		opened <- opening{status: resp.StatusCode, ctype: resp.Header.Get("Content-Type")}
		b, err := io.ReadAll(resp.Body)
		streamed <- ending{body: string(b), err: err}
	}()
	o := within(t, opened, "the event stream did not open")
	require.NoError(t, o.err)
	require.Equal(t, http.StatusOK, o.status)
	require.Equal(t, "text/event-stream", o.ctype)

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

	a := within(t, answers, "the start got no answer after the api stopped")
	require.NoError(t, a.err)
	require.Less(t, time.Since(sent), time.Minute, "answered when StartWait passed, not when the api stopped")
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
	var started apiv1.Started
	require.NoError(t, json.Unmarshal(a.body, &started), "%q", a.body)
	require.Equal(t, "stopped-while-waiting", started.ID)
	require.Equal(t, "accepted", started.Status)

	sr := within(t, streamed, "the event stream did not end when the api stopped")
	require.NoError(t, sr.err, "the stream ended as a response ends, not cut with its connection")
	require.NotContains(t, sr.body, "unavailable", "nothing but the stream's lines in it")
	_ = within(t, stopped, "the api did not stop") // Run returns nil once its context ends
}

// within is what ch gives, which it must within a minute (else the test
// fails, saying late).
func within[T any](t *testing.T, ch <-chan T, late string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatal(late)
		panic("unreachable")
	}
}

// TestARequestCutShortByTheStopIsRetryable: a request still running when
// the api's grace for stopping ran out (its context ended with
// errStopping) answers 503 unavailable with Retry-After, which clients
// retry, where it answered 500 (a failure it reported as internal) or,
// for a list, nothing (net/http's empty 200).
func TestARequestCutShortByTheStopIsRetryable(t *testing.T) {
	t.Parallel()
	s := &Server{log: zerolog.Nop()}
	for name, answer := range map[string]func(http.ResponseWriter, *http.Request){
		"internal":          func(w http.ResponseWriter, r *http.Request) { s.internal(w, r, context.Canceled) },
		"index unavailable": func(w http.ResponseWriter, r *http.Request) { s.indexUnavailable(w, r, context.Canceled) },
	} {
		ctx, cancel := context.WithCancelCause(t.Context())
		cancel(errStopping)
		rec := httptest.NewRecorder()
		answer(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/v1/executions", nil))
		require.Equal(t, http.StatusServiceUnavailable, rec.Code, name)
		require.Equal(t, RetryAfter, rec.Header().Get("Retry-After"), name)
		require.Contains(t, rec.Body.String(), "the api is stopping", name)

		// A client that went away is another matter: no retry is asked.
		ctx, cancel = context.WithCancelCause(t.Context())
		cancel(nil)
		rec = httptest.NewRecorder()
		answer(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/v1/executions", nil))
		require.NotEqual(t, http.StatusServiceUnavailable, rec.Code, name)
	}
}

// TestACommandIsPublishedWhateverBecomesOfItsRequest: publishCommand
// stores the command even when the request's context has ended (its
// client went away, or the api stopped under it): once taken, a command
// is stored or refused, never cut short after it may have been stored.
func TestACommandIsPublishedWhateverBecomesOfItsRequest(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	srv, err := New(t.Context(), Config{Auth: AuthConfig{Disabled: true}}, js.Conn(), js, zerolog.Nop())
	require.NoError(t, err)
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(errStopping)
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/executions", nil)
	cmd := events.New("test", "gone-1", "waits", time.Now(), &events.StartExecution{Workflow: "waits", ExecutionID: "gone-1"})
	msg, err := bus.Encode(bus.SubjectAPIStart, cmd)
	require.NoError(t, err)
	ack, err := srv.publishCommand(r, msg, "gone-1-command")
	require.NoError(t, err)
	stored, err := js.Stream(t.Context(), bus.StreamCommands)
	require.NoError(t, err)
	m, err := stored.GetMsg(t.Context(), ack.Sequence)
	require.NoError(t, err)
	require.Equal(t, "gone-1-command", m.Header.Get(jetstream.MsgIDHeader))
}

// TestServeGracefully: when the api stops, a request under way that ends
// within the grace gets its answer as if nothing happened (its context
// did not end: a handler that watched it answers 200, not its
// cancellation); one still running when the grace ends has its context
// ended with errStopping and its 503 reaches the client before the
// connection closes; and no new request is taken.
func TestServeGracefully(t *testing.T) {
	t.Parallel()
	entered := make(chan string, 2)
	mux := http.NewServeMux()
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		entered <- "slow"
		select {
		case <-time.After(200 * time.Millisecond): // well within the grace
			_, _ = io.WriteString(w, "done")
		case <-r.Context().Done():
			http.Error(w, "cut short", http.StatusInternalServerError)
		}
	})
	mux.HandleFunc("/stuck", func(w http.ResponseWriter, r *http.Request) {
		entered <- "stuck"
		<-r.Context().Done() // only the end of the grace ends it
		if stoppedUnder(r) {
			unavailableStopping(w)
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	stopping := make(chan struct{})
	served := make(chan error, 1)
	go func() { served <- serveGracefully(ctx, ln, mux, 2*time.Second, func() { close(stopping) }) }()
	base := "http://" + ln.Addr().String()
	hc := &http.Client{Timeout: time.Minute}
	type answer struct {
		status int
		body   string
		err    error
	}
	get := func(path string, out chan<- answer) {
		resp, err := hc.Get(base + path)
		if err != nil {
			out <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		out <- answer{status: resp.StatusCode, body: string(b), err: err}
	}
	slow, stuck := make(chan answer, 1), make(chan answer, 1)
	go get("/stuck", stuck)
	require.Equal(t, "stuck", within(t, entered, "the stuck request did not arrive"))
	go get("/slow", slow)
	require.Equal(t, "slow", within(t, entered, "the slow request did not arrive"))
	stop()
	within(t, stopping, "serveGracefully did not say it stops")

	s := within(t, slow, "the slow request got no answer")
	require.NoError(t, s.err)
	require.Equal(t, http.StatusOK, s.status, "a request under way finishes within the grace: %s", s.body)
	require.Equal(t, "done", s.body)
	k := within(t, stuck, "the stuck request got no answer")
	require.NoError(t, k.err, "its answer reached it before the connection closed")
	require.Equal(t, http.StatusServiceUnavailable, k.status, k.body)
	require.Contains(t, k.body, "the api is stopping")
	require.NoError(t, within(t, served, "serveGracefully did not return"))
	resp, err := hc.Get(base + "/slow")
	if err == nil {
		resp.Body.Close()
	}
	require.Error(t, err, "no new request is taken")
}
