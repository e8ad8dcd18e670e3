package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// gated waits for the signal "go" between two no-ops: an execution that
// stays where a test wants it until the test lets it go on.
const gated = `
name: gated
steps:
  - id: before
    kind: noop
  - id: gate
    kind: wait
    signal: go
  - id: after
    kind: noop
`

// followAll follows an execution's history with the client from sequence
// from and returns what it saw, once Follow returns.
func followAll(ctx context.Context, c *client.Client, id string, from uint64) ([]client.Event, error) {
	var seen []client.Event
	err := c.Follow(ctx, id, from, func(ev client.Event) error {
		seen = append(seen, ev)
		return nil
	})
	return seen, err
}

func types(evs []client.Event) []events.Type {
	out := make([]events.Type, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type
	}
	return out
}

// TestFollowGoesOnAfterCancelAndResume: a history that holds
// execution.cancelled followed by a resume is followed to the execution's
// current end, not to the first terminal-looking event (the README's
// cancel, resume, follow).
func TestFollowGoesOnAfterCancelAndResume(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.apply(t, gated)
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "gated", ID: "follow-1"})
	require.NoError(t, err)
	s.waitStepStatus(t, "follow-1", "gate", projections.OpWaiting)
	_, err = s.c.Act(ctx, "follow-1", client.ActionRequest{Action: events.ActionCancel, Reason: "test"})
	require.NoError(t, err)
	require.Equal(t, projections.StatusCancelled, s.waitDone(t, "follow-1", 20*time.Second).Status)
	acted, err := s.c.Act(ctx, "follow-1", client.ActionRequest{Action: events.ActionResume, Reason: "test"})
	require.NoError(t, err)
	require.True(t, acted.Recorded)

	// Follow from the start: it must not stop at execution.cancelled.
	done := make(chan error, 1)
	var seen []client.Event
	go func() {
		var err error
		seen, err = followAll(ctx, s.c, "follow-1", 0)
		done <- err
	}()
	// The read model may still show the cancelled execution, whose gate
	// was waiting: wait for the resumed one.
	require.Eventually(t, func() bool {
		x, err := s.c.Execution(ctx, "follow-1")
		return err == nil && x.Status == projections.StatusStarted && func() bool { st, ok := findStep(x, "gate"); return ok && st.Status == projections.OpWaiting }()
	}, 20*time.Second, 20*time.Millisecond)
	_, err = s.c.Signal(ctx, "follow-1", "go", nil)
	require.NoError(t, err)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("follow did not end after the resumed execution succeeded")
	}
	got := types(seen)
	require.Contains(t, got, events.TypeExecutionCancelled)
	require.Contains(t, got, events.TypeExecutionResumed)
	require.Equal(t, events.TypeExecutionSucceeded, got[len(got)-1], "%v", got)
	requireGapless(t, s.history(t, "follow-1"), seen)

	// Following an execution that is settled again ends at once, with
	// everything, and the last status decides.
	seen, err = followAll(ctx, s.c, "follow-1", 0)
	require.NoError(t, err)
	require.Equal(t, events.TypeExecutionSucceeded, seen[len(seen)-1].Type)
}

// TestAFollowLeavesNoConsumerBehind: a follow of an execution's events
// reads them with a consumer of its own on the events stream; once the
// follow ends, the api deletes it. Left to the server's inactivity
// threshold, a client that follows again and again (a CLI's run --watch
// in a loop: a new user's try reached it after about 500 in 5 minutes)
// took the stream's 1,000 consumers (nats-server's default limit), and
// every follow failed with an error 500 until they expired.
func TestAFollowLeavesNoConsumerBehind(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s.apply(t, "name: quick\nsteps:\n  - {id: a, kind: noop}\n")
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "quick", ID: "quick-1"})
	require.NoError(t, err)
	s.waitDone(t, "quick-1", 30*time.Second)
	consumers := func() (int, error) {
		stream, err := s.js.Stream(ctx, bus.StreamEvents)
		if err != nil {
			return 0, err
		}
		names := stream.ConsumerNames(ctx)
		n := 0
		for range names.Name() { // read to the end: the lister's goroutine ends then
			n++
		}
		return n, names.Err()
	}
	before, err := consumers()
	require.NoError(t, err)
	const follows = 20
	for range follows {
		seen, err := followAll(ctx, s.c, "quick-1", 0)
		require.NoError(t, err)
		require.NotEmpty(t, seen)
	}
	// Within 15 s: the server's own threshold (followInactive, 30 s)
	// would reap them only later.
	poll(t, 15*time.Second, "the follows' consumers deleted", func() (bool, string) {
		n, err := consumers()
		if err != nil {
			return false, err.Error()
		}
		return n <= before, fmt.Sprintf("%d consumers on %s after %d follows, %d before", n, bus.StreamEvents, follows, before)
	})
}

// requireGapless checks that seen is exactly the history: no event missed,
// none twice, in order.
func requireGapless(t *testing.T, history []events.Event, seen []client.Event) {
	t.Helper()
	want := make([]uint64, len(history))
	for i, ev := range history {
		want[i] = ev.Seq
	}
	got := make([]uint64, len(seen))
	for i, ev := range seen {
		got[i] = ev.Seq
	}
	require.Equal(t, want, got)
}

