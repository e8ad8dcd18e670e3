package projector

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

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
