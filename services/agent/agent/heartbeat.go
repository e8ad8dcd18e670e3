package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"jetflow.dev/pkg/operation"
)

// ErrNoHeartbeat is the error of an operation terminated because it did
// not heartbeat within its step's heartbeat: it is reported lost.
var ErrNoHeartbeat = errors.New("terminated: no heartbeat")

// heartbeatOf returns the heartbeat a step's spec asks for (0: none). A
// spec that does not name one is not decoded.
func heartbeatOf(spec json.RawMessage) time.Duration {
	if !bytes.Contains(spec, []byte(`"heartbeat"`)) {
		return 0
	}
	s, err := stepOf(spec)
	if err != nil {
		return 0
	}
	d, err := time.ParseDuration(s.Heartbeat)
	if err != nil || d <= 0 {
		return 0
	}
	return d
}

// watchHeartbeat returns ctx for an operation that must heartbeat
// (operation.Heartbeat, or output for an exec) at least every hb: it is
// cancelled with ErrNoHeartbeat once hb passes without one. stop ends the
// watch. With hb 0 it returns ctx as it is.
func watchHeartbeat(ctx context.Context, hb time.Duration) (context.Context, func()) {
	if hb <= 0 {
		return ctx, func() {}
	}
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	watched, cancel := context.WithCancelCause(ctx)
	watched = operation.WithHeartbeat(watched, func() { last.Store(time.Now().UnixNano()) })
	go func() {
		t := time.NewTimer(hb)
		defer t.Stop()
		for {
			select {
			case <-watched.Done(): // stopped, or its parent ended
				return
			case <-t.C:
				idle := time.Since(time.Unix(0, last.Load()))
				if idle >= hb {
					cancel(fmt.Errorf("%w for %s (its step's heartbeat is %s)", ErrNoHeartbeat, idle.Round(time.Millisecond), hb))
					return
				}
				t.Reset(hb - idle)
			}
		}
	}()
	return watched, func() { cancel(nil) }
}
