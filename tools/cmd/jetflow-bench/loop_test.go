package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/workflow"
)

// TestLoopWorkflow: the loop run's workflow begins each round with a
// local noop, or with a sleep when asked, and loops the rounds asked.
func TestLoopWorkflow(t *testing.T) {
	d, err := loopOf(7, 0)
	require.NoError(t, err)
	require.Len(t, d.Steps, 4)
	require.Equal(t, workflow.KindNoop, d.Steps[1].Kind)
	require.True(t, d.Steps[1].Local)
	require.Equal(t, "${vars.n < 7}", d.Steps[3].Condition)
	d, err = loopOf(7, 20*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, workflow.KindSleep, d.Steps[1].Kind)
	require.Equal(t, "20ms", d.Steps[1].Duration)
	require.Equal(t, "a sleep of 20ms", loopWork(20*time.Millisecond))
}

// TestLoopRoundTimes: a round's time is between two of an execution's
// counts, averaged over the executions and the rounds asked.
func TestLoopRoundTimes(t *testing.T) {
	t0 := time.Unix(0, 0)
	at := func(ms ...int) []time.Time {
		out := make([]time.Time, len(ms))
		for i, m := range ms {
			out[i] = t0.Add(time.Duration(m) * time.Millisecond)
		}
		return out
	}
	l := &loopRounds{at: map[string][]time.Time{
		"a": at(0, 10, 20, 40, 80),
		"b": at(0, 30, 60, 90),
	}}
	require.Equal(t, 20*time.Millisecond, l.perRound(0, 3), "rounds 1 and 2 of both: 10, 10, 30, 30")
	require.Equal(t, 40*time.Millisecond, l.perRound(4, 5), "only a has a fifth count")
	require.Zero(t, l.perRound(6, 9), "no rounds there")
}
