package projector

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
)

// TestAFailedProjectionCachesNoTornState: a projection applies its
// group's events to the cached state in place, so one that fails after an
// event applied (here: the next event does not apply, and the history
// cannot be read to fold it again) has changed that state half-way. What
// the cache holds must always be the history's fold at its last sequence,
// and the next projection must write the fold.
func TestAFailedProjectionCachesNoTornState(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	p, err := New(ctx, js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	const id = "torn"
	subject := bus.ExecutionSubject("wf", id)
	var last uint64
	add := func(ps ...events.Payload) {
		t.Helper()
		for _, pl := range ps {
			ev := events.New("test", id, "wf", time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC), pl)
			ev.PrevSeq = last
			last, err = history.Append(ctx, js, subject, last, ev)
			require.NoError(t, err)
		}
	}
	read := func() []events.Event {
		t.Helper()
		evs, err := p.hist.Read(ctx, subject, 0)
		require.NoError(t, err)
		return evs
	}
	group := func(evs []events.Event) *group { return &group{subject: subject, workflow: "wf", id: id, evs: evs} }
	// requireFold: x is the fold of evs.
	requireFold := func(evs []events.Event, x projections.Execution, msg string) {
		t.Helper()
		want, err := json.Marshal(projections.FoldQuarantined(id, evs))
		require.NoError(t, err)
		got, err := json.Marshal(x)
		require.NoError(t, err)
		require.JSONEq(t, string(want), string(got), msg)
	}
	// requireCachedFold: the cached state, if any, is the fold of the
	// history up to its last sequence.
	requireCachedFold := func(msg string) {
		t.Helper()
		p.cacheMu.Lock()
		e, ok := p.cache[id]
		p.cacheMu.Unlock()
		if !ok {
			return
		}
		var upTo []events.Event
		for _, ev := range read() {
			if ev.Seq <= e.state.LastSeq {
				upTo = append(upTo, ev)
			}
		}
		requireFold(upTo, e.state, msg)
	}

	steps := []events.StepRef{{ID: "s1", Kind: "noop"}, {ID: "s2", Kind: "noop"}}
	add(&events.ExecutionStarted{Workflow: "wf", Version: 1, Steps: steps, Token: "t"}, &events.StepScheduled{StepID: "s1", Attempt: 1})
	require.NoError(t, p.project(ctx, group(read())))
	p.cacheMu.Lock()
	_, cached := p.cache[id]
	p.cacheMu.Unlock()
	require.True(t, cached, "the state is cached after its model is written")

	// A sending that applies, then a success of a step never scheduled,
	// which does not: the projection folds the history again, and cannot.
	add(&events.StepSending{StepID: "s1", Attempt: 1, TaskID: id + ".s1.1", Queue: "default"},
		&events.StepSucceeded{StepID: "s2", Attempt: 1, Agent: "ag"})
	evs := read()
	require.Len(t, evs, 4)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	require.Error(t, p.project(gone, group(evs[2:])), "the history cannot be read with a context gone")
	requireCachedFold("after a projection that failed")

	require.NoError(t, p.project(ctx, group(evs[2:])))
	requireCachedFold("after the projection that followed")
	x, err := p.read(ctx, id)
	require.NoError(t, err)
	requireFold(evs, x.state, "the model written is the history's fold")
	require.NotNil(t, x.state.Damaged)
	require.Equal(t, evs[3].Seq, x.state.Damaged.Seq)
}
