package bus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Missing returns the streams and buckets of the topology that do not
// exist, as "stream NAME" and "bucket NAME", sorted. It looks only at the
// streams mayLook allows (a bucket is its stream KV_<bucket>; nil: all):
// an identity without the right to look a stream up would wait for an
// answer that never comes. A stream that is there is not changed.
func Missing(ctx context.Context, js jetstream.JetStream, c Config, mayLook func(stream string) bool) ([]string, error) {
	var out []string
	for _, sc := range Streams(c) {
		if mayLook != nil && !mayLook(sc.Name) {
			continue
		}
		_, err := js.Stream(ctx, sc.Name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			out = append(out, "stream "+sc.Name)
		case err != nil:
			return out, fmt.Errorf("look up stream %s: %w", sc.Name, err)
		}
	}
	for _, kc := range Buckets(c) {
		if mayLook != nil && !mayLook(BucketStream(kc.Bucket)) {
			continue
		}
		_, err := js.KeyValue(ctx, kc.Bucket)
		switch {
		case errors.Is(err, jetstream.ErrBucketNotFound):
			out = append(out, "bucket "+kc.Bucket)
		case err != nil:
			return out, fmt.Errorf("look up bucket %s: %w", kc.Bucket, err)
		}
	}
	slices.Sort(out)
	return out, nil
}

// Topology watches the streams and buckets a service uses: which are
// missing (deleted by hand, or lost). The absence is reported once, not
// retried silently, and the api's /readyz shows it. It creates nothing:
// jetflow bootstrap does, with the deployment's settings.
type Topology struct {
	mu      sync.Mutex
	missing []string
	cancel  context.CancelFunc
	done    chan struct{}
	again   chan struct{} // LookAgain
}

// LookAgain asks the watch to look at once (after the caller made what was
// missing), not at the next period.
func (t *Topology) LookAgain() {
	if t == nil {
		return
	}
	select {
	case t.again <- struct{}{}:
	default: // a look is asked already
	}
}

// TopologyEvents are told what a Topology watch finds.
type TopologyEvents struct {
	// Missing: name ("stream X", "bucket Y") was found missing.
	Missing func(name string)
	// Back: name is there again.
	Back func(name string)
	// Failed: looking failed (NATS away: reported elsewhere).
	Failed func(err error)
	// Looked: a look found these missing (none: nil), after Missing and
	// Back were told; called after every look that did not fail.
	Looked func(missing []string)
}

// WatchTopology looks every period for the streams and buckets of c that
// mayLook allows (nil: all). Stop ends it.
func WatchTopology(ctx context.Context, js jetstream.JetStream, c Config, mayLook func(string) bool,
	period time.Duration, ev TopologyEvents) *Topology {
	ctx, cancel := context.WithCancel(ctx)
	t := &Topology{cancel: cancel, done: make(chan struct{}), again: make(chan struct{}, 1)}
	go func() {
		defer close(t.done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			case <-t.again:
			}
			t.look(ctx, js, c, mayLook, ev)
		}
	}()
	return t
}

// Missing returns the streams and buckets found missing at the last look.
func (t *Topology) Missing() []string {
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.missing)
}

// Stop ends the watch and waits for it.
func (t *Topology) Stop() {
	if t == nil || t.cancel == nil {
		return
	}
	t.cancel()
	<-t.done
}

func (t *Topology) look(ctx context.Context, js jetstream.JetStream, c Config, mayLook func(string) bool, ev TopologyEvents) {
	lookCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	missing, err := Missing(lookCtx, js, c, mayLook)
	if err != nil {
		if ctx.Err() == nil && ev.Failed != nil {
			ev.Failed(err)
		}
		return // cannot tell now
	}
	t.mu.Lock()
	was := t.missing
	t.missing = missing
	t.mu.Unlock()
	for _, m := range missing {
		if !slices.Contains(was, m) && ev.Missing != nil {
			ev.Missing(m)
		}
	}
	for _, m := range was {
		if !slices.Contains(missing, m) && ev.Back != nil {
			ev.Back(m)
		}
	}
	if ev.Looked != nil {
		ev.Looked(slices.Clone(missing))
	}
}
