package dispatch

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"sync"

	"jetflow.dev/pkg/workflow"
)

// pinnedDefs shares the decoded definitions that executions are pinned
// to (ExecutionStarted.Definition): one per workflow, version and content,
// however many executions of it the dispatcher holds, instead of one
// decoded copy per execution. The definitions it hands out are shared and
// must never be changed: the interpreter only reads its Input.Def.
//
// It keeps the most recently used maxPinnedDefs; a definition it lets go
// stays alive as long as an execution in the cache still points to it.
// It is safe for concurrent use.
type pinnedDefs struct {
	mu   sync.Mutex // guards defs
	defs *lru[pinnedKey, *workflow.Definition]
}

// maxPinnedDefs bounds the definitions pinnedDefs keeps: far more than
// the workflow versions running at once on any dispatcher, and at a few
// KiB each, a few MiB at most.
const maxPinnedDefs = 512

// pinnedKey names a pinned definition. A stored version never changes,
// but the sum of the pinned bytes keeps two executions apart even if they
// pinned different definitions under one name and version (histories
// restored beside another catalog): it costs a hash of the bytes per
// history read, not a decoding.
type pinnedKey struct {
	workflow string
	version  int
	sum      [sha256.Size]byte
}

func newPinnedDefs(max int) *pinnedDefs {
	return &pinnedDefs{defs: newLRU[pinnedKey, *workflow.Definition](max, 0, nil)}
}

// get returns the definition that raw, the pinned definition of an
// execution of version of wf, decodes to: the one already decoded if
// there is one. The result is shared: never change it.
func (p *pinnedDefs) get(wf string, version int, raw json.RawMessage) (*workflow.Definition, error) {
	k := pinnedKey{workflow: wf, version: version, sum: sha256.Sum256(raw)}
	p.mu.Lock()
	def, ok := p.defs.get(k)
	p.mu.Unlock()
	if ok {
		return def, nil
	}
	// Decoded outside the lock: two executions of a new definition may
	// both decode it; the first one stored is kept.
	def = new(workflow.Definition)
	if err := json.Unmarshal(raw, def); err != nil {
		return nil, fmt.Errorf("decode pinned definition of %s v%d: %w", wf, version, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if kept, ok := p.defs.get(k); ok {
		return kept, nil
	}
	p.defs.put(k, def)
	return def, nil
}

// len is the number of definitions kept.
func (p *pinnedDefs) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.defs.len()
}
