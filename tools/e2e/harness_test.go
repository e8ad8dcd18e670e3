package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/history/historytest"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/projector"
	"jetflow.dev/tools/internal/devstack"
)

type stack struct {
	info devstack.Info
	c    *client.Client
	nc   *nats.Conn
	js   jetstream.JetStream
	// stop stops the stack (also done when the test ends).
	stop func()
}

// startStack runs the whole system in-process on free loopback ports.
func startStack(t *testing.T, mod func(*devstack.Config)) *stack {
	t.Helper()
	cfg := devstack.Config{
		DataDir: t.TempDir(), NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Log:         zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel),
		TaskAckWait: 2 * time.Second, JanitorInterval: 500 * time.Millisecond, IdleAfter: 5 * time.Second,
		// The tests check the dispatcher's verdict on a command (201, 200
		// recorded, 4xx), not how fast it comes: on a loaded machine it can
		// take longer than the api's default wait, which answers 202.
		StartWait: 30 * time.Second,
		// Tests read their executions after they end; retention tests set their own.
		RetentionDefault: "forever",
		// One dispatcher, nothing to fail over to: on a machine running
		// every package's tests at once, 1s leases lapsed and stalled
		// executions while the dispatcher took its partitions back.
		LeaseTTL: 5 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan devstack.Info, 1)
	done := make(chan error, 1)
	go func() { done <- devstack.Run(ctx, cfg, func(i devstack.Info) { ready <- i }) }()
	// Each replicated stream and bucket is a raft group over three
	// servers: on a loaded machine creating them can take each service a
	// few request timeouts (they retry until it is done).
	startIn := 30 * time.Second
	if cfg.Replicas > 1 {
		startIn = 90 * time.Second
	}
	var info devstack.Info
	select {
	case info = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("stack stopped: %v", err)
	case <-time.After(startIn):
		cancel()
		t.Fatalf("stack did not start within %s", startIn)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("stack did not stop")
			}
		})
	}
	t.Cleanup(stop)
	nc, err := info.Connect(auth.RoleAdmin, "e2e-test")
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	apiTokens.Store(strings.TrimPrefix(info.APIURL, "http://"), info.AdminToken)
	t.Cleanup(func() { apiTokens.Delete(strings.TrimPrefix(info.APIURL, "http://")) })
	s := &stack{info: info, c: info.Client(), nc: nc, js: js, stop: stop}
	require.Eventually(t, func() bool {
		resp, err := http.Get(info.APIURL + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == 200
	}, 10*time.Second, 20*time.Millisecond)
	return s
}

// apiTokens maps each running stack's api address to its admin token.
var apiTokens sync.Map

// tokenTransport adds the admin token of the stack a request is for, so
// that the tests which speak raw HTTP to an api pass its authentication
// (a request that sets its own Authorization keeps it).
type tokenTransport struct{}

func (tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if tok, ok := apiTokens.Load(r.URL.Host); ok && tok.(string) != "" && r.Header.Get("Authorization") == "" {
		r = r.Clone(r.Context())
		r.Header.Set("Authorization", "Bearer "+tok.(string))
	}
	return http.DefaultTransport.RoundTrip(r)
}

// apiHTTP is the HTTP client of tests that call an api with raw requests.
var apiHTTP = &http.Client{Transport: tokenTransport{}}

func (s *stack) apply(t *testing.T, yaml string) client.Applied {
	t.Helper()
	a, err := s.c.ApplyWorkflow(context.Background(), []byte(yaml))
	require.NoError(t, err)
	return a
}

// doneAtLeast is the shortest wait for an execution to finish.
const doneAtLeast = 90 * time.Second

