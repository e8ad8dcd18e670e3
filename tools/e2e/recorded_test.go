package e2e

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/api"
	"jetflow.dev/services/dispatcher/dispatch"
)

// TestRecordedMeansInTheHistory: the api answers a command "recorded"
// only once the event that records it is stored in the history. It learns
// of the event from a plain NATS subscription on the history subject,
// which also sees an append that the events stream refused (it lost the
// expected-sequence check to another writer) and can see an append before
// the stream has stored it. The test plays the dispatcher: a refused
// append recording the signal must not make the api answer; the stored
// append that follows must.
func TestRecordedMeansInTheHistory(t *testing.T) {
	t.Parallel()
	srv := natstest.RunJetStream(t)
	nc, js := natstest.Connect(t, srv)
	ctx := context.Background()
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	applyWorkflows(t, js, "name: gated\nsteps:\n  - {id: gate, kind: wait, signal: go, timeout: 1h}\n")

	// A dispatcher starts the execution, then stops: from here the test
	// writes the history.
	d, err := dispatch.New(ctx, dispatch.Config{}, js, log)
	require.NoError(t, err)
	dctx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- d.Run(dctx) }()
	start := events.New("urn:test", "", "", time.Now(), &events.StartExecution{Workflow: "gated", ExecutionID: "x1"})
	msg, err := bus.Encode(bus.SubjectStart, start)
	require.NoError(t, err)
	_, err = js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	subject := bus.ExecutionSubject("gated", "x1")
	var x projections.Execution
	poll(t, 20*time.Second, "x1 waits at its gate", func() (bool, string) {
		evs, err := history.Read(ctx, js, subject, 0)
		require.NoError(t, err)
		x, err = projections.Fold(evs)
		require.NoError(t, err)
		st, ok := findStep(x, "gate")
		return ok && st.Status == projections.OpWaiting, describe(x)
	})
	stop()
	require.NoError(t, <-stopped)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	apiNC, apiJS := natstest.Connect(t, srv)
	natstest.Serve(t, func(ctx context.Context) error {
		return api.Serve(ctx, api.Config{Listener: ln, StartWait: 20 * time.Second, Auth: api.AuthConfig{Disabled: true}}, apiNC, apiJS, log)
	})
	base := "http://" + ln.Addr().String()
	poll(t, 10*time.Second, "the api answers", func() (bool, string) {
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})

	type answer struct {
		status int
		body   map[string]any
		at     time.Time
	}
	answered := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/executions/x1/signals/note", strings.NewReader(`{"n":1}`))
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- answer{status: -1, body: map[string]any{"error": err.Error()}}
			return
		}
		defer resp.Body.Close()
		var body map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&body)
		answered <- answer{status: resp.StatusCode, body: body, at: time.Now()}
	}()
	key := events.CommandKey("jetflow/api", "idem-k1")
	commands, err := js.Stream(ctx, bus.StreamCommands)
	require.NoError(t, err)
	poll(t, 10*time.Second, "the api published the signal command (it listens on the history first)", func() (bool, string) {
		_, err := commands.GetLastMsgForSubject(ctx, bus.SubjectAPISignal)
		return err == nil, "not yet"
	})

	appendEvent := func(prev uint64, p events.Payload) events.Event {
		ev := events.New("jetflow/dispatcher", "x1", "gated", time.Now(), p)
		ev.PrevSeq = prev
		seq, err := history.Append(ctx, js, subject, prev, ev)
		require.NoError(t, err)
		ev.Seq = seq
		return ev
	}
	recording := &events.SignalReceived{SignalID: events.SignalID(key), Name: "note", Data: json.RawMessage(`{"n":1}`), Sender: "jetflow/api"}

	t.Log("another writer appends first; this writer's append of the signal is refused")
	other := appendEvent(x.LastSeq, &events.SignalReceived{SignalID: "sig-other", Name: "other", Sender: "urn:test"})
	refused := events.New("jetflow/dispatcher", "x1", "gated", time.Now(), recording)
	refused.PrevSeq = x.LastSeq
	msg, err = bus.Encode(subject, refused)
	require.NoError(t, err)
	msg.Header.Set(jetstream.MsgIDHeader, refused.ID)
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(x.LastSeq, 10))
	require.NoError(t, nc.PublishMsg(msg)) // as an append without waiting for its answer
	require.NoError(t, nc.Flush())
	stream, err := js.Stream(ctx, bus.StreamEvents)
	require.NoError(t, err)
	last, err := stream.GetLastMsgForSubject(ctx, subject)
	require.NoError(t, err)
	require.Equal(t, other.Seq, last.Sequence, "the stream refused the append")

	select {
	case a := <-answered:
		t.Fatalf("the api answered %d %v for a signal the history does not hold", a.status, a.body)
	case <-time.After(time.Second):
	}

	t.Log("the retried append is stored: now it is recorded")
	stored := appendEvent(other.Seq, recording)
	var a answer
	select {
	case a = <-answered:
	case <-time.After(20 * time.Second):
		t.Fatal("the api did not answer after the signal was stored")
	}
	require.Equal(t, http.StatusOK, a.status, a.body)
	require.Equal(t, true, a.body["recorded"], a.body)
	evs, err := history.Read(ctx, js, subject, 0)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	require.Equal(t, stored.ID, evs[len(evs)-1].ID)
}
