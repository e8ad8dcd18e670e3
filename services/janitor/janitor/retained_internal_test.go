package janitor

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unique"
	"unsafe"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/retention"
)

// sortAndRank is how a sweep decided retention before the index kept
// the groups in order: every group built from every entry, sorted most
// recent first, and every execution of it judged. retained must decide
// exactly as it did.
func sortAndRank(entries map[string]indexed, now time.Time, ruleOf func(string) (retention.Rule, bool)) (expired []expiry, expiring []string, finishedN int) {
	groups := map[string][]finished{}
	for key, x := range entries {
		if x.kind == kindModel && x.status().Terminal() && x.ended != noTime {
			f := x.finished(key)
			groups[f.group()] = append(groups[f.group()], f)
		}
	}
	for key, all := range groups {
		finishedN += len(all)
		var list []finished
		for _, f := range all {
			if f.ExpiredAt.IsZero() {
				list = append(list, f)
			} else {
				expiring = append(expiring, f.ID)
			}
		}
		slices.SortFunc(list, func(a, b finished) int {
			if c := b.EndedAt.Compare(a.EndedAt); c != 0 {
				return c
			}
			return cmp.Compare(b.ID, a.ID)
		})
		for rank, f := range list {
			rule, ok := ruleOf(f.Retention)
			if !ok || rule.Keep(rank, now.Sub(f.EndedAt)) {
				continue
			}
			expired = append(expired, expiry{key: f.ID, group: key, rule: rule, rank: rank})
		}
	}
	return expired, expiring, finishedN
}

