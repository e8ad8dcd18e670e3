package e2e

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
)

// TestForgedAndMalformedEventsAreQuarantined: with the secure dev stack,
// the admin identity (the only one besides the dispatcher that may write
// histories) writes by mistake a message that is no event into one
// waiting execution's history, and a valid event that is illegal there
// (a step success for a step that never ran) into another's. Neither
// shows up as state: both executions are marked damaged with the sequence
// and the reason, in the api, `jetflow show` and `jetflow ls --damaged`;
// their histories are served with the bad event flagged (200); a signal
// is refused with the code damaged; other executions run on. An operate
// key cannot repair; the admin repairs with `jetflow repair`, the
// execution takes its signal and finishes, and its history still holds
// the bad message where it was.
func TestForgedAndMalformedEventsAreQuarantined(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s.apply(t, gated)
	for _, id := range []string{"q1", "q2"} {
		_, err := s.c.Start(ctx, client.StartRequest{Workflow: "gated", ID: id})
		require.NoError(t, err)
		s.waitStepStatus(t, id, "gate", projections.OpWaiting)
	}
	last := func(id string) uint64 {
		evs := s.history(t, id)
		require.NotEmpty(t, evs)
		return evs[len(evs)-1].Seq
	}

	t.Log("the admin writes a message that is no event into q1's history")
	ack, err := s.js.Publish(ctx, bus.ExecutionSubject("gated", "q1"), []byte(`{"status":"succeeded"}`),
		jetstream.WithExpectLastSequencePerSubject(last("q1")))
	require.NoError(t, err)
	bad1 := ack.Sequence
	t.Log("and a well-formed but illegal event into q2's: a step that never ran succeeded")
	forged := events.New("by-hand", "q2", "gated", time.Now(), &events.StepSucceeded{StepID: "after", Attempt: 1})
	bad2, err := history.Append(ctx, s.js, bus.ExecutionSubject("gated", "q2"), last("q2"), forged)
	require.NoError(t, err)

	for id, seq := range map[string]uint64{"q1": bad1, "q2": bad2} {
		var x projections.Execution
		poll(t, 30*time.Second, id+" shows its damage", func() (bool, string) {
			x, err = s.c.Execution(ctx, id)
			if err != nil {
				return false, err.Error()
			}
			return x.Damaged != nil, describe(x)
		})
		require.Equal(t, seq, x.Damaged.Seq)
		require.NotEmpty(t, x.Damaged.Reason)
		require.Equal(t, projections.StatusStarted, x.Status, "the bad event is not state")
		after, _ := findStep(x, "after")
		require.NotEqual(t, projections.OpSucceeded, after.Status, "the forged success is not state")

		evs, err := s.c.Events(ctx, id, 0)
		require.NoError(t, err, "the history is served, not a 500")
		require.NotEmpty(t, evs)
		require.Equal(t, seq, evs[len(evs)-1].Seq)
		if id == "q1" {
			require.NotEmpty(t, evs[len(evs)-1].Invalid, "flagged")
			require.Empty(t, evs[len(evs)-1].Data, "the bad message's content is not served as data")
		}

		_, err = s.c.Signal(ctx, id, "go", nil)
		var apiErr *client.Error
		require.True(t, errors.As(err, &apiErr), "a signal to a damaged execution: %v", err)
		require.Equal(t, http.StatusConflict, apiErr.Status)
		require.Equal(t, events.CodeDamaged, apiErr.Code)
		require.Contains(t, apiErr.Message, "--ignore-seq "+strconv.FormatUint(seq, 10))
	}

	jetflow := buildJetflow(t)
	out, err := runCmd(ctx, jetflow, "--api", s.info.APIURL, "--token", s.info.AdminToken, "show", "q1")
	require.NoError(t, err, out)
	require.Contains(t, out, "DAMAGED")
	require.Contains(t, out, "jetflow repair q1 --ignore-seq "+strconv.FormatUint(bad1, 10))
	list, _, err := s.c.ListExecutions(ctx, client.ListOptions{Damaged: true})
	require.NoError(t, err)
	require.Equal(t, []string{"q1", "q2"}, listIDs(list))
	out, err = runCmd(ctx, jetflow, "--api", s.info.APIURL, "--token", s.info.AdminToken, "ls", "--damaged")
	require.NoError(t, err, out)
	require.Contains(t, out, "DAMAGED@"+strconv.FormatUint(bad2, 10))

	t.Log("other executions run on")
	_, err = s.c.Start(ctx, client.StartRequest{Workflow: "gated", ID: "q3"})
	require.NoError(t, err)
	s.waitStepStatus(t, "q3", "gate", projections.OpWaiting)
	_, err = s.c.Signal(ctx, "q3", "go", nil)
	require.NoError(t, err)
	require.Equal(t, projections.StatusSucceeded, s.waitDone(t, "q3", 30*time.Second).Status)

	t.Log("an operate key may cancel, not repair")
	k, err := s.c.CreateKey(ctx, client.KeyRequest{Name: "oncall", Scopes: []string{"operate", "read"}, Namespaces: []string{"default"}})
	require.NoError(t, err)
	_, err = client.New(s.info.APIURL, client.WithToken(k.Token)).Act(ctx, "q1",
		client.ActionRequest{Action: events.ActionRepair, IgnoreSeq: bad1})
	require.True(t, client.IsStatus(err, http.StatusForbidden), "%v", err)

	t.Log("the admin repairs q1; it takes its signal and finishes")
	out, err = runCmd(ctx, jetflow, "--api", s.info.APIURL, "--token", s.info.AdminToken, "repair", "q1",
		"--ignore-seq", strconv.FormatUint(bad1, 10), "--reason", "a test wrote it")
	require.NoError(t, err, out)
	require.Contains(t, out, "repair of execution q1")
	poll(t, 30*time.Second, "q1 repaired in its read model", func() (bool, string) {
		x, err := s.c.Execution(ctx, "q1")
		return err == nil && x.Damaged == nil && len(x.Repairs) == 1, describe(x)
	})
	_, err = s.c.Signal(ctx, "q1", "go", nil)
	require.NoError(t, err)
	x := s.waitDone(t, "q1", 30*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status)
	require.Equal(t, []uint64{bad1}, x.Repairs)

	evs := s.history(t, "q1")
	var seen bool
	for _, ev := range evs {
		if ev.Seq == bad1 {
			seen = true
			require.NotEmpty(t, ev.Invalid, "the bad message is still there, as it was")
		}
		if r, ok := ev.Data.(*events.ExecutionRepaired); ok {
			require.Equal(t, bad1, r.IgnoreSeq)
			require.NotNil(t, r.Actor)
			require.Equal(t, events.ActorAPIKey, r.Actor.Method, "recorded with who asked, as authenticated")
			require.Equal(t, "a test wrote it", r.Reason)
		}
	}
	require.True(t, seen)
	require.Equal(t, 1, countTypes(evs)[string(events.TypeExecutionRepaired)])

	t.Log("q2 stays quarantined until it is repaired")
	x, err = s.c.Execution(ctx, "q2")
	require.NoError(t, err)
	require.NotNil(t, x.Damaged)
}
