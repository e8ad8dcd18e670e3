package dispatch

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/natstest"
)

// A run cut short whose nudge fails (here the connection is gone) leaves
// its partition's next release not handed over, whether the release
// finds the run or the run ended before it: the table then purges the
// lease instead of deleting it, and the next holder looks for the step
// (a clean stop's runs end with Run's context, often before the release).
func TestAFailedNudgeLeavesTheReleaseNotHandedOver(t *testing.T) {
	t.Parallel()
	s := natstest.RunJetStream(t)
	natstest.Connect(t, s) // the topology
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	d, err := New(t.Context(), Config{Workers: 1}, js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.ErrorLevel))
	require.NoError(t, err)
	nc.Close()

	run := &localRun{exec: "x1", workflow: "wf"}
	require.False(t, d.nudgeOnce(run, "x1", "wf"))
	require.False(t, d.nudgeOnce(run, "x1", "wf"), "asked once: the second call has the first's answer")
	p := d.partitionOf("x1")
	require.False(t, d.release(p, 1), "the release after a failed nudge")
	require.True(t, d.release(p, 1), "the failure counts for one release")
	require.True(t, d.release((p+1)%d.parts.n, 1), "another partition's release")
}
