package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/tools/internal/devstack"
)

// connCount is what one named client connection of the embedded server
// sent to it (in) and received from it (out), its subscriptions
// included: a connection's messages are the server's in_msgs and
// out_msgs split by who they came from or went to.
type connCount struct{ in, out int64 }

// connMsgs sums the messages of the server's open connections by their
// name (several connections may share one).
func connMsgs(s *server.Server) map[string]connCount {
	if s == nil {
		return childConns() // -nats-process: the server process's
	}
	cz, err := s.Connz(&server.ConnzOptions{Limit: 4096})
	if err != nil {
		return nil
	}
	m := map[string]connCount{}
	for _, c := range cz.Conns {
		name := c.Name
		if name == "" {
			name = "(unnamed)"
		}
		// The client's in is what the server counts as its in_msgs from it.
		cc := m[name]
		cc.in += c.InMsgs
		cc.out += c.OutMsgs
		m[name] = cc
	}
	return m
}

// printConnMsgs prints, per connection name, the messages per step it
// sent the server and received from it between before and after; the
// server's internal clients (JetStream's own) are not connections and
// are left out.
func printConnMsgs(out io.Writer, before, after map[string]connCount, steps int) {
	if after == nil || steps <= 0 {
		return
	}
	names := make([]string, 0, len(after))
	for n := range after {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintf(out, "  messages per step by connection (sent to the server / received from it)\n")
	for _, n := range names {
		a, b := after[n], before[n]
		in, o := float64(a.in-b.in)/float64(steps), float64(a.out-b.out)/float64(steps)
		if in < 0.005 && o < 0.005 { // it would print 0.00 / 0.00
			continue
		}
		fmt.Fprintf(out, "    %-24s %5.2f / %5.2f\n", n, in, o)
	}
}

// projectorBehind is how many events of the events stream the api's
// projector has not yet projected and acknowledged (its consumer's
// pending and acknowledgement-pending messages), read from the embedded
// server's monitoring; ok is false when the server or the consumer is not
// known.
func projectorBehind(s *server.Server) (behind uint64, ok bool) {
	if s == nil {
		return 0, false
	}
	jsz, err := s.Jsz(&server.JSzOptions{Accounts: true, Streams: true, Consumer: true})
	if err != nil {
		return 0, false
	}
	for _, a := range jsz.AccountDetails {
		for _, st := range a.Streams {
			if st.Name != bus.StreamEvents {
				continue
			}
			for _, c := range st.Consumer {
				if c != nil && c.Name == bus.ConsumerProjector {
					return c.NumPending + uint64(c.NumAckPending), true
				}
			}
		}
	}
	return 0, false
}

// projectorLag is how projectorBehind is read for the stack of info: from
// its embedded server's monitoring, or through JetStream's API when the
// server runs in another process (-nats-process).
func projectorLag(ctx context.Context, info devstack.Info, conn *bus.Conn) func() (uint64, bool) {
	if info.Server != nil {
		return func() (uint64, bool) { return projectorBehind(info.Server) }
	}
	return func() (uint64, bool) { return projectorBehindJS(ctx, conn.JS) }
}

// waitProjected waits until the projector has projected every event of
// the run, polling every 20 ms, for at most limit; it returns when that
// was (the zero time if it could not tell or did not see it in time).
func waitProjected(ctx context.Context, lag func() (uint64, bool), limit time.Duration) time.Time {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		behind, ok := lag()
		if !ok {
			return time.Time{}
		}
		if behind == 0 {
			return time.Now()
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
	return time.Time{}
}
