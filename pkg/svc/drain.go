package svc

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// DrainTimeout is how long a service waits for a connection's drain at
// shutdown before it closes the connection anyway.
const DrainTimeout = 10 * time.Second

// Drain drains nc and returns once it is closed: every subscription's
// handlers have finished the messages they hold and what nc published
// (acknowledgements among it) has been flushed to the server.
// [nats.Conn.Drain] alone only starts that and returns at once, so a
// program that exits after it can lose both.
//
// If nc is not closed within timeout, Drain closes it and returns an
// error saying so. A connection that is already closed returns nil. Any
// closed handler nc had still runs.
func Drain(nc *nats.Conn, timeout time.Duration) error {
	closed := make(chan struct{})
	var once sync.Once
	prev := nc.ClosedHandler()
	nc.SetClosedHandler(func(c *nats.Conn) {
		if prev != nil {
			prev(c)
		}
		once.Do(func() { close(closed) })
	})
	if nc.IsClosed() { // closed before the handler was set
		return nil
	}
	// ErrConnectionReconnecting: not connected, Drain closed it (what it
	// held cannot be flushed). ErrConnectionClosed: closed meanwhile.
	if err := nc.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionReconnecting) && !errors.Is(err, nats.ErrConnectionClosed) {
		nc.Close()
		return fmt.Errorf("drain nats connection: %w", err)
	}
	// The closed handler says when; the poll covers a connection made
	// with nats.NoCallbacksAfterClientClose, whose handler the drain's
	// final Close does not call.
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-closed:
			return nil
		case <-poll.C:
			if nc.IsClosed() {
				return nil
			}
		case <-deadline.C:
			if nc.IsClosed() {
				return nil
			}
			nc.Close()
			return fmt.Errorf("drain nats connection: not done after %s (a handler still running?); closed it", format(timeout))
		}
	}
}
