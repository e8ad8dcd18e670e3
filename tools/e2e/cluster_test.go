package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natsserver"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/tools/internal/devstack"
)

// startClusterStack runs the four services against a 3-node JetStream
// cluster, with R3 streams and buckets (skipped with -short; the test is
// parallel).
func startClusterStack(t *testing.T) ([]*server.Server, *stack) {
	t.Helper()
	if testing.Short() {
		t.Skip("cluster test")
	}
	t.Parallel()
	servers := natstest.RunCluster(t)
	urls := make([]string, len(servers))
	for i, srv := range servers {
		urls[i] = srv.ClientURL()
	}
	s := startStack(t, func(c *devstack.Config) {
		c.NATSURL, c.Replicas = strings.Join(urls, ","), 3
	})
	return servers, s
}

// startMany starts n executions of workflow wf, ids prefix0 to
// prefix<n-1>, and returns their ids.
func (s *stack) startMany(t *testing.T, wf, prefix string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s%d", prefix, i)
		_, err := s.c.Start(context.Background(), client.StartRequest{Workflow: wf, ID: ids[i]})
		require.NoError(t, err)
	}
	return ids
}

// TestClusterSurvivesStreamLeaderLoss runs the four services against a
// 3-node JetStream cluster with R3 streams and buckets, and shuts down the
// events stream's leader while executions are running.
func TestClusterSurvivesStreamLeaderLoss(t *testing.T) {
	servers, s := startClusterStack(t)
	ctx := context.Background()
	info, err := s.js.Stream(ctx, bus.StreamEvents)
	require.NoError(t, err)
	require.Equal(t, 3, info.CachedInfo().Config.Replicas)

	// s2 is held running until the leader is down, so that the loss
	// comes while every execution is under way.
	held := newGate(t)
	s.apply(t, `
name: replicated
steps:
  - id: s1
    kind: noop
  - id: s2
    kind: exec
    command: sh
    args: ["-c", "`+held.then("true")+`"]
  - id: s3
    kind: noop
  - id: s4
    kind: exec
    command: sh
    args: ["-c", "sleep 0.5"]
  - id: s5
    kind: noop
`)
	ids := s.startMany(t, "replicated", "r3-", 6)
	// Stop the leader once the executions are under way: each runs s2,
	// which waits for the gate.
	for _, id := range ids {
		require.Eventually(t, func() bool {
			x, err := s.c.Execution(ctx, id)
			st, ok := findStep(x, "s2")
			return err == nil && ok && st.Status == projections.OpStarted
		}, 60*time.Second, 10*time.Millisecond, "%s runs s2", id)
	}

	si, err := info.Info(ctx)
	require.NoError(t, err)
	leader := si.Cluster.Leader
	for _, srv := range servers {
		if srv.Name() == leader {
			natsserver.Stop(srv)
		}
	}
	t.Logf("stopped events stream leader %s", leader)
	held.open()

	for _, id := range ids {
		x := s.waitDone(t, id, 60*time.Second)
		require.Equal(t, projections.StatusSucceeded, x.Status, "%s: %s", id, x.Error)
		evs := s.history(t, id)
		requireLinear(t, evs)
		counts := countTypes(evs)
		for _, step := range []string{"s1", "s2", "s3", "s4", "s5"} {
			require.Equal(t, 1, counts[string(events.TypeStepSucceeded)+"/"+step], "%s step %s", id, step)
		}
	}
	si, err = info.Info(ctx)
	require.NoError(t, err)
	require.NotEqual(t, leader, si.Cluster.Leader)
}

// TestClusterAgentsFollowTheirConsumersLeader moves the leader of the
// agents' consumer of the default queue, on a 3-node cluster, while
// every agent worker waits on it with a pull: the pulls end (leadership
// change, or no heartbeats), the workers pull again from the new leader
// (after a short pause, docs/reliability.md), and executions started
// then run to their end.
func TestClusterAgentsFollowTheirConsumersLeader(t *testing.T) {
	_, s := startClusterStack(t)
	ctx := context.Background()
	s.apply(t, `
name: moved
steps:
  - id: s1
    kind: noop
  - id: s2
    kind: noop
`)
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "moved", ID: "before"})
	require.NoError(t, err)
	x := s.waitDone(t, "before", 60*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)

	cons, err := s.js.Consumer(ctx, bus.StreamTasks, bus.AgentConsumer("default"))
	require.NoError(t, err)
	ci, err := cons.Info(ctx)
	require.NoError(t, err)
	require.NotNil(t, ci.Cluster)
	was := ci.Cluster.Leader
	moved := time.Now()
	resp, err := s.nc.Request(fmt.Sprintf("$JS.API.CONSUMER.LEADER.STEPDOWN.%s.%s", bus.StreamTasks, bus.AgentConsumer("default")), nil, 10*time.Second)
	require.NoError(t, err)
	require.Contains(t, string(resp.Data), `"success":true`, "step down: %s", resp.Data)

	// Started at once, while the consumer elects its new leader.
	ids := s.startMany(t, "moved", "after-", 8)
	for _, id := range ids {
		x := s.waitDone(t, id, 60*time.Second)
		require.Equal(t, projections.StatusSucceeded, x.Status, "%s: %s", id, x.Error)
		counts := countTypes(s.history(t, id))
		for _, step := range []string{"s1", "s2"} {
			require.Equal(t, 1, counts[string(events.TypeStepSucceeded)+"/"+step], "%s step %s", id, step)
		}
	}
	done := time.Since(moved)
	require.Eventually(t, func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.Cluster != nil && ci.Cluster.Leader != "" && ci.Cluster.Leader != was
	}, 60*time.Second, 50*time.Millisecond, "a new leader of the consumer")
	t.Logf("consumer leader %s stepped down; 8 executions started at once were done %s after", was, done.Round(time.Millisecond))
}
