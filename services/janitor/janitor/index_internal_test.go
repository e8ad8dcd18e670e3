package janitor

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
)

// TestWakeSaysWhatWaitingOnTimeSays: the index keeps wakeOf(x) instead
// of x; at any time, it must give the answer waitingOnTime(x, now)
// gives, for every kind of wait the sweep tells apart.
func TestWakeSaysWhatWaitingOnTimeSays(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 3, 14, 12, 0, 0, 0, time.UTC)
	base := func() projections.Execution {
		return projections.Execution{ID: "x", Workflow: "wf", Status: projections.StatusStarted, Steps: []projections.Step{
			{ID: "build", Kind: "exec", Status: projections.OpSucceeded, Attempt: 1},
			{ID: "nap", Kind: "sleep", Status: projections.OpWaiting, Attempt: 1},
		}}
	}
	timer := func(purpose string, step string, due time.Time, fired bool) projections.Timer {
		return projections.Timer{Purpose: purpose, StepID: step, Attempt: 1, Due: due, Fired: fired}
	}
	cases := map[string]func(*projections.Execution){
		"a signal, no timer": func(*projections.Execution) {},
		"a sleep": func(x *projections.Execution) {
			x.Timers = map[string]projections.Timer{"t1": timer(events.TimerSleep, "nap", t0, false)}
		},
		"two timers, the earlier rules": func(x *projections.Execution) {
			x.Timers = map[string]projections.Timer{"t1": timer(events.TimerSleep, "nap", t0.Add(time.Hour), false),
				"t2": timer(events.TimerStepTimeout, "nap", t0, false)}
		},
		"a timer fired, not acted on": func(x *projections.Execution) {
			x.Timers = map[string]projections.Timer{"t1": timer(events.TimerSleep, "nap", t0, true)}
		},
		"the workflow timed out": func(x *projections.Execution) {
			x.Timers = map[string]projections.Timer{"t1": timer(events.TimerSleep, "nap", t0.Add(time.Hour), false),
				"t2": timer(events.TimerWorkflowTimeout, "", t0, true)}
		},
		"nothing waits": func(x *projections.Execution) {
			x.Steps[1].Status = projections.OpSucceeded
			x.Timers = map[string]projections.Timer{"t1": timer(events.TimerSleep, "nap", t0, false)}
		},
		"a child to come": func(x *projections.Execution) {
			x.Steps = append(x.Steps, projections.Step{ID: "call", Kind: "workflow", Status: projections.OpPending, Child: "x-call"})
		},
		"a timer with no due time": func(x *projections.Execution) {
			x.Timers = map[string]projections.Timer{"t1": timer(events.TimerSleep, "nap", time.Time{}, false)}
		},
	}
	times := []time.Time{t0.Add(-time.Hour), t0, t0.Add(time.Minute - time.Nanosecond), t0.Add(time.Minute),
		t0.Add(time.Minute + time.Nanosecond), t0.Add(time.Hour + time.Minute), t0.Add(time.Hour + time.Minute + 1), t0.Add(24 * time.Hour)}
	for name, change := range cases {
		x := base()
		change(&x)
		wake := wakeOf(x)
		for _, now := range times {
			require.Equal(t, waitingOnTime(x, now), wake != 0 && nanos(now) <= wake, "%s, at %s (wake %d)", name, now, wake)
		}
	}
}

// TestPurgeMarkersKeepsAModelWrittenAgain: a marker is removed no
// further than its own revision, so a read model written under its key
// after the sweep read the marker stays.
func TestPurgeMarkersKeepsAModelWrittenAgain(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), "gone", []byte(`{}`))
	require.NoError(t, err)
	_, err = kv.Put(t.Context(), "back", []byte(`{}`))
	require.NoError(t, err)
	require.NoError(t, kv.Delete(t.Context(), "gone"))
	require.NoError(t, kv.Delete(t.Context(), "back"))

	var ix modelIndex
	require.NoError(t, ix.refresh(t.Context(), kv, time.Now()))
	var markers []marker
	for key, x := range ix.entries {
		require.Equal(t, kindMarker, x.kind, key)
		markers = append(markers, marker{key: key, rev: x.rev})
	}
	require.Len(t, markers, 2)
	rev, err := kv.Put(t.Context(), "back", []byte(`{"id":"back"}`))
	require.NoError(t, err)

	require.NoError(t, ix.purgeMarkers(t.Context(), js, markers))
	_, err = kv.Get(t.Context(), "gone")
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound)
	e, err := kv.Get(t.Context(), "back")
	require.NoError(t, err)
	require.Equal(t, rev, e.Revision())
	status, err := kv.Status(t.Context())
	require.NoError(t, err)
	require.EqualValues(t, 1, status.Values(), "gone's marker removed")
	require.NotContains(t, ix.entries, "gone")
}
