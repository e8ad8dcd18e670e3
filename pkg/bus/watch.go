package bus

import "github.com/nats-io/nats.go/jetstream"

// StopWatch stops a KV watcher and lets it end without waiting for it.
//
// The watcher's handler blocks once its updates channel is full, so what
// is still queued must be read for it to finish: a goroutine reads the
// channel until it is closed. It is not read here: nats.go closes the
// channel from the subscription's closed handler, which it never calls
// when the subscription closed (its context ended) before the watcher had
// set that handler, and a caller ranging over the channel would then wait
// forever, as a stopping service did.
func StopWatch(w jetstream.KeyWatcher) {
	_ = w.Stop()
	go func() {
		for range w.Updates() {
		}
	}()
}
