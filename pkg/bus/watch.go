package bus

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// stopDrainQuiet is how long StopWatch's reader waits for anything more
// on a stopped watcher's channel before it gives up on its close.
const stopDrainQuiet = 5 * time.Second

// StopWatch stops a KV watcher and lets it end without waiting for it.
//
// The watcher's handler blocks once its updates channel is full, so what
// is still queued must be read for it to finish: a goroutine reads the
// channel until it is closed, or until nothing came for a few seconds
// (once stopped, only the message the handler was blocked on, and the
// initial values' marker, can still come). It is not read here: nats.go
// closes the channel from the subscription's closed handler, which it
// never calls when the subscription closed (its context ended) before
// the watcher had set that handler, and a caller ranging over the channel
// would then wait forever, as a stopping service did.
func StopWatch(w jetstream.KeyWatcher) {
	_ = w.Stop()
	go func() {
		quiet := time.NewTimer(stopDrainQuiet)
		defer quiet.Stop()
		for {
			select {
			case _, ok := <-w.Updates():
				if !ok {
					return
				}
				quiet.Reset(stopDrainQuiet)
			case <-quiet.C:
				return
			}
		}
	}()
}

// EachEntry calls fn with every current entry of kv (as opts select
// them), read in one pass of a watcher (one ordered consumer, not a
// request per key), and stops at the first error fn returns, which it
// returns. Entries written meanwhile may be seen too.
func EachEntry(ctx context.Context, kv jetstream.KeyValue, fn func(jetstream.KeyValueEntry) error, opts ...jetstream.WatchOpt) error {
	w, err := kv.WatchAll(ctx, opts...)
	if err != nil {
		return err
	}
	defer StopWatch(w)
	for {
		select {
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				if ctx.Err() != nil {
					return ctx.Err() // stopping: the watch ended with it
				}
				return errors.New("watcher closed")
			case e == nil: // every current entry seen
				return nil
			}
			if err := fn(e); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
