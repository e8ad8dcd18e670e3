package dispatch

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The dispatcher's one retry policy. Whatever fails for a reason that may
// pass (a stream or bucket not answering, a partition between holders, a
// start not yet visible, a rejection that could not be published) is tried
// again after retryDelay(n), n counting the tries so far: 100 ms, doubling,
// at most 10 s. A message is retried by JetStream (a delayed Nak, n being
// its deliveries); a loop of this process waits with retryWait.
//
// A message for a partition between two holders has not failed: it comes
// back after handOver, whatever its deliveries (partitions may move many
// times on a busy machine, and a growing delay would stall executions
// for nothing).
//
// A failure that may pass (bus.Transient) is first tried again in
// process, for up to retryHereFor: a leader election of the cluster takes
// 4 to 9 s, and a Nak sent to a consumer whose leader is being elected is
// lost (the message then waits for its ack wait).
// handlingMax is how long a holding given up waits for the messages it
// has in hand: the longest one handling may take (an append tried for
// 10.5 s through an election, in-process retries for retryHereFor), not
// the ack wait, which heartbeats extend. Stopped sooner, the next holder
// would handle the same message while this one still appends.
const handlingMax = 30 * time.Second

const (
	retryHereFor = 15 * time.Second
	retryFirst   = 100 * time.Millisecond
	retryMax     = 10 * time.Second
	handOver     = 500 * time.Millisecond
)

// retryDelay is how long to wait before the try after the nth (n ≥ 1).
func retryDelay(n int) time.Duration {
	d := retryFirst
	for i := 1; i < n && d < retryMax; i++ {
		d *= 2
	}
	return min(d, retryMax)
}

// retryLater hands m back to JetStream, to be delivered again after the
// policy's delay for its deliveries so far.
func retryLater(m jetstream.Msg) time.Duration {
	n := 1
	if md, err := m.Metadata(); err == nil && md != nil {
		n = int(md.NumDelivered)
	}
	delay := retryDelay(n)
	_ = m.NakWithDelay(delay)
	return delay
}

// retryWait waits the policy's delay after the nth try, or until ctx ends
// (reported false).
func retryWait(ctx context.Context, n int) bool {
	t := time.NewTimer(retryDelay(n))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