// TestRetainedDecidesAsSortingEveryGroupDid changes the entries of an
// index at random (executions finishing in and out of order, expiries
// recorded, resumes, rule and group changes, deletions, full reads) and,
// after each change, asks both retained and sortAndRank which executions
// their rules no longer keep, at a random time: the answers must be the
// same, execution for execution, with the same rank, group and rule.
func TestRetainedDecidesAsSortingEveryGroupDid(t *testing.T) {
	t.Parallel()
	rules := []string{"", "2", "5", "30m", "2h", "disabled", "forever", "min(3, 1h)", "max(1, 20m)", "max(4, min(2, 90m))", "min((", "10 hash g"}
	parsed := map[string]retention.Rule{}
	system := retention.Rule{Op: retention.OpCount, Count: 3}
	ruleOf := func(text string) (retention.Rule, bool) {
		if text == "" {
			return system, true
		}
		if r, ok := parsed[text]; ok {
			return r, true
		}
		r, err := retention.ParseRule(text)
		if err != nil {
			return retention.Rule{}, false
		}
		parsed[text] = r.Resolve(system)
		return parsed[text], true
	}
	t0 := time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC)
	statuses := []projections.Status{projections.StatusStarted, projections.StatusSucceeded, projections.StatusFailed,
		projections.StatusCancelled, projections.StatusSuspended, projections.StatusSucceeded, projections.StatusSucceeded}
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 42))
		keys := make([]string, 10+rng.IntN(70))
		for i := range keys {
			keys[i] = fmt.Sprintf("x%03d", i)
		}
		// One workflow most of the time, so that groups grow long and
		// their gone members are dropped and compacted.
		workflows := []string{"wf", "wf", "wf", "other"}
		clock := t0
		random := func() indexed {
			workflow, status := workflows[rng.IntN(len(workflows))], statuses[rng.IntN(len(statuses))]
			x := indexed{kind: kindModel, rev: rng.Uint64(), updated: noTime, ended: noTime, expired: noTime}
			switch rng.IntN(20) {
			case 0:
				return indexed{kind: kindMarker, rev: x.rev, updated: nanos(clock)}
			case 1: // as readIndexed makes one: no names
				return indexed{kind: kindIgnored, rev: x.rev}
			}
			text := rules[0]
			if rng.IntN(3) == 0 { // most share the system default; a rule change now and then
				text = rules[rng.IntN(len(rules))]
			}
			group := "" // as readIndexed makes every model's
			if rng.IntN(6) == 0 {
				group = "shared"
			}
			x.names = namesOf(workflow, text, group, status)
			if x.status().Terminal() && rng.IntN(15) != 0 {
				// Most end about now, in order; some a while before
				// (a late read model); some at the same instant.
				end := clock.Add(-time.Duration(rng.IntN(3)) * time.Second)
				if rng.IntN(8) == 0 {
					end = clock.Add(-time.Duration(rng.IntN(180)) * time.Minute)
				}
				x.ended = nanos(end)
				if rng.IntN(10) == 0 {
					x.expired = nanos(clock)
				}
			}
			return x
		}
		ix := modelIndex{entries: map[string]indexed{}, ret: newRetained()}
		bulk := 0 // changes left in a bulk read
		for op := range 300 {
			clock = clock.Add(time.Duration(rng.IntN(90)) * time.Second)
			key := keys[rng.IntN(len(keys))]
			old, had := ix.entries[key]
			switch r := rng.IntN(40); {
			case r == 0: // a full read: made anew
				ix.ret = retainedOf(ix.entries)
			case r == 1 && bulk == 0: // a read of many: the groups made again after it
				bulk, ix.bulk = 1+rng.IntN(20), true
			case r < 4 && had && old.kind == kindMarker: // an old marker purged
				delete(ix.entries, key)
			case r < 7 && had: // the same execution written again, in place
				x := old
				x.rev++
				ix.set(strings.Clone(key), old, true, x)
			case r < 9 && had && old.kind == kindModel: // its rule, or its group, changed in place
				x := old
				x.rev++
				if r == 7 {
					x.names = namesOf(x.workflow(), rules[rng.IntN(len(rules))], x.retentionKey(), x.status())
				} else {
					x.names = namesOf(x.workflow(), x.rule().Value(), []string{"", "shared"}[rng.IntN(2)], x.status())
				}
				ix.set(strings.Clone(key), old, true, x)
			default:
				ix.set(strings.Clone(key), old, had, random())
			}
			if bulk > 0 {
				if bulk--; bulk > 0 {
					continue // the groups are judged after the read
				}
				ix.bulk = false
				ix.ret = retainedOf(ix.entries)
			}
			now := clock.Add(time.Duration(rng.IntN(4*3600)) * time.Second)
			if rng.IntN(3) == 0 && len(ix.entries) > 0 {
				// On a boundary: an end plus one of the rules' durations.
				for _, x := range ix.entries {
					if x.kind == kindModel && x.ended != noTime {
						now = timeOf(x.ended).Add([]time.Duration{20 * time.Minute, 30 * time.Minute, time.Hour, 90 * time.Minute, 2 * time.Hour}[rng.IntN(5)]).
							Add([]time.Duration{-time.Second, -time.Nanosecond, 0}[rng.IntN(3)])
						break
					}
				}
			}
			got, looked := ix.ret.expired(now, ruleOf)
			want, expiring, total := sortAndRank(ix.entries, now, ruleOf)
			sortExpiries(got)
			sortExpiries(want)
			require.Equal(t, describe(want), describe(got), "seed %d, change %d: executions to expire", seed, op)
			require.ElementsMatch(t, expiring, mapKeys(ix.ret.expiring), "seed %d, change %d: executions whose expiry is recorded", seed, op)
			require.Equal(t, total, ix.ret.finished(), "seed %d, change %d: finished executions", seed, op)
			requireRetainedHolds(t, &ix, got, looked, fmt.Sprintf("seed %d, change %d", seed, op))
		}
	}
}