// waitDone polls the api until the execution reaches a terminal state.
func (s *stack) waitDone(t *testing.T, id string, timeout time.Duration) projections.Execution {
	t.Helper()
	// timeout is what the execution needs on a quiet machine; a busy CI
	// machine running every package at once has starved a stack for
	// longer (its dispatcher's leases lapsing), so no wait is shorter
	// than doneAtLeast. A passing test waits no longer for it.
	timeout = max(timeout, doneAtLeast)
	var x projections.Execution
	poll(t, timeout, "execution "+id+" finishes", func() (bool, string) {
		var err error
		x, err = s.c.Execution(context.Background(), id)
		if err != nil {
			return false, err.Error()
		}
		return x.Status.Terminal(), describe(x)
	})
	return x
}

// describe sums up an execution for a failure message.
func describe(x projections.Execution) string {
	steps := make([]string, len(x.Steps))
	for i, st := range x.Steps {
		steps[i] = st.ID + ":" + string(st.Status)
	}
	return fmt.Sprintf("status %q error %q steps %v", x.Status, x.Error, steps)
}

// runToEnd starts an execution and waits (20 s at most) until it ends.
func (s *stack) runToEnd(t *testing.T, req client.StartRequest) projections.Execution {
	t.Helper()
	st, err := s.c.Start(context.Background(), req)
	require.NoError(t, err)
	return s.waitDone(t, st.ID, 20*time.Second)
}

// history reads an execution's events straight from the stream.
func (s *stack) history(t *testing.T, id string) []events.Event {
	t.Helper()
	var evs []events.Event
	var err error
	require.Eventually(t, func() bool { // retried: a cluster may be electing a leader
		evs, err = history.Read(context.Background(), s.js, bus.ExecutionFilter(id), 0)
		return err == nil
	}, 20*time.Second, 50*time.Millisecond, "read history of %s: %v", id, err)
	return evs
}

// countTypes counts events by type (and step id for step events).
func countTypes(evs []events.Event) map[string]int {
	n := map[string]int{}
	for _, ev := range evs {
		key := string(ev.Type)
		switch p := ev.Data.(type) {
		case *events.ExecutionStarted:
			if p.Then != nil { // the first operation's dispatch, in the same event
				n[string(events.TypeStepDispatched)+"/"+p.Then.StepID]++
			}
		case *events.StepSucceeded:
			key += "/" + p.StepID
			if p.Then != nil { // the next operation's dispatch, in the same event
				n[string(events.TypeStepDispatched)+"/"+p.Then.StepID]++
			}
		case *events.ExecutionSucceeded:
			if p.Step != nil { // the last step's success, in the same event (docs/adr/0015)
				n[string(events.TypeStepSucceeded)+"/"+p.Step.StepID]++
			}
		case *events.StepFailed:
			key += "/" + p.StepID
		case *events.StepScheduled:
			key += "/" + p.StepID
		case *events.StepDispatched:
			key += "/" + p.StepID
		}
		n[key]++
	}
	return n
}

// requireLinear checks that a history is linear (each event appended
// right after the one before it, see historytest.Linear) and that it
// folds without error.
func requireLinear(t *testing.T, evs []events.Event) projections.Execution {
	t.Helper()
	historytest.RequireLinear(t, evs)
	x, err := projections.Fold(evs)
	require.NoError(t, err)
	return x
}

// waitCommandsHandled waits until the dispatcher has acknowledged every
// command published so far: after it, a duplicate sent before was handled
// (recognised, refused or applied), not merely not yet read.
func (s *stack) waitCommandsHandled(t *testing.T) {
	t.Helper()
	waitDispatchersCaughtUp(t, s.js, bus.StreamCommands)
}

// waitDurableCaughtUp waits until one durable consumer has acknowledged
// every message its stream holds.
func waitDurableCaughtUp(t *testing.T, js jetstream.JetStream, streamName, consumer string) {
	t.Helper()
	ctx := context.Background()
	poll(t, 30*time.Second, "consumer "+consumer+" of "+streamName+" caught up", func() (bool, string) {
		stream, err := js.Stream(ctx, streamName)
		if err != nil {
			return false, err.Error()
		}
		info, err := stream.Info(ctx)
		if err != nil {
			return false, err.Error()
		}
		cons, err := js.Consumer(ctx, streamName, consumer)
		if err != nil {
			return false, err.Error()
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			return false, err.Error()
		}
		return ci.AckFloor.Stream >= info.State.LastSeq && ci.NumPending == 0 && ci.NumAckPending == 0,
			fmt.Sprintf("stream last seq %d, ack floor %d, %d pending, %d unacknowledged",
				info.State.LastSeq, ci.AckFloor.Stream, ci.NumPending, ci.NumAckPending)
	})
}

