package projector_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/services/api/projector"
)

// TestBacklogIsTheOldestEventNotProjected: with no projector running, the
// backlog counts the events appended and dates from the first one's
// storing; once a projector has projected them, it is empty.
func TestBacklogIsTheOldestEventNotProjected(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	_, err := projector.ReadBacklog(t.Context(), js)
	require.ErrorIs(t, err, jetstream.ErrConsumerNotFound, "no consumer yet")
	_, err = bus.Bind(t.Context(), js, true, bus.ProjectorConsumerSpec(), nil)
	require.NoError(t, err)
	b, err := projector.ReadBacklog(t.Context(), js)
	require.NoError(t, err)
	require.Equal(t, projector.Backlog{}, b, "nothing appended: caught up")

	before := time.Now()
	appendHistory(t, js, "wf", "lagging", &events.ExecutionStarted{Workflow: "wf", Version: 1, Input: json.RawMessage(`{}`),
		Steps: []events.StepRef{{ID: "s1", Kind: "noop"}}, Token: "t"}, &events.StepScheduled{StepID: "s1", Attempt: 1})
	after := time.Now()
	// The consumer's count of pending messages follows the appends'
	// acknowledgements a little later: asked at once, it may say 1.
	natstest.Eventually(t, 10*time.Second, func() bool {
		b, err = projector.ReadBacklog(t.Context(), js)
		return err == nil && b.Pending+b.Unacked == 2
	}, "both events wait (last read: %+v)", &b)
	require.False(t, b.Oldest.Before(before.Add(-time.Second)), "the first event's storing: %v, appended from %v", b.Oldest, before)
	require.False(t, b.Oldest.After(after.Add(time.Second)), "the first event's storing: %v, appended until %v", b.Oldest, after)
	require.Equal(t, after.Add(time.Hour).Sub(b.Oldest), b.Lag(after.Add(time.Hour)))

	p, err := projector.New(t.Context(), js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	require.False(t, p.Bound(), "not running")
	natstest.Serve(t, p.Run)
	natstest.Eventually(t, 30*time.Second, func() bool {
		b, err := projector.ReadBacklog(t.Context(), js)
		return err == nil && b == projector.Backlog{} && p.Bound()
	}, "the projector binds and projects the backlog")
	require.Zero(t, projector.Backlog{}.Lag(time.Now()))
}
