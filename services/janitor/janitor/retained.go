package janitor

import (
	"cmp"
	"slices"
	"strings"
	"time"
	"unique"

	"jetflow.dev/pkg/retention"
)

// retained is the finished executions retention ranks, by group, each
// group in order of end and kept so from one sweep to the next as the
// index changes: a sweep ranks and judges them without building or
// sorting anything, and judges the executions under each rule only from
// the oldest up to the first one kept. A rule keeps an execution less
// the older and the further down its group it is (retention.Rule.Keep),
// so every younger execution under the same rule is kept too. Before
// it, each sweep built and sorted every group: work, and over a
// kilobyte of garbage, for every finished execution kept, every sweep.
type retained struct {
	groups map[string]*retainedGroup
	// expiring are the finished executions whose expiry is recorded:
	// deleted whatever their rule, counted in no group.
	expiring map[string]struct{}
}

// retainedGroup is one retention group's finished executions whose
// expiry is not recorded, oldest first (by end, then id, the order of
// their ranks reversed: the rank of one is the number after it). An
// execution that leaves is marked gone where it is (found by its end and
// id), and the gone are dropped as they reach either end, or all at once
// when they are as many as the others.
type retainedGroup struct {
	members []retainedMember
	head    int // members before it are dropped
	live    int // members not gone
	gone    int // gone members from head on
	// rules counts the live members by rule text (one text, mostly).
	rules []ruleCount
}

type ruleCount struct {
	text unique.Handle[string]
	n    int
}

type retainedMember struct {
	ended int64 // nanos
	id    string
	rule  unique.Handle[string]
	gone  bool
}

func newRetained() *retained {
	return &retained{groups: map[string]*retainedGroup{}, expiring: map[string]struct{}{}}
}

// retainedAs says where an index entry stands for retention: in group
// (ranked), expiring (its expiry recorded), or neither (running, without
// an end, a marker, ignored).
func (x indexed) retainedAs() (group string, ranked, expiring bool) {
	if x.kind != kindModel || !x.status().Terminal() || x.ended == noTime {
		return "", false, false
	}
	if x.expired != noTime {
		return "", false, true
	}
	return cmp.Or(x.retentionKey(), x.workflow()), true, false
}

// samePlace says that entries old and x of one key rank their
// execution in the same group with the same end and rule.
func samePlace(old, x indexed) bool {
	og, oRanked, _ := old.retainedAs()
	ng, nRanked, _ := x.retainedAs()
	return oRanked && nRanked && og == ng && old.ended == x.ended && old.rule() == x.rule()
}

// update moves key's execution from where old put it (had: there was an
// entry) to where its new entry x puts it.
func (r *retained) update(key string, old indexed, had bool, x indexed) {
	if had && samePlace(old, x) {
		return
	}
	var og string
	var oRanked, oExpiring bool
	if had {
		og, oRanked, oExpiring = old.retainedAs()
	}
	ng, nRanked, nExpiring := x.retainedAs()
	if oExpiring && !nExpiring {
		delete(r.expiring, key)
	}
	if oRanked {
		if g := r.groups[og]; g != nil {
			g.remove(key, old.ended)
			if g.live == 0 {
				delete(r.groups, og)
			}
		}
	}
	if nExpiring {
		r.expiring[key] = struct{}{}
	}
	if nRanked {
		g := r.groups[ng]
		if g == nil {
			g = &retainedGroup{}
			r.groups[ng] = g
		}
		g.add(retainedMember{ended: x.ended, id: key, rule: x.rule()})
	}
}

// retainedOf makes the groups of every entry of the index (after a full
// read, or a read of many), each sorted once.
func retainedOf(entries map[string]indexed) *retained {
	r := newRetained()
	for key, x := range entries {
		group, ranked, expiring := x.retainedAs()
		switch {
		case expiring:
			r.expiring[key] = struct{}{}
		case ranked:
			g := r.groups[group]
			if g == nil {
				g = &retainedGroup{}
				r.groups[group] = g
			}
			g.members = append(g.members, retainedMember{ended: x.ended, id: key, rule: x.rule()})
			g.live++
			g.count(x.rule(), 1)
		}
	}
	for _, g := range r.groups {
		slices.SortFunc(g.members, compareMembers)
	}
	return r
}

// finished is how many finished executions r holds.
func (r *retained) finished() int {
	n := len(r.expiring)
	for _, g := range r.groups {
		n += g.live
	}
	return n
}