// waitDispatchersCaughtUp waits until the dispatchers' consumers of a stream
// (the shared one and every partition's) have handled every message it
// holds; for the commands stream, the partitions' inboxes too.
func waitDispatchersCaughtUp(t *testing.T, js jetstream.JetStream, streamName string) {
	t.Helper()
	ctx := context.Background()
	streams := []string{streamName}
	if streamName == bus.StreamCommands {
		streams = append(streams, bus.StreamInbox)
	}
	poll(t, 30*time.Second, "dispatcher consumers of "+streamName+" caught up", func() (bool, string) {
		for _, name := range streams {
			stream, err := js.Stream(ctx, name)
			if err != nil {
				return false, err.Error()
			}
			list := stream.ListConsumers(ctx)
			var mine []*jetstream.ConsumerInfo
			partitions := 0
			for ci := range list.Info() { // read to the end: the lister's goroutine ends then
				if strings.HasPrefix(ci.Name, "dispatcher-") {
					mine = append(mine, ci)
				}
				if last := ci.Name[len(ci.Name)-1]; strings.HasPrefix(ci.Name, "dispatcher-") && last >= '0' && last <= '9' {
					partitions++ // dispatcher-<kind>-<p>
				}
			}
			if err := list.Err(); err != nil {
				return false, err.Error()
			}
			for _, ci := range mine {
				// Not NumPending alone: a consumer learns of a message a
				// moment after its publish is acknowledged.
				caught, busy, err := natstest.CaughtUp(ctx, js, ci)
				if err != nil {
					return false, err.Error()
				}
				if !caught {
					return false, busy
				}
			}
			if name != bus.StreamCommands && partitions < partition.DefaultCount {
				return false, fmt.Sprintf("%d of %d partition consumers on %s", partitions, partition.DefaultCount, name)
			}
		}
		return true, ""
	})
}

