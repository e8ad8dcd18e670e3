package chaos

import (
	"context"
	"fmt"
	"os"
	"time"

	"jetflow.dev/pkg/bus"
)

// Kinds of victims.
const (
	KindNATS = "nats"
	KindNode = "node"
)

// schedule returns the kinds of the run's kills, in the order they come.
func (r *run) schedule() []string {
	kinds := append([]string{KindNATS}, serviceNames...)
	if r.cfg.Mode == ModeCluster {
		kinds = []string{KindNode}
	}
	var out []string
	for range r.cfg.KillsPerKind {
		out = append(out, kinds...)
	}
	r.kills.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// killAll kills as the schedule says, the kills spread over the time the
// starts take (at least 1.5 s apart), each one landing while an
// operation runs.
func (r *run) killAll(ctx context.Context) ([]Kill, error) {
	victims := r.schedule()
	if len(victims) == 0 {
		return nil, nil
	}
	phase := time.Duration(float64(r.cfg.Executions) / r.cfg.Rate * float64(time.Second))
	every := max(phase/time.Duration(len(victims)+1), 1500*time.Millisecond)
	began := time.Now()
	var kills []Kill
	for i, kind := range victims {
		if d := time.Until(began.Add(time.Duration(i+1) * every)); d > 0 {
			select {
			case <-ctx.Done():
				return kills, ctx.Err()
			case <-time.After(d):
			}
		}
		busy := r.waitBusy(10 * time.Second)
		k, err := r.kill(ctx, kind, i)
		k.Busy = busy
		if err != nil {
			return kills, err
		}
		fmt.Fprintf(r.cfg.Progress, "chaos: kill %d/%d: %s %s (down %s)\n", i+1, len(victims), kind, k.Victim,
			k.Back.Sub(k.At).Round(time.Millisecond))
		kills = append(kills, k)
	}
	return kills, nil
}

// waitBusy waits (at most within) until an operation begins to run: its
// run mark makes the marks file grow, and it takes 100 ms or more, so a
// kill right after lands while it runs. It reports whether one did.
func (r *run) waitBusy(within time.Duration) bool {
	size := func() int64 {
		st, err := os.Stat(r.marks)
		if err != nil {
			return 0
		}
		return st.Size()
	}
	was := size()
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if size() != was {
			return true
		}
	}
	return false
}

// kill SIGKILLs one victim of kind, waits a random downtime, starts it
// again and waits until it serves (a cluster node: until every replica
// of the events stream is current again, so that the next kill takes
// down one node only).
func (r *run) kill(ctx context.Context, kind string, i int) (Kill, error) {
	k := Kill{Kind: kind}
	var p *Process
	switch kind {
	case KindNATS:
		p, k.Victim = r.nodes[0].Process, r.nodes[0].name
	case KindNode:
		// Every other kill takes the events stream's leader, the others
		// another node.
		leader := r.leaderOf(ctx, bus.StreamEvents)
		var pick []*natsNode
		for _, node := range r.nodes {
			if (node.name == leader) == (i%2 == 0) {
				pick = append(pick, node)
			}
		}
		if len(pick) == 0 { // no leader known
			pick = r.nodes
		}
		n := pick[r.kills.IntN(len(pick))]
		p, k.Victim, k.Leader = n.Process, n.name, n.name == leader
	default:
		p, k.Victim = r.services[kind], kind
	}
	k.At = time.Now()
	if err := p.Kill(); err != nil {
		return k, err
	}
	time.Sleep(time.Duration(100+r.kills.IntN(int(r.cfg.MaxDowntime/time.Millisecond)-99)) * time.Millisecond)
	k.Back = time.Now()
	switch kind {
	case KindNATS, KindNode:
		if err := p.Start(); err != nil {
			return k, err
		}
		if err := waitJetStream(ctx, r.js, r.replicas, 2*time.Minute); err != nil {
			return k, fmt.Errorf("chaos: after the kill of %s: %w", k.Victim, err)
		}
	default:
		if err := r.startService(p); err != nil {
			return k, err
		}
	}
	return k, nil
}