func compareMembers(a, b retainedMember) int {
	if c := cmp.Compare(a.ended, b.ended); c != 0 {
		return c
	}
	return strings.Compare(a.id, b.id)
}

// add puts m in its place: at the end, for an execution that ended last
// (most do), else where its end puts it.
func (g *retainedGroup) add(m retainedMember) {
	g.live++
	g.count(m.rule, 1)
	if n := len(g.members); n == g.head || compareMembers(g.members[n-1], m) < 0 {
		g.members = append(g.members, m)
		return
	}
	i, _ := slices.BinarySearchFunc(g.members[g.head:], m, compareMembers)
	g.members = slices.Insert(g.members, g.head+i, m)
}

// count adds d to the live members under rule text.
func (g *retainedGroup) count(text unique.Handle[string], d int) {
	for i := range g.rules {
		if g.rules[i].text == text {
			if g.rules[i].n += d; g.rules[i].n == 0 {
				g.rules = slices.Delete(g.rules, i, i+1)
			}
			return
		}
	}
	g.rules = append(g.rules, ruleCount{text: text, n: d})
}

// find is where the live member id, which ended at ended, is.
func (g *retainedGroup) find(id string, ended int64) (int, bool) {
	at := retainedMember{ended: ended, id: id}
	i, _ := slices.BinarySearchFunc(g.members[g.head:], at, compareMembers)
	for i += g.head; i < len(g.members) && compareMembers(g.members[i], at) == 0; i++ {
		if !g.members[i].gone {
			return i, true
		}
	}
	return 0, false
}

// remove marks the live member id, which ended at ended, gone.
func (g *retainedGroup) remove(id string, ended int64) {
	if i, ok := g.find(id, ended); ok {
		m := &g.members[i]
		m.gone = true
		g.live--
		g.gone++
		g.count(m.rule, -1)
	}
	for g.head < len(g.members) && g.members[g.head].gone {
		g.members[g.head] = retainedMember{} // lets go of its id
		g.head++
		g.gone--
	}
	for n := len(g.members); n > g.head && g.members[n-1].gone; n-- {
		g.members[n-1] = retainedMember{}
		g.members = g.members[:n-1]
		g.gone--
	}
	if g.head+g.gone > max(g.live, 16) {
		kept := make([]retainedMember, 0, g.live+g.live/4)
		for _, m := range g.members[g.head:] {
			if !m.gone {
				kept = append(kept, m)
			}
		}
		g.members, g.head, g.gone = kept, 0, 0
	}
}

// expiry is a finished execution its rule no longer keeps: its place
// (rank) in its group and the rule (resolved), as the sweep found them.
type expiry struct {
	key, group string
	rule       retention.Rule
	rank       int
}

// memberID is the id string the group's member for key holds, x being
// key's entry (the index's map shares it).
func (r *retained) memberID(key string, x indexed) (string, bool) {
	group, ranked, _ := x.retainedAs()
	if g := r.groups[group]; ranked && g != nil {
		if i, ok := g.find(key, x.ended); ok {
			return g.members[i].id, true
		}
	}
	return "", false
}

// expired says which of the ranked executions their rules no longer
// keep at now, and how many it looked at. ruleOf resolves a rule's
// text; a rule it cannot (false) keeps every execution that has it.
// Each group is walked from its oldest execution, those under a rule
// looked at until the first one it keeps, the walk ended once every
// rule of the group has kept one.
func (r *retained) expired(now time.Time, ruleOf func(text string) (retention.Rule, bool)) (out []expiry, looked int) {
	type judge struct {
		text unique.Handle[string]
		rule retention.Rule
		done bool // it kept one: it keeps every younger one
	}
	var judges []judge // reused from group to group
	for key, g := range r.groups {
		judges = judges[:0]
		left := 0
		for _, rc := range g.rules {
			rule, ok := ruleOf(rc.text.Value())
			judges = append(judges, judge{text: rc.text, rule: rule, done: !ok})
			if ok {
				left++
			}
		}
		rank := g.live
		for _, m := range g.members[g.head:] {
			if left == 0 {
				break
			}
			if m.gone {
				continue
			}
			rank--
			looked++
			j := &judges[0]
			for k := 1; j.text != m.rule && k < len(judges); k++ {
				j = &judges[k]
			}
			if j.done {
				continue
			}
			if j.rule.Keep(rank, now.Sub(timeOf(m.ended))) {
				j.done = true
				left--
				continue
			}
			out = append(out, expiry{key: m.id, group: key, rule: j.rule, rank: rank})
		}
	}
	return out, looked
}