// poll calls cond in the test's goroutine (so cond may use require) every
// 20 ms until it reports true, failing the test with what cond last said
// if timeout passes first.
func poll(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last: %s", what, timeout, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitProjected waits until the dispatcher has handled every command so
// far and the projector has folded every event then in the history into
// the read models.
func (s *stack) waitProjected(t *testing.T) {
	t.Helper()
	s.waitCommandsHandled(t)
	waitDurableCaughtUp(t, s.js, bus.StreamEvents, projector.Consumer)
}

// waitProgress waits until the history of execution id (of workflow wf)
// ends with a terminal event, failing if a stall passes without a new
// event before that (or if it takes more than three minutes in all).
func (s *stack) waitProgress(t *testing.T, wf, id string, stall time.Duration) {
	t.Helper()
	ctx := context.Background()
	stream, err := s.js.Stream(ctx, bus.StreamEvents)
	require.NoError(t, err)
	var last uint64
	moved, give := time.Now(), time.Now().Add(3*time.Minute)
	for {
		m, err := stream.GetLastMsgForSubject(ctx, bus.ExecutionSubject(wf, id))
		if err == nil {
			switch events.Type(m.Header.Get("ce-type")) {
			case events.TypeExecutionSucceeded, events.TypeExecutionFailed, events.TypeExecutionCancelled:
				return
			}
			if m.Sequence != last {
				last, moved = m.Sequence, time.Now()
			}
		} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Logf("read the end of %s's history: %v", id, err)
		}
		if time.Since(moved) > stall {
			t.Fatalf("%s stalled: no new event for %s (the last at seq %d)", id, stall, last)
		}
		if time.Now().After(give) {
			t.Fatalf("%s still runs after three minutes (seq %d)", id, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// requireNoRejection checks that the dispatcher published no rejection of
// the command commandKey.
func (s *stack) requireNoRejection(t *testing.T, commandKey string) {
	t.Helper()
	stream, err := s.js.Stream(context.Background(), bus.StreamRejections)
	require.NoError(t, err)
	m, err := stream.GetLastMsgForSubject(context.Background(), bus.RejectionSubject(commandKey))
	if err == nil {
		rej, _ := bus.Decode(m.Header, m.Data)
		t.Fatalf("command %s was rejected: %+v", commandKey, rej.Data)
	}
	require.ErrorIs(t, err, jetstream.ErrMsgNotFound)
}

// requireCountStays checks, for a while, that the history of id keeps
// exactly want events of type typ (countTypes keys: "type" or
// "type/step"). A second copy of something handled once must not show up
// late either.
func (s *stack) requireCountStays(t *testing.T, id, key string, want int) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		got := countTypes(s.history(t, id))[key]
		require.Equal(t, want, got, "%s: %s in the history", id, key)
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// gate holds an exec step running until the test opens it: the step's
// command waits for a file. It is opened when the test ends at the
// latest, and a held command gives up after two minutes anyway, so that
// no process outlives a failed test for long.
type gate struct{ path string }

func newGate(t *testing.T) *gate {
	t.Helper()
	g := &gate{path: filepath.Join(t.TempDir(), "gate")}
	t.Cleanup(g.open)
	return g
}

// then returns a shell script that waits for the gate, then runs cmd.
func (g *gate) then(cmd string) string {
	return fmt.Sprintf(`i=0; while [ ! -e '%s' ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i+1)); done; %s`, g.path, cmd)
}

func (g *gate) open() { _ = os.WriteFile(g.path, nil, 0o600) }

// waitResult waits until an agent's final report (success or failure) on
// step of execution id is stored and the dispatcher has handled every
// result so far: what the report changes (or must not change) is then in
// the history. It is for a report that comes when its execution is not
// running (ended, suspended): handed straight to the dispatcher, such a
// report is stored too, for a resume to find (docs/adr/0009).
func (s *stack) waitResult(t *testing.T, id, step string) {
	t.Helper()
	poll(t, 30*time.Second, "a final result of "+id+" step "+step, func() (bool, string) {
		evs, err := history.ReadStream(context.Background(), s.js, bus.StreamResults, bus.ExecutionResults(id), 0, 0)
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range evs {
			ref, ok := events.ResultRef(ev.Data)
			if !ok {
				continue
			}
			seen = append(seen, string(ev.Type)+"/"+ref.StepID)
			if ref.StepID == step && (ev.Type == events.TypeOperationSucceeded || ev.Type == events.TypeOperationFailed) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("results %v", seen)
	})
	waitDispatchersCaughtUp(t, s.js, bus.StreamResults)
}

// waitTimerHandled waits until the durable timer timerID has fired (its
// JetStream schedule is gone) and the dispatcher has handled every timer
// that fired.
func (s *stack) waitTimerHandled(t *testing.T, timerID string) {
	t.Helper()
	stream, err := s.js.Stream(context.Background(), bus.StreamTimers)
	require.NoError(t, err)
	poll(t, 30*time.Second, "timer "+timerID+" fired", func() (bool, string) {
		_, err := stream.GetLastMsgForSubject(context.Background(), bus.ScheduleSubject(timerID))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return true, ""
		}
		return false, fmt.Sprintf("schedule still there (%v)", err)
	})
	waitDispatchersCaughtUp(t, s.js, bus.StreamTimers)
}

// timedOut reports whether err is a request that got no answer in time:
// on a machine starved by other work (the CI's, sometimes so much that
// every service misses its renewals) a test's own poll of the streams
// can time out. A poll that is asked again in its next round passes over
// it; what the test checks keeps a deadline of its own.
func timedOut(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}
