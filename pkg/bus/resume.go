package bus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Consuming is the Consume of a long-lived durable consumer that is
// started again when it ends on its own. nats.go ends a Consume whose
// consumer was deleted (by hand, or with its stream, which a topology
// check may make again): left alone, the service would wait for ever for
// messages that cannot come, and still look healthy.
type Consuming struct {
	mu      sync.Mutex
	cc      jetstream.ConsumeContext
	stopped bool
	// draining: stopped by Drain, whose promise (every message delivered
	// is handled) holds for a Consume the watch started meanwhile too.
	draining bool
	cancel   context.CancelFunc // ends the watch, and a start under way
	done     chan struct{}
}

// ResumeAfter is how long a Consuming waits before it starts its
// Consume again, and between attempts that fail.
var ResumeAfter = time.Second

// Resume watches cc, a Consume just started, until ctx ends or Stop or
// Drain is called: when cc ends on its own, it calls lost(nil), waits
// ResumeAfter and calls start (which binds the consumer, making it again
// where the service may, and consumes it), calling lost(err) and trying
// again every ResumeAfter while start fails, and then watches the new
// Consume.
func Resume(ctx context.Context, cc jetstream.ConsumeContext, start func(context.Context) (jetstream.ConsumeContext, error), lost func(error)) *Consuming {
	ctx, cancel := context.WithCancel(ctx)
	c := &Consuming{cc: cc, cancel: cancel, done: make(chan struct{})}
	go c.watch(ctx, start, lost)
	return c
}

func (c *Consuming) watch(ctx context.Context, start func(context.Context) (jetstream.ConsumeContext, error), lost func(error)) {
	defer close(c.done)
	for {
		c.mu.Lock()
		cc := c.cc
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-cc.Closed():
		}
		if c.isStopped() {
			return
		}
		lost(nil)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(ResumeAfter):
			}
			next, err := start(ctx)
			if err == nil {
				c.mu.Lock()
				if c.stopped { // stopped while it started
					if c.draining { // drained too, and waited for (drain)
						c.cc = next
						c.mu.Unlock()
						next.Drain()
						return
					}
					c.mu.Unlock()
					next.Stop()
					return
				}
				c.cc = next
				c.mu.Unlock()
				break
			}
			if ctx.Err() != nil {
				return
			}
			lost(err)
		}
	}
}

func (c *Consuming) isStopped() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopped
}

// end marks c stopped (draining, or not) and returns its current
// Consume, or nil if it was stopped already.
func (c *Consuming) end(draining bool) jetstream.ConsumeContext {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil
	}
	c.stopped, c.draining = true, draining
	c.cancel()
	return c.cc
}

// Stop stops the Consume at once (messages in hand are not waited for)
// and ends the watch.
func (c *Consuming) Stop() {
	if cc := c.end(false); cc != nil {
		cc.Stop()
	}
	<-c.done
}

// Drain drains the Consume (the messages delivered are handled first),
// waits until it is closed, and ends the watch.
func (c *Consuming) Drain() {
	if cc := c.drain(); cc != nil {
		<-cc.Closed()
	}
}

// drain asks the Consume to drain, ends the watch, and returns the
// Consume to wait for (nil if it was stopped already): the one the watch
// started while c was being drained, if it did, drained too.
func (c *Consuming) drain() jetstream.ConsumeContext {
	cc := c.end(true)
	if cc != nil {
		cc.Drain()
	}
	<-c.done
	if cc == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cc
}

// DrainWithin is Drain waiting at most d for the Consume to close; it
// reports whether it closed. Unlike Stop, every message that reached the
// client reaches the handler, those in the pull's buffer when it was
// called included: Stop drops them, and they wait for their consumer's
// ack wait. (nats.go drains by unsubscribing: what the server still
// sends after that is dropped, and waits for the ack wait unless the
// consumer is reset.) A drain not done by then (its handler is
// slow) goes on by itself until the handler has taken every message or
// the connection closes; the watch has ended either way.
func (c *Consuming) DrainWithin(d time.Duration) bool {
	cc := c.drain()
	if cc == nil {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-cc.Closed():
		return true
	case <-t.C:
		return false
	}
}

// Starter returns the start a Resume calls: it binds spec (making it
// where manage, calling wait while it waits for it, as Bind does) and
// consumes it with handler and opts. Called once by the service itself,
// it is also the first start.
func Starter(js jetstream.JetStream, manage bool, spec Consumer, wait func(error), handler jetstream.MessageHandler,
	opts ...jetstream.PullConsumeOpt) func(context.Context) (jetstream.ConsumeContext, error) {
	return func(ctx context.Context) (jetstream.ConsumeContext, error) {
		cons, err := Bind(ctx, js, manage, spec, wait)
		if err != nil {
			return nil, err
		}
		cc, err := cons.Consume(handler, opts...)
		if err != nil {
			return nil, fmt.Errorf("consume %s: %w", spec.Config.Durable, err)
		}
		return cc, nil
	}
}

// StopIfGone is a Consume option for a Consume that Resume watches: on
// each error the Consume reports (missed heartbeats, a pull refused),
// after log (if set) sees it, it asks whether the consumer still exists
// and stops the Consume if it does not, so that Resume starts it again.
// nats.go ends a Consume by itself when the server says its consumer was
// deleted, but not when the consumer was already gone as it pulled (it
// was deleted between two pulls, or before the first): it keeps pulling
// from nothing.
func StopIfGone(js jetstream.JetStream, c Consumer, log func(error)) jetstream.PullConsumeOpt {
	var checking atomic.Bool
	return jetstream.ConsumeErrHandler(func(cc jetstream.ConsumeContext, err error) {
		if log != nil {
			log(err)
		}
		if errors.Is(err, jetstream.ErrConsumerDeleted) || !checking.CompareAndSwap(false, true) {
			return // ended by nats.go, or asked already
		}
		go func() {
			defer checking.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), ServiceRequestTimeout)
			defer cancel()
			if _, err := js.Consumer(ctx, c.Stream, c.Config.Durable); errors.Is(err, jetstream.ErrConsumerNotFound) {
				cc.Stop()
			}
		}()
	})
}
