package bus

import (
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
