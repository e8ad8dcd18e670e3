package dispatch_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
	"jetflow.dev/services/internal/metrics/metricstest"
)

// measured runs a dispatcher with cfg, counting into a registry of the
// test's, which it returns.
func (b *testBundle) measured(t *testing.T, cfg dispatch.Config) *prometheus.Registry {
	t.Helper()
	reg, m := newMetrics(t)
	cfg.Metrics = m
	runDispatcher(t, b.js, cfg)
	return reg
}

// timersSettled waits until the timers stream holds nothing more: every
// schedule fired, and its message was acknowledged.
func (b *testBundle) timersSettled(t *testing.T) {
	t.Helper()
	natstest.Eventually(t, waitFor, func() bool {
		s, err := b.js.Stream(t.Context(), bus.StreamTimers)
		require.NoError(t, err)
		info, err := s.Info(t.Context())
		require.NoError(t, err)
		return info.State.Msgs == 0 && info.State.LastSeq >= 2 // a schedule, its fired message
	}, "the timers stream still holds a schedule or a fired timer")
}

// TestTimersFireFromMemory: a sleep due soon fires from the memory of
// the dispatcher that armed it, once; its schedule's message, which comes
// later, is acknowledged without being handled again. With
// NoTimersFromMemory it fires by its schedule, as before.
func TestTimersFireFromMemory(t *testing.T) {
	t.Parallel()
	for _, fromMemory := range []bool{true, false} {
		b := setup(t)
		reg := b.measured(t, dispatch.Config{Workers: 4, NoTimersFromMemory: !fromMemory})
		b.applyYAML(t, "name: nap\nsteps:\n  - {id: nap, kind: sleep, duration: 200ms}\n")
		b.start(t, "nap", "n1")
		_, evs := waitStatus(t, b.js, "nap", "n1", projections.StatusSucceeded)
		require.Equal(t, 1, countType(evs, events.TypeTimerFired))
		b.timersSettled(t)
		firedBy(t, reg, fromMemory)
		_, evs = waitStatus(t, b.js, "nap", "n1", projections.StatusSucceeded)
		require.Equal(t, 1, countType(evs, events.TypeTimerFired), "recorded once")
	}
}

// TestALongTimerFiresFromMemoryByItsNotice (docs/adr/0019): a sleep due
// past the horizon when armed (shortened here to 2 s, its notice 1 s
// before) is brought into memory by its notice and fires from memory,
// once; its schedules' messages (the notice's, the guarantee's) all leave
// the timers stream. Without notices it fires by its schedule.
func TestALongTimerFiresFromMemoryByItsNotice(t *testing.T) {
	t.Parallel()
	for _, notices := range []bool{true, false} {
		b := setup(t)
		cfg := dispatch.WithTimerHorizon(dispatch.Config{Workers: 4, NoTimerNotices: !notices}, 2*time.Second, time.Second)
		reg := b.measured(t, cfg)
		b.applyYAML(t, "name: nap\nsteps:\n  - {id: nap, kind: sleep, duration: 4s}\n")
		b.start(t, "nap", "n1")
		_, evs := waitStatus(t, b.js, "nap", "n1", projections.StatusSucceeded)
		require.Equal(t, 1, countType(evs, events.TypeTimerFired), "fired once")
		b.timersSettled(t)
		firedBy(t, reg, notices)
	}
}

// firedBy checks that the one timer of a dispatcher counting into reg
// fired from its memory, or else by its schedule's message.
func firedBy(t *testing.T, reg *prometheus.Registry, fromMemory bool) {
	t.Helper()
	memory, schedule := 1.0, 0.0
	if !fromMemory {
		memory, schedule = 0, 1
	}
	waitMetric(t, reg, memory, "jetflow_dispatcher_timer_firings_total", "by", "memory")
	require.Equal(t, schedule, metricstest.Value(t, reg, "jetflow_dispatcher_timer_firings_total", "by", "schedule"))
}

// TestTimerFromMemoryLostToAStop: the dispatcher that armed a timer
// stops before it is due; the next one fires it by its schedule.
//
// The stop must come before the timer is due, or the first dispatcher
// fires it from memory itself (and acknowledges its schedule's message
// if that comes before it stops): on a loaded machine the time from the
// arming to the stop can outlast a short sleep. So a try whose first
// dispatcher recorded the firing before it stopped is no test of the
// claim: it is tried again with a longer sleep, and the test fails if no
// try stops in time.
func TestTimerFromMemoryLostToAStop(t *testing.T) {
	t.Parallel()
	for _, sleep := range []time.Duration{2 * time.Second, 8 * time.Second, 30 * time.Second} {
		if timerLostToAStop(t, sleep) {
			return
		}
		t.Logf("the first dispatcher fired the %s timer before it stopped (a loaded machine): again with a longer sleep", sleep)
	}
	t.Fatal("the first dispatcher fired its timer before it stopped, even a 30s one")
}

// timerLostToAStop is one try of TestTimerFromMemoryLostToAStop, on a
// server of its own: false if the first dispatcher fired the timer
// before it stopped.
func timerLostToAStop(t *testing.T, sleep time.Duration) bool {
	t.Helper()
	b := setup(t)
	b.applyYAML(t, fmt.Sprintf("name: nap\nsteps:\n  - {id: nap, kind: sleep, duration: %s}\n", sleep))
	first, err := dispatch.New(t.Context(), dispatch.Config{Workers: 2, Source: "first"}, b.js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	ctx, stop := context.WithCancel(t.Context())
	stopped := make(chan error, 1)
	go func() { stopped <- first.Run(ctx) }()
	b.start(t, "nap", "n1")
	// The decision that arms the timer ends with step.waiting: a stop
	// before it leaves the decision to the second dispatcher, which then
	// arms the timer in its own memory.
	waitHistory(t, b.js, "nap", "n1", "timer armed, step waiting", func(evs []events.Event) bool {
		return countType(evs, events.TypeTimerArmed) == 1 && countType(evs, events.TypeStepWaiting) == 1
	})
	stop()
	select {
	case err := <-stopped:
		require.NoError(t, err)
	case <-time.After(waitFor):
		t.Fatal("the first dispatcher did not stop")
	}
	if countType(readHistory(t, b.js, "nap", "n1"), events.TypeTimerFired) > 0 {
		return false
	}

	reg := b.measured(t, dispatch.Config{Workers: 2, Source: "second"})
	var evs []events.Event
	// Its schedule fires scheduleGrace (2s) after the sleep ends.
	natstest.Eventually(t, sleep+waitFor, func() bool {
		evs = readHistory(t, b.js, "nap", "n1")
		return countType(evs, events.TypeExecutionSucceeded) == 1
	}, "nap n1 did not succeed; have %v", natstest.Later(func() any { return typesOf(evs) }))
	require.Equal(t, 1, countType(evs, events.TypeTimerFired))
	waitMetric(t, reg, 1, "jetflow_dispatcher_timer_firings_total", "by", "schedule")
	require.Zero(t, metricstest.Value(t, reg, "jetflow_dispatcher_timer_firings_total", "by", "memory"))
	for _, ev := range evs {
		if events.FiringOf(ev.Data) != "" { // the sleep's success records it (docs/adr/0017)
			require.Equal(t, "second", ev.Source, "fired by the second dispatcher")
		}
	}
	return true
}
