package api

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
)

// TestAGetIsNotBehindTheHistory: GET /v1/executions/{id} and its /steps
// (and a command's check of the execution's status) answer the fold of
// the history when the read model is behind it (the
// projector writes a model up to a Coalesce after its events under load,
// and the api answered the fold before the model was written: a later
// GET must not answer an older state), the read model when it is
// current, and a read model that leaves something out as it is.
func TestAGetIsNotBehindTheHistory(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	ctx := t.Context()
	const id = "cur-1"
	ids, err := claim.Open(ctx, b.js)
	require.NoError(t, err)
	_, err = ids.Claim(ctx, id, claim.Record{CommandKey: "user#start-cur-1", Workflow: "wf", ClaimedAt: time.Now()})
	require.NoError(t, err)
	subject := bus.ExecutionSubject("wf", id)
	started := events.New("test", id, "wf", time.Now(), &events.ExecutionStarted{Workflow: "wf", Version: 1, Input: json.RawMessage(`{}`), Token: "t"})
	first, err := history.Append(ctx, b.js, subject, 0, started)
	require.NoError(t, err)
	signal := events.New("test", id, "wf", time.Now(), &events.SignalReceived{SignalID: "s1", Name: "go", Data: json.RawMessage(`{}`)})
	last, err := history.Append(ctx, b.js, subject, first, signal)
	require.NoError(t, err)

	kv, err := b.js.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
	started.Seq = first
	model, err := projections.Fold([]events.Event{started})
	require.NoError(t, err)
	require.Equal(t, first, model.LastSeq)
	store := func(x projections.Execution) {
		t.Helper()
		v, err := json.Marshal(x)
		require.NoError(t, err)
		_, err = kv.Put(ctx, id, v)
		require.NoError(t, err)
	}
	get := func() projections.Execution {
		t.Helper()
		a := b.call(t, http.MethodGet, "/v1/executions/"+id, b.admin, "", "")
		require.Equal(t, http.StatusOK, a.status, "%s", a.body)
		var x projections.Execution
		require.NoError(t, json.Unmarshal(a.body, &x))
		return x
	}

	// Behind: the signal is not in it; a step the history has not (which
	// only the model's answer would show).
	behind := model
	behind.Steps = []projections.Step{{ID: "ghost", Kind: "noop", Status: projections.OpPending, Attempt: 1}}
	store(behind)
	x := get()
	require.Equal(t, last, x.LastSeq, "the fold, not the model behind it")
	require.Len(t, x.Signals, 1)
	require.Empty(t, x.Steps)
	a := b.call(t, http.MethodGet, "/v1/executions/"+id+"/steps", b.admin, "", "")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	var page struct {
		Total int `json:"total"`
	}
	require.NoError(t, json.Unmarshal(a.body, &page))
	require.Zero(t, page.Total, "the steps of the fold, not of the model behind it")

	signal.Seq = last
	current, err := projections.Fold([]events.Event{started, signal})
	require.NoError(t, err)
	require.Equal(t, last, current.LastSeq)
	current.Error = "a mark the fold would not make"
	store(current)
	require.Equal(t, current.Error, get().Error, "a current model is answered as it is")

	// A command is refused as the history stands, not as a model behind
	// it says (a cancel the model has not seen end refused a resume).
	cancelling := behind
	cancelling.Status = projections.StatusCancelling
	store(cancelling)
	a = b.call(t, http.MethodPost, "/v1/executions/"+id+"/actions", b.admin, "", `{"action":"resume","reason":"test"}`)
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)

	large := behind
	large.Events = maxCurrentFold + 1
	store(large)
	require.Equal(t, first, get().LastSeq, "a large execution's model is answered as it is")

	behind.Truncated = &projections.Truncation{Values: 1}
	store(behind)
	x = get()
	require.Equal(t, first, x.LastSeq, "a model that leaves something out is answered as it is")
	require.NotNil(t, x.Truncated)
}
