package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/pprof"
	"time"
)

// burstProfileLead is how long before the timers' due time the burst's
// CPU profile starts (-timers-cpuprofile): the fire loop wakes at T, and
// the read ahead of the executions' last events (a second before T) is
// left out.
const burstProfileLead = 20 * time.Millisecond

// profileWindow writes a CPU profile of this process from from to
// from+window into path (-timers-cpuprofile: the timer burst, which the
// whole run's -cpuprofile drowns in its arming). It returns at once; wait
// returns when the profile is written (or ctx ended first) and says what
// went wrong. Only one CPU profile may run in a process at once: run
// refuses -cpuprofile beside it.
func profileWindow(ctx context.Context, path string, from time.Time, window time.Duration) (wait func() error) {
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Until(from)):
			}
			f, err := os.Create(path)
			if err != nil {
				return err
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				return errors.Join(err, f.Close())
			}
			select {
			case <-ctx.Done():
			case <-time.After(window):
			}
			pprof.StopCPUProfile()
			return f.Close()
		}()
	}()
	return func() error {
		if err := <-done; err != nil {
			return fmt.Errorf("-timers-cpuprofile %s: %w", path, err)
		}
		return nil
	}
}

// burstProfile is the timer run's profile of its burst (profileWindow).
type burstProfile struct {
	cancel context.CancelFunc
	wait   func() error
	done   bool
	err    error
}

// startBurstProfile starts profileWindow for the timer run.
func startBurstProfile(ctx context.Context, path string, from time.Time, window time.Duration) *burstProfile {
	ctx, cancel := context.WithCancel(ctx)
	return &burstProfile{cancel: cancel, wait: profileWindow(ctx, path, from, window)}
}

// finish ends the profile: at once when the run failed (none written
// before its window, or one cut short), else once its window has passed,
// so that nothing the run does afterwards (its read back) is in it. It
// says what went wrong writing it; a second call only says it again. A
// nil profile (none asked for) finishes at once.
func (b *burstProfile) finish(failed bool) error {
	if b == nil {
		return nil
	}
	if !b.done {
		if failed {
			b.cancel()
		}
		b.err = b.wait()
		b.cancel()
		b.done = true
	}
	return b.err
}
