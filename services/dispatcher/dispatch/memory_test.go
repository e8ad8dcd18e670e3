package dispatch

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// memBundle is a dispatcher of cfg over a fresh JetStream, with the
// workflows srcs registered.
type memBundle struct {
	js jetstream.JetStream
	d  *Dispatcher
}

func setupMem(t *testing.T, cfg Config, srcs ...string) *memBundle {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	return setupMemOn(t, js, cfg, srcs...)
}

// setupMemOn is setupMem over js, which the test has prepared.
func setupMemOn(t *testing.T, js jetstream.JetStream, cfg Config, srcs ...string) *memBundle {
	t.Helper()
	defs, err := catalog.Open(t.Context(), js)
	require.NoError(t, err)
	for _, src := range srcs {
		def, err := workflow.Parse([]byte(src))
		require.NoError(t, err)
		_, _, err = defs.Apply(t.Context(), def)
		require.NoError(t, err)
	}
	d, err := New(t.Context(), cfg, js, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	require.NoError(t, err)
	natstest.Serve(t, d.Run)
	return &memBundle{js: js, d: d}
}

func (b *memBundle) publish(t *testing.T, subject string, p events.Payload) {
	t.Helper()
	ev := events.New("test", "", "", time.Now(), p)
	msg, err := bus.Encode(subject, ev)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(t.Context(), msg, jetstream.WithMsgID(ev.ID))
	require.NoError(t, err)
}

// last is the type of the last event of the execution's history ("" if none).
func (b *memBundle) last(t *testing.T, wf, id string) events.Type {
	stream, err := b.js.Stream(t.Context(), bus.StreamEvents)
	if err != nil {
		return ""
	}
	m, err := stream.GetLastMsgForSubject(t.Context(), bus.ExecutionSubject(wf, id))
	if err != nil {
		return ""
	}
	return events.Type(m.Header.Get("ce-type"))
}

// cached returns the cached states, most recently used first, with the
// cache's count of bytes and the sum of its entries' sizes. Each state is
// read while its execution is not being handled (its handling lock, then
// the cache's, as the dispatcher takes them): call it once the
// executions are idle.
func (b *memBundle) cached() (states []*execState, bytes, sizes int) {
	b.d.mu.Lock()
	var ids []string
	for e := b.d.cache.order.Front(); e != nil; e = e.Next() {
		ids = append(ids, e.Value.(*lruEntry[string, *execState]).key)
	}
	b.d.mu.Unlock()
	for _, id := range ids {
		unlock := b.d.handling.lock(id)
		b.d.mu.Lock()
		if e, ok := b.d.cache.items[id]; ok {
			states = append(states, e.Value.(*lruEntry[string, *execState]).val)
			sizes += e.Value.(*lruEntry[string, *execState]).val.size()
		}
		b.d.mu.Unlock()
		unlock()
	}
	b.d.mu.Lock()
	defer b.d.mu.Unlock()
	return states, b.d.cache.bytes, sizes
}

// events is the types of the execution's history.
func (b *memBundle) events(t *testing.T, wf, id string) []events.Type {
	evs, err := b.d.hist.Read(t.Context(), bus.ExecutionSubject(wf, id), 0)
	if err != nil {
		return nil
	}
	types := make([]events.Type, 0, len(evs))
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	return types
}

const waitsSrc = "name: waits\nsteps:\n  - {id: w, kind: wait, signal: go}\n  - {id: after, kind: let, vars: {got: \"${len(vars) + 1}\", pad: \"${input.pad}\"}}\n"

// TestCacheBoundedByBytes: the dispatcher's cache of execution states
// keeps the estimated bytes of its states within CacheBytes, letting the
// least recently used go, however far below CacheSize the count is; its
// count of bytes is the sum of its states' sizes, taken again when a
// cached state changes; and an execution it let go still runs when woken
// (its state is read again from its history).
func TestCacheBoundedByBytes(t *testing.T) {
	t.Parallel()
	const budget = 64 << 10 // the least CacheBytes takes
	b := setupMem(t, Config{CacheBytes: budget, Workers: 4}, waitsSrc)
	// Inputs of 2 KiB: each state holds a few KiB, so a few dozen fill it.
	pad := make([]byte, 2<<10)
	for i := range pad {
		pad[i] = 'a' + byte(i%26)
	}
	input, err := json.Marshal(map[string]string{"pad": string(pad)})
	require.NoError(t, err)
	const n = 60
	for i := range n {
		b.publish(t, bus.SubjectStart, &events.StartExecution{Workflow: "waits", ExecutionID: fmt.Sprintf("w%02d", i), Input: input})
	}
	for i := range n {
		id := fmt.Sprintf("w%02d", i)
		natstest.Eventually(t, 60*time.Second, func() bool { return b.last(t, "waits", id) == events.TypeStepWaiting }, id+" waits")
	}
	states, bytes, sizes := b.cached()
	require.NotEmpty(t, states)
	require.Less(t, len(states), n, "the byte bound let some go long before the 10,000 states of CacheSize")
	require.LessOrEqual(t, bytes, budget, "the cached states' bytes stay within CacheBytes")
	require.Equal(t, sizes, bytes, "the cache's count is the sum of its states' sizes")
	for _, x := range states {
		require.Greater(t, x.size(), len(pad), "a state's size counts its input (%s)", x.id)
	}

	// Wake them all: the ones let go are read again, and every one ends.
	for i := range n {
		b.publish(t, bus.SubjectSignal, &events.SignalExecution{ExecutionID: fmt.Sprintf("w%02d", i), Name: "go"})
	}
	for i := range n {
		id := fmt.Sprintf("w%02d", i)
		natstest.Eventually(t, 60*time.Second, func() bool { return b.last(t, "waits", id) == events.TypeExecutionSucceeded }, id+" ends")
	}
	// Each leaves once its worker is done with it, a moment after its
	// last append.
	natstest.Eventually(t, 30*time.Second, func() bool {
		states, bytes, sizes = b.cached()
		return len(states) == 0 && bytes == 0 && sizes == 0
	}, "ended executions leave the cache, and their bytes with them")
}

// TestCacheBytesPutAgainWhenChanged: a cached state that a message
// changes in place is measured again, so that the cache's count of bytes
// follows what its states hold now, not what they held when first put.
func TestCacheBytesPutAgainWhenChanged(t *testing.T) {
	t.Parallel()
	b := setupMem(t, Config{}, "name: twice\nsteps:\n  - {id: a, kind: wait, signal: one}\n  - {id: b, kind: wait, signal: two}\n")
	b.publish(t, bus.SubjectStart, &events.StartExecution{Workflow: "twice", ExecutionID: "t1", Input: json.RawMessage(`{}`)})
	natstest.Eventually(t, 30*time.Second, func() bool { return b.last(t, "twice", "t1") == events.TypeStepWaiting }, "t1 waits for one")
	// Cached once its worker is done with it, a moment after its last append.
	var states []*execState
	var before int
	natstest.Eventually(t, 30*time.Second, func() bool { states, before, _ = b.cached(); return len(states) == 1 }, "t1 cached")
	b.publish(t, bus.SubjectSignal, &events.SignalExecution{ExecutionID: "t1", Name: "one", Data: json.RawMessage(`{"big":"0123456789012345678901234567890123456789"}`)})
	natstest.Eventually(t, 30*time.Second, func() bool {
		types := b.events(t, "twice", "t1")
		return slices.Index(types, events.TypeSignalReceived) >= 0 && types[len(types)-1] == events.TypeStepWaiting &&
			len(slices.DeleteFunc(types, func(typ events.Type) bool { return typ != events.TypeStepWaiting })) == 2
	}, "t1 waits for two")
	// Put again once its worker is done with it, a moment after its last
	// append: a second step and a signal's data take more room, and the
	// count is the state's size now.
	var after, sizes int
	natstest.Eventually(t, 30*time.Second, func() bool {
		states, after, sizes = b.cached()
		return len(states) == 1 && after > before && sizes == after
	}, "t1's bytes counted again, more than before")
}

// TestPinnedDefinitionShared: the executions of one workflow version
// share one decoded definition, whether the dispatcher started them or
// read them again from their histories; a new version gets its own; and
// running them, many at once under the race detector, never changes it
// (the interpreter only reads it).
func TestPinnedDefinitionShared(t *testing.T) {
	t.Parallel()
	b := setupMem(t, Config{Workers: 8}, waitsSrc)
	const n = 20
	for i := range n {
		b.publish(t, bus.SubjectStart, &events.StartExecution{Workflow: "waits", ExecutionID: fmt.Sprintf("p%02d", i), Input: json.RawMessage(`{"pad":"x"}`)})
	}
	for i := range n {
		id := fmt.Sprintf("p%02d", i)
		natstest.Eventually(t, 60*time.Second, func() bool { return b.last(t, "waits", id) == events.TypeStepWaiting }, id+" waits")
	}
	// Each cached once its worker is done with it, a moment after its
	// last append.
	var states []*execState
	natstest.Eventually(t, 30*time.Second, func() bool { states, _, _ = b.cached(); return len(states) == n }, "all cached")
	def := states[0].def
	require.NotNil(t, def)
	for _, x := range states {
		require.Same(t, def, x.def, "%s shares the definition", x.id)
	}
	require.Equal(t, 1, b.d.pinned.len())

	// One read again from its history gets the same.
	b.d.evict("p00")
	x, cached, err := b.d.load(t.Context(), "waits", "p00", loading{})
	require.NoError(t, err)
	require.False(t, cached)
	require.Same(t, def, x.def, "a state read again shares it too")

	// The pinned bytes, to compare with the shared definition after runs.
	evs, err := b.d.hist.Read(t.Context(), bus.ExecutionSubject("waits", "p01"), 0)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	started, ok := evs[0].Data.(*events.ExecutionStarted)
	require.True(t, ok, "the history begins with its start")
	var pinned any
	require.NoError(t, json.Unmarshal(started.Definition, &pinned))

	for i := range n {
		b.publish(t, bus.SubjectSignal, &events.SignalExecution{ExecutionID: fmt.Sprintf("p%02d", i), Name: "go"})
	}
	for i := range n {
		id := fmt.Sprintf("p%02d", i)
		natstest.Eventually(t, 60*time.Second, func() bool { return b.last(t, "waits", id) == events.TypeExecutionSucceeded }, id+" ends")
	}
	// Read with no lock: a write by a worker would be a race the race
	// detector reports, as well as a difference.
	raw, err := json.Marshal(def)
	require.NoError(t, err)
	var now any
	require.NoError(t, json.Unmarshal(raw, &now))
	require.Equal(t, pinned, now, "running the executions left the shared definition as pinned")

	// Another version of the workflow is another definition.
	defs, err := catalog.Open(t.Context(), b.js)
	require.NoError(t, err)
	v2, err := workflow.Parse([]byte(waitsSrc + "  - {id: more, kind: let, vars: {y: 2}}\n"))
	require.NoError(t, err)
	_, _, err = defs.Apply(t.Context(), v2)
	require.NoError(t, err)
	b.publish(t, bus.SubjectStart, &events.StartExecution{Workflow: "waits", ExecutionID: "v2", Input: json.RawMessage(`{"pad":"x"}`)})
	natstest.Eventually(t, 30*time.Second, func() bool { return b.last(t, "waits", "v2") == events.TypeStepWaiting }, "v2 waits")
	x, _, err = b.d.load(t.Context(), "waits", "v2", loading{})
	require.NoError(t, err)
	require.NotNil(t, x.def)
	require.NotSame(t, def, x.def, "version 2 has its own")
	require.Len(t, x.def.Steps, 3)
	require.Equal(t, projections.StatusStarted, x.state.Status)
	require.Equal(t, 2, b.d.pinned.len())
}

// TestSleepingExecutionsHibernate: an execution that waits only for a
// timer an hour away (a sleep, or a wait for a signal with an hour's
// timeout) leaves the cache once it waits, and is read again from its
// history when a signal wakes it; one that waits for a signal with no
// timeout, and one whose wait times out within 30 seconds, stay cached.
func TestSleepingExecutionsHibernate(t *testing.T) {
	t.Parallel()
	b := setupMem(t, Config{},
		"name: sleeps\nsteps:\n  - {id: nap, kind: sleep, duration: 1h}\n",
		"name: hourly\nsteps:\n  - {id: w, kind: wait, signal: go, timeout: 1h}\n  - {id: after, kind: let, vars: {x: 1}}\n",
		"name: forever\nsteps:\n  - {id: w, kind: wait, signal: go}\n",
		"name: brief\nsteps:\n  - {id: w, kind: wait, signal: go, timeout: 30s}\n")
	for wf, id := range map[string]string{"sleeps": "s1", "hourly": "h1", "forever": "f1", "brief": "b1"} {
		b.publish(t, bus.SubjectStart, &events.StartExecution{Workflow: wf, ExecutionID: id, Input: json.RawMessage(`{}`)})
		natstest.Eventually(t, 30*time.Second, func() bool { return b.last(t, wf, id) == events.TypeStepWaiting }, id+" waits")
	}
	// Cached (or let go) once its worker is done with it, a moment after
	// its last append.
	var ids []string
	natstest.Eventually(t, 30*time.Second, func() bool {
		states, _, _ := b.cached()
		ids = ids[:0]
		for _, x := range states {
			ids = append(ids, x.id)
		}
		slices.Sort(ids)
		return slices.Equal(ids, []string{"b1", "f1"})
	}, "only the executions that wait for no timer or a short one are kept")

	b.publish(t, bus.SubjectSignal, &events.SignalExecution{ExecutionID: "h1", Name: "go"})
	natstest.Eventually(t, 30*time.Second, func() bool { return b.last(t, "hourly", "h1") == events.TypeExecutionSucceeded },
		"the hibernated execution is read again and ends")
}
