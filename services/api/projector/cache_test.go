package projector

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
)

// TestCacheBoundedByBytes: the projector's cache of execution states
// keeps their estimated bytes within MaxCache, far below its count bound,
// by letting others go (down to three quarters); the state just put
// stays; its count of bytes is always the sum of its entries' sizes,
// through replacing, forgetting and letting go.
func TestCacheBoundedByBytes(t *testing.T) {
	t.Parallel()
	const budget = 64 << 10
	p := &Projector{MaxCache: budget, cache: map[string]entry{}}
	check := func() {
		t.Helper()
		sum := 0
		for _, e := range p.cache {
			sum += e.size
		}
		require.Equal(t, sum, p.cacheBytes, "the count is the sum of the entries' sizes")
		require.LessOrEqual(t, p.cacheBytes, budget, "within MaxCache")
	}
	input := json.RawMessage(`{"pad":"` + strings.Repeat("x", 2<<10) + `"}`)
	state := func(id string) projections.Execution {
		return projections.Execution{ID: id, Workflow: "w", Status: projections.StatusStarted, Input: input,
			Steps: []projections.Step{{ID: "sleep", Kind: "sleep", Status: projections.OpStarted}}}
	}
	for i := range 200 {
		id := fmt.Sprintf("e%03d", i)
		p.remember(id, entry{state: state(id), rev: uint64(i + 1)})
		require.Contains(t, p.cache, id, "the state just put stays")
		require.Greater(t, p.cache[id].size, len(input), "its size counts its input")
		check()
	}
	require.Less(t, len(p.cache), 200, "the bytes, not the count (%d), bound it", cacheMax)
	require.Greater(t, len(p.cache), 10, "it lets go of a quarter at a time, not all")

	// Replacing a state takes its size again; forgetting one takes it off.
	var some string
	for k := range p.cache {
		some = k
		break
	}
	bigger := state(some)
	bigger.Output = json.RawMessage(`"` + strings.Repeat("y", 1<<10) + `"`)
	before := p.cache[some].size
	p.remember(some, entry{state: bigger})
	require.Greater(t, p.cache[some].size, before)
	check()
	p.forget(some)
	require.NotContains(t, p.cache, some)
	check()
	for k := range p.cache {
		p.forget(k)
	}
	require.Zero(t, p.cacheBytes)
}

// TestSleepingExecutionsLeaveTheCache: the projector keeps no state for
// an execution asleep for an hour (its next event reads the read model
// again), and keeps one that sleeps for a second; both read models are
// written.
func TestSleepingExecutionsLeaveTheCache(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	at := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	sleep := func(id string, d time.Duration) uint64 {
		var last uint64
		for i, p := range []events.Payload{
			&events.ExecutionStarted{Workflow: "wf", Version: 1, Input: json.RawMessage(`{}`), Steps: []events.StepRef{{ID: "nap", Kind: "sleep"}}, Token: "t"},
			&events.StepScheduled{StepID: "nap", Attempt: 1},
			&events.StepWaiting{StepID: "nap", Attempt: 1, Until: at.Add(d)},
		} {
			ev := events.New("test", id, "wf", at.Add(time.Duration(i)*time.Millisecond), p)
			ev.PrevSeq = last
			last, err = history.Append(t.Context(), js, bus.ExecutionSubject("wf", id), last, ev)
			require.NoError(t, err)
		}
		return last
	}
	hour, second := sleep("hour", time.Hour), sleep("second", time.Second)

	p, err := New(t.Context(), js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stored := func(id string, seq uint64) bool {
		e, err := kv.Get(t.Context(), id)
		if err != nil {
			return false
		}
		var x projections.Execution
		return json.Unmarshal(e.Value(), &x) == nil && x.LastSeq == seq && len(x.Steps) == 1 && x.Steps[0].Status == projections.OpWaiting
	}
	natstest.Eventually(t, 20*time.Second, func() bool { return stored("hour", hour) && stored("second", second) }, "both are projected")
	cancel()
	require.NoError(t, <-done) // Run's goroutine is done with the cache
	require.NotContains(t, p.cache, "hour", "asleep for an hour: not kept")
	require.Contains(t, p.cache, "second", "asleep for a second: kept")
	require.Equal(t, p.cache["second"].size, p.cacheBytes)
}