// requireRetainedHolds checks ix.ret against a count of its own: every
// group in strict order, its counts right, its ends live, no more gone
// than live (past a few); every ranked entry of the index in its group,
// under one string with the map; and that a group under one rule was
// looked at no further than its first execution kept.
func requireRetainedHolds(t *testing.T, ix *modelIndex, got []expiry, looked int, where string) {
	t.Helper()
	expiredIn := map[string]int{}
	for _, e := range got {
		expiredIn[e.group]++
	}
	ranked, bound := 0, 0
	for name, g := range ix.ret.groups {
		live, gone := 0, 0
		rules := map[unique.Handle[string]]int{}
		var last *retainedMember // live
		for i, m := range g.members[g.head:] {
			if i > 0 {
				require.LessOrEqual(t, compareMembers(g.members[g.head+i-1], m), 0, "%s: group %s out of order", where, name)
			}
			if m.gone {
				gone++
				continue
			}
			if last != nil {
				require.Negative(t, compareMembers(*last, m), "%s: group %s holds %s twice", where, name, m.id)
			}
			last = &g.members[g.head+i]
			live++
			rules[m.rule]++
			x, ok := ix.entries[m.id]
			require.True(t, ok, "%s: %s in group %s is not in the index", where, m.id, name)
			group, isRanked, _ := x.retainedAs()
			require.True(t, isRanked && group == name && x.ended == m.ended && x.rule() == m.rule, "%s: %s is not where its entry puts it", where, m.id)
		}
		require.Positive(t, live, "%s: group %s is empty and kept", where, name)
		require.Equal(t, live, g.live, "%s: group %s's live count", where, name)
		require.Equal(t, gone, g.gone, "%s: group %s's gone count", where, name)
		require.False(t, g.members[g.head].gone || g.members[len(g.members)-1].gone, "%s: group %s ends on a gone member", where, name)
		require.LessOrEqual(t, g.head+g.gone, max(g.live, 16), "%s: group %s keeps its gone members", where, name)
		counted := map[unique.Handle[string]]int{}
		for _, rc := range g.rules {
			counted[rc.text] = rc.n
		}
		require.Equal(t, rules, counted, "%s: group %s's rules", where, name)
		ranked += live
		if len(g.rules) == 1 {
			bound += min(expiredIn[name]+1, g.live)
		} else {
			bound += g.live
		}
	}
	require.LessOrEqual(t, looked, bound, "%s: looked further than the first kept", where)
	for key, x := range ix.entries {
		group, isRanked, _ := x.retainedAs()
		if !isRanked {
			continue
		}
		ranked--
		g := ix.ret.groups[group]
		require.NotNil(t, g, "%s: %s's group %s is missing", where, key, group)
		i, ok := g.find(key, x.ended)
		require.True(t, ok, "%s: %s is not in its group", where, key)
		// (Not require.Equal: it compares what pointers point to.)
		require.True(t, unsafe.StringData(key) == unsafe.StringData(g.members[i].id), "%s: %s's key and member are two strings", where, key)
	}
	require.Zero(t, ranked, "%s: the groups hold executions the index does not rank", where)
}

func sortExpiries(list []expiry) {
	slices.SortFunc(list, func(a, b expiry) int { return strings.Compare(a.key, b.key) })
}

func describe(list []expiry) []string {
	out := make([]string, len(list))
	for i, e := range list {
		out[i] = fmt.Sprintf("%s in %s at rank %d by %s", e.key, e.group, e.rank, e.rule)
	}
	return out
}

func mapKeys(m map[string]struct{}) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// BenchmarkRetentionDecision is a sweep's retention decision over
// 100,000 finished executions of one workflow kept 7 days, all kept
// (what most sweeps find): as the sweeps decided before the index kept
// the groups in order (sort-every-group), and now (kept-in-order), with
// two rules in the group (two-rules), and with a thousand finished and a
// thousand deleted since the sweep before (turnover: what the index's
// changes cost too).
func BenchmarkRetentionDecision(b *testing.B) {
	const n = 100_000
	now := time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC)
	rule, err := retention.ParseRule("7d")
	require.NoError(b, err)
	ruleOf := func(string) (retention.Rule, bool) { return rule, true }
	model := func(i int) indexed {
		return indexed{kind: kindModel, rev: uint64(i), updated: noTime, expired: noTime,
			ended: nanos(now.Add(-24 * time.Hour).Add(time.Duration(i) * time.Second)),
			names: namesOf("orders", "7d", "", projections.StatusSucceeded)}
	}
	key := func(i int) string { return fmt.Sprintf("exec-%09d", i) }
	ix := modelIndex{entries: map[string]indexed{}, ret: newRetained()}
	for i := range n {
		ix.entries[key(i)] = model(i)
	}
	ix.ret = retainedOf(ix.entries)
	b.Run("sort-every-group", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if got, _, _ := sortAndRank(ix.entries, now, ruleOf); len(got) != 0 {
				b.Fatal(len(got))
			}
		}
	})
	b.Run("kept-in-order", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if got, _ := ix.ret.expired(now, ruleOf); len(got) != 0 {
				b.Fatal(len(got))
			}
		}
	})
	b.Run("kept-in-order/two-rules", func(b *testing.B) {
		// Every other execution under another rule (a child's, say, which
		// records its parent's): the walk stops at the first kept under each.
		mixed := modelIndex{entries: map[string]indexed{}, ret: newRetained()}
		for i := range n {
			x := model(i)
			if i%2 == 1 {
				x.names = namesOf("orders", "30d", "", projections.StatusSucceeded)
			}
			mixed.entries[key(i)] = x
		}
		mixed.ret = retainedOf(mixed.entries)
		b.ReportAllocs()
		for b.Loop() {
			if got, _ := mixed.ret.expired(now, ruleOf); len(got) != 0 {
				b.Fatal(len(got))
			}
		}
	})
	first, next := 0, n // the oldest kept, and the next to finish
	b.Run("kept-in-order/turnover", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for range 1000 {
				k := key(first)
				ix.set(k, ix.entries[k], true, indexed{kind: kindMarker, rev: uint64(next), updated: noTime})
				delete(ix.entries, k)
				first++
				ix.set(key(next), indexed{}, false, model(next))
				next++
			}
			if got, _ := ix.ret.expired(now.Add(time.Duration(next-n)*time.Second), ruleOf); len(got) != 0 {
				b.Fatal(len(got))
			}
		}
	})
}