// sse reads a server-sent events answer: the events' ids, and whether the
// server ended the stream (rather than ctx).
func sse(ctx context.Context, t *testing.T, url string, hdr map[string]string, until func(seq uint64) bool) (status int, seqs []uint64, ended bool) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/event-stream")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := apiHTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil, true
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "id: "); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			require.NoError(t, err)
			seqs = append(seqs, n)
			if until != nil && until(n) {
				return resp.StatusCode, seqs, false // the caller cuts the stream here
			}
		}
	}
	return resp.StatusCode, seqs, sc.Err() == nil && ctx.Err() == nil
}

// TestSSEReconnects: a browser's EventSource reconnects with Last-Event-ID
// whenever a stream ends. Cut while the execution runs, the stream goes on
// where it stopped (no gap, no duplicate) and ends with the execution;
// asked again with the last id of an ended execution, the answer is 204 at
// once (EventSource stops there), and a Last-Event-ID that is no event id
// is a 400.
func TestSSEReconnects(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.apply(t, gated)
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "gated", ID: "sse-1"})
	require.NoError(t, err)
	url := s.info.APIURL + "/v1/executions/sse-1/events"

	// Read until the wait is recorded, then cut the stream.
	s.waitStepStatus(t, "sse-1", "gate", projections.OpWaiting)
	var waiting uint64
	for _, ev := range s.history(t, "sse-1") {
		if ev.Type == events.TypeStepWaiting {
			waiting = ev.Seq
		}
	}
	require.NotZero(t, waiting)
	status, first, ended := sse(ctx, t, url, nil, func(seq uint64) bool { return seq >= waiting })
	require.Equal(t, http.StatusOK, status)
	require.False(t, ended)
	require.NotEmpty(t, first)
	_, err = s.c.Signal(ctx, "sse-1", "go", nil)
	require.NoError(t, err)
	last := first[len(first)-1]
	status, rest, ended := sse(ctx, t, url, map[string]string{"Last-Event-ID": fmt.Sprint(last)}, nil)
	require.Equal(t, http.StatusOK, status)
	require.True(t, ended, "the stream must end with the execution")
	history := s.history(t, "sse-1")
	var want []uint64
	for _, ev := range history {
		want = append(want, ev.Seq)
	}
	require.Equal(t, want, append(first, rest...), "no gap, no duplicate")
	require.Equal(t, events.TypeExecutionSucceeded, history[len(history)-1].Type)

	// Reconnecting after the last event: 204, without waiting.
	end := want[len(want)-1]
	quick, stop := context.WithTimeout(ctx, 10*time.Second)
	defer stop()
	status, _, _ = sse(quick, t, url, map[string]string{"Last-Event-ID": fmt.Sprint(end)}, nil)
	require.Equal(t, http.StatusNoContent, status)
	status, _, _ = sse(quick, t, fmt.Sprintf("%s?from_seq=%d", url, end+1000), nil, nil)
	require.Equal(t, http.StatusNoContent, status)
	// One event left: it is sent, then the stream ends.
	status, seqs, ended := sse(quick, t, url, map[string]string{"Last-Event-ID": fmt.Sprint(want[len(want)-2])}, nil)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, []uint64{end}, seqs)
	require.True(t, ended)

	// A Last-Event-ID that is not an id of this stream is a 400 naming it.
	req, err := http.NewRequestWithContext(quick, http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Last-Event-ID", "not-a-number")
	resp, err := apiHTTP.Do(req)
	require.NoError(t, err)
	var body struct{ Error client.Error }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Equal(t, "Last-Event-ID", body.Error.Field)
}

// TestClientFollowReconnects: pkg/client's Follow, cut by the server
// going away mid-stream (an api restart), carries on with Last-Event-ID
// from a new connection and misses nothing.
func TestClientFollowReconnects(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s.apply(t, gated)
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "gated", ID: "reconnect-1"})
	require.NoError(t, err)
	s.waitStepStatus(t, "reconnect-1", "gate", projections.OpWaiting)

	// A proxy in front of the api that drops the first connection after
	// its first event: Follow must reconnect through it.
	proxy := newCuttingProxy(t, s.info.APIURL)
	c := client.New(proxy.url)
	done := make(chan error, 1)
	var seen []client.Event
	go func() {
		var err error
		seen, err = followAll(ctx, c, "reconnect-1", 0)
		done <- err
	}()
	require.Eventually(t, func() bool { return proxy.cuts.Load() > 0 }, 30*time.Second, 10*time.Millisecond, "the proxy never cut a stream")
	_, err = s.c.Signal(ctx, "reconnect-1", "go", nil)
	require.NoError(t, err)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("follow did not end")
	}
	require.Greater(t, proxy.requests.Load(), int64(1), "Follow reconnected")
	requireGapless(t, s.history(t, "reconnect-1"), seen)
}

// cuttingProxy forwards requests to the api and breaks the first event
// stream after its first event, as a restarting api or a dropped
// connection would.
type cuttingProxy struct {
	url            string
	requests, cuts atomic.Int64
}

func newCuttingProxy(t *testing.T, api string) *cuttingProxy {
	t.Helper()
	p := &cuttingProxy{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := p.requests.Add(1)
		req, err := http.NewRequestWithContext(r.Context(), r.Method, api+r.URL.RequestURI(), r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		req.Header = r.Header.Clone()
		resp, err := apiHTTP.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		flusher := w.(http.Flusher)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 8<<20)
		events := 0
		for sc.Scan() {
			fmt.Fprintln(w, sc.Text())
			flusher.Flush()
			if sc.Text() == "" {
				events++
			}
			if n == 1 && events == 1 {
				p.cuts.Add(1)
				panic(http.ErrAbortHandler) // drop the connection mid-stream
			}
		}
	}))
	t.Cleanup(srv.Close)
	p.url = srv.URL
	return p
}
