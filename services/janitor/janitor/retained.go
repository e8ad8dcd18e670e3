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
// sorting anything, and in a group whose executions share one rule (all
// of them, but for the while after a rule changed) it judges only from
// the oldest up to the first one kept. A rule keeps an execution less
// the older and the further down its group it is (retention.Rule.Keep),
// so every execution younger than one kept is kept too. Before it, each
// sweep built and sorted every group: work, and about 150 bytes of
// garbage, for every finished execution kept, every sweep.
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
	// rules counts the live members by rule text.
	rules map[unique.Handle[string]]int
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
	if x.kind != kindModel || !x.status.Value().Terminal() || x.ended == noTime {
		return "", false, false
	}
	if x.expired != noTime {
		return "", false, true
	}
	return cmp.Or(x.retentionKey.Value(), x.workflow.Value()), true, false
}

// samePlace says that entries old and x of one key rank their
// execution in the same group with the same end and rule.
func samePlace(old, x indexed) bool {
	og, oRanked, _ := old.retainedAs()
	ng, nRanked, _ := x.retainedAs()
	return oRanked && nRanked && og == ng && old.ended == x.ended && old.retention == x.retention
}

// update moves key's execution from where old put it (had: there was an
// entry) to where x puts it (has: there is one).
func (r *retained) update(key string, old indexed, had bool, x indexed, has bool) {
	if had && has && samePlace(old, x) {
		return
	}
	var og, ng string
	var oRanked, oExpiring, nRanked, nExpiring bool
	if had {
		og, oRanked, oExpiring = old.retainedAs()
	}
	if has {
		ng, nRanked, nExpiring = x.retainedAs()
	}
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
			g = &retainedGroup{rules: map[unique.Handle[string]]int{}}
			r.groups[ng] = g
		}
		g.add(retainedMember{ended: x.ended, id: key, rule: x.retention})
	}
}

// build makes r anew from every entry of the index (after a full read):
// each group sorted once.
func (r *retained) build(entries map[string]indexed) {
	*r = *newRetained()
	for key, x := range entries {
		group, ranked, expiring := x.retainedAs()
		switch {
		case expiring:
			r.expiring[key] = struct{}{}
		case ranked:
			g := r.groups[group]
			if g == nil {
				g = &retainedGroup{rules: map[unique.Handle[string]]int{}}
				r.groups[group] = g
			}
			g.members = append(g.members, retainedMember{ended: x.ended, id: key, rule: x.retention})
			g.live++
			g.rules[x.retention]++
		}
	}
	for _, g := range r.groups {
		slices.SortFunc(g.members, compareMembers)
	}
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
	g.rules[m.rule]++
	if n := len(g.members); n == g.head || compareMembers(g.members[n-1], m) < 0 {
		g.members = append(g.members, m)
		return
	}
	i, _ := slices.BinarySearchFunc(g.members[g.head:], m, compareMembers)
	g.members = slices.Insert(g.members, g.head+i, m)
}

// remove marks the live member id, which ended at ended, gone.
func (g *retainedGroup) remove(id string, ended int64) {
	at := retainedMember{ended: ended, id: id}
	i, _ := slices.BinarySearchFunc(g.members[g.head:], at, compareMembers)
	for i += g.head; i < len(g.members) && compareMembers(g.members[i], at) == 0; i++ {
		if m := &g.members[i]; !m.gone {
			m.gone = true
			g.live--
			g.gone++
			if g.rules[m.rule]--; g.rules[m.rule] == 0 {
				delete(g.rules, m.rule)
			}
			break
		}
	}
	for g.head < len(g.members) && g.members[g.head].gone {
		g.members[g.head] = retainedMember{} // lets go of its id
		g.head++
		g.gone--
	}
	for n := len(g.members); n > g.head && g.members[n-1].gone; n-- {
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

// expired says which of the ranked executions their rules no longer
// keep at now. ruleOf resolves a rule's text; a rule it cannot
// (false) keeps every execution that has it.
func (r *retained) expired(now time.Time, ruleOf func(text string) (retention.Rule, bool)) []expiry {
	var out []expiry
	for key, g := range r.groups {
		one := len(g.rules) == 1
		var rule retention.Rule
		if one {
			var ok bool
			for text := range g.rules {
				rule, ok = ruleOf(text.Value())
			}
			if !ok {
				continue // kept, all of them
			}
		}
		rank := g.live
		for _, m := range g.members[g.head:] {
			if m.gone {
				continue
			}
			rank--
			if !one {
				var ok bool
				if rule, ok = ruleOf(m.rule.Value()); !ok {
					continue
				}
			}
			if rule.Keep(rank, now.Sub(timeOf(m.ended))) {
				if one {
					break // every execution after it is younger, and further up
				}
				continue
			}
			out = append(out, expiry{key: m.id, group: key, rule: rule, rank: rank})
		}
	}
	return out
}
