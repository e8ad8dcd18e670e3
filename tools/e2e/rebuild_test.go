package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
)

// readModels returns every stored read model as JSON, by execution id.
func readModels(t *testing.T, kv jetstream.KeyValue) map[string]string {
	t.Helper()
	ctx := context.Background()
	out := map[string]string{}
	lister, err := kv.ListKeys(ctx)
	require.NoError(t, err)
	for k := range lister.Keys() {
		e, err := kv.Get(ctx, k)
		require.NoError(t, err)
		out[k] = string(e.Value())
	}
	return out
}

// TestRebuiltReadModelsEqualLiveOnes re-projects the events stream beside
// the live system, from sequence 0 into an emptied bucket and from a
// middle sequence onto the stored models, and compares with what the live
// projector wrote.
func TestRebuiltReadModelsEqualLiveOnes(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, "name: mixed\nsearch_attributes: [input.i, vars.half]\nsteps:\n  - id: h\n    kind: let\n    vars: {half: \"${input.i / 2}\"}\n"+
		"  - id: a\n    kind: noop\n  - id: b\n    kind: exec\n    command: sh\n    args: [\"-c\", \"test $JETFLOW_EXECUTION_ID != mixed-4\"]\n  - id: c\n    kind: log\n    message: done\n")
	s.apply(t, "name: short\nsteps:\n  - id: only\n    kind: noop\n")
	var ids []string
	for i := range 12 {
		wf := []string{"mixed", "short"}[i%2]
		id := fmt.Sprintf("%s-%d", wf, i)
		_, err := s.c.Start(ctx, client.StartRequest{Workflow: wf, ID: id, Input: map[string]any{"i": i}})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	for _, id := range ids {
		s.waitDone(t, id, 20*time.Second)
	}
	kv, err := s.js.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
	// Wait until the live projector has folded every event.
	stream, err := s.js.Stream(ctx, bus.StreamEvents)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		cons, err := stream.Consumer(ctx, "projector")
		if err != nil {
			return false
		}
		info, err := cons.Info(ctx)
		if err != nil {
			return false
		}
		caught, _, err := natstest.CaughtUp(ctx, s.js, info)
		return err == nil && caught
	}, 30*time.Second, 20*time.Millisecond)
	live := readModels(t, kv)
	require.Len(t, live, len(ids))
	liveLists := visibleLists(t, s)
	failed := 0
	for _, v := range live {
		var x projections.Execution
		require.NoError(t, json.Unmarshal([]byte(v), &x))
		if x.Status == projections.StatusFailed {
			failed++
		}
	}
	require.Equal(t, 1, failed, "mixed-4 fails, the others succeed")

	// From a middle sequence onto the stored models: nothing changes.
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	res, err := s.c.RebuildProjections(ctx, info.State.LastSeq/2)
	require.NoError(t, err)
	require.Zero(t, res.Written, "live models are already as new")
	require.Equal(t, live, readModels(t, kv))

	// From sequence 0 into an empty bucket: the same models again.
	for id := range live {
		require.NoError(t, kv.Purge(ctx, id))
	}
	require.Empty(t, readModels(t, kv))
	res, err = s.c.RebuildProjections(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, len(ids), res.Written)
	rebuilt := readModels(t, kv)
	require.Equal(t, len(live), len(rebuilt))
	for id, want := range live {
		require.JSONEq(t, want, rebuilt[id], id)
	}
	// The rebuild from 0 dropped the api's visibility index and fed it
	// again from the rebuilt read models: it lists the same.
	require.Equal(t, liveLists, visibleLists(t, s))
}

// visibleLists lists every execution from the visibility index in
// several orders, filters and search attributes (each list as the api
// answers it, one page of up to 1,000). An order other than id is
// answered by the index only: the client retries the api's 503 until it
// is live.
func visibleLists(t *testing.T, s *stack) map[string][]client.ExecutionSummary {
	t.Helper()
	out := map[string][]client.ExecutionSummary{}
	for name, o := range map[string]client.ListOptions{
		"by start":         {Sort: "started_asc"},
		"by end":           {Sort: "ended_desc"},
		"mixed, succeeded": {Sort: "started_desc", Workflow: "mixed", Status: "succeeded"},
		"input i 4":        {Sort: "started_asc", Attrs: []string{"i:4"}},
		"variable half 3":  {Sort: "started_asc", Attrs: []string{"half:3"}},
		"by id":            {Sort: "id"},
	} {
		o.Limit = 1000
		list, next, err := s.c.ListExecutions(context.Background(), o)
		require.NoError(t, err, name)
		require.Empty(t, next, name)
		out[name] = list
	}
	require.Equal(t, []string{"mixed-4"}, listIDs(out["input i 4"]), "listed by its input")
	require.Equal(t, []string{"mixed-6"}, listIDs(out["variable half 3"]), "listed by its variable")
	require.Len(t, out["by start"], 12)
	return out
}