// TestRefreshKeepsTheGroupsInStep reads a real bucket as sweeps do: a
// first (full) read, a few models written since (each moved in its
// group), then more than a quarter of the index and bulkAfter written
// at once, some with earlier ends (the groups made again after the
// read), then deletions. After each read the groups must be what
// sorting every group would give, and every ranked key one string with
// its member.
func TestRefreshKeepsTheGroupsInStep(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	kv, err := js.KeyValue(ctx, bus.BucketExecutions)
	require.NoError(t, err)
	t0 := time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC)
	put := func(i int, ended time.Time, rule string) {
		t.Helper()
		x := projections.Execution{ID: fmt.Sprintf("x%05d", i), Workflow: []string{"wf", "other"}[i%2], Status: projections.StatusSucceeded,
			EndedAt: ended, UpdatedAt: ended, Retention: rule}
		v, err := projections.EncodeStored(x, nil)
		require.NoError(t, err)
		_, err = kv.Put(ctx, x.ID, v)
		require.NoError(t, err)
	}
	system := retention.Rule{Op: retention.OpCount, Count: 50}
	ruleOf := func(text string) (retention.Rule, bool) {
		if text == "" {
			return system, true
		}
		r, err := retention.ParseRule(text)
		if err != nil {
			return retention.Rule{}, false
		}
		return r.Resolve(system), true
	}
	var ix modelIndex
	check := func(step string) {
		t.Helper()
		now := t0.Add(3 * time.Hour)
		got, looked := ix.ret.expired(now, ruleOf)
		want, expiring, total := sortAndRank(ix.entries, now, ruleOf)
		sortExpiries(got)
		sortExpiries(want)
		require.Equal(t, describe(want), describe(got), step)
		require.Empty(t, expiring, step)
		require.Equal(t, total, ix.ret.finished(), step)
		requireRetainedHolds(t, &ix, got, looked, step)
	}
	for i := range 200 {
		put(i, t0.Add(time.Duration(i)*time.Second), "")
	}
	require.NoError(t, ix.refresh(ctx, kv, t0))
	check("first read")
	require.Equal(t, 200, ix.ret.finished())

	for i := 200; i < 230; i++ { // a few since: in order, one late, one rule of its own
		put(i, t0.Add(time.Duration(i)*time.Second), "")
	}
	put(230, t0.Add(-time.Hour), "")
	put(231, t0.Add(time.Minute), "1h")
	require.NoError(t, ix.refresh(ctx, kv, t0.Add(time.Minute)))
	require.False(t, ix.bulk)
	check("a few written since")
	require.Equal(t, 232, ix.ret.finished())

	for i := 232; i < 232+bulkAfter+100; i++ { // many: ends out of order, some rewritten
		put(i, t0.Add(time.Duration((i*7919)%5000)*time.Second), []string{"", "2h"}[i%3%2])
	}
	for i := 0; i < 100; i += 3 {
		put(i, t0.Add(-time.Duration(i)*time.Minute), "")
	}
	require.NoError(t, ix.refresh(ctx, kv, t0.Add(2*time.Minute)))
	check("many written since")
	require.Equal(t, 232+bulkAfter+100, ix.ret.finished())

	for i := 0; i < 300; i += 2 {
		require.NoError(t, kv.Delete(ctx, fmt.Sprintf("x%05d", i)))
	}
	require.NoError(t, ix.refresh(ctx, kv, t0.Add(3*time.Minute)))
	check("deletions")
	require.Equal(t, 232+bulkAfter+100-150, ix.ret.finished())
}
