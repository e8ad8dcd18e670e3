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

	"github.com/stretchr/testify/require"

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
		if x.kind == kindModel && x.status.Value().Terminal() && x.ended != noTime {
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
	for seed := range uint64(40) {
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
			x := indexed{kind: kindModel, rev: rng.Uint64(), updated: noTime, ended: noTime, expired: noTime,
				workflow: unique.Make(workflows[rng.IntN(len(workflows))]), status: unique.Make(statuses[rng.IntN(len(statuses))])}
			switch rng.IntN(20) {
			case 0:
				return indexed{kind: kindMarker, rev: x.rev, updated: nanos(clock)}
			case 1:
				x.kind = kindIgnored
			}
			text := rules[0]
			if rng.IntN(3) == 0 { // most share the system default; a rule change now and then
				text = rules[rng.IntN(len(rules))]
			}
			x.retention, x.retentionKey = unique.Make(text), unique.Make("") // as readIndexed makes every model's
			if rng.IntN(6) == 0 {
				x.retentionKey = unique.Make("shared")
			}
			if x.status.Value().Terminal() && rng.IntN(15) != 0 {
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
		for op := range 300 {
			clock = clock.Add(time.Duration(rng.IntN(90)) * time.Second)
			key := keys[rng.IntN(len(keys))]
			old, had := ix.entries[key]
			switch r := rng.IntN(40); {
			case r == 0: // a full read: made anew
				ix.ret.build(ix.entries)
			case r < 3 && had && old.kind == kindMarker: // an old marker purged
				delete(ix.entries, key)
			case r < 6 && had: // the same execution written again, in place
				x := old
				x.rev++
				ix.set(strings.Clone(key), old, true, x)
			case r < 8 && had && old.kind == kindModel: // its rule, or its group, changed in place
				x := old
				x.rev++
				if r == 6 {
					x.retention = unique.Make(rules[rng.IntN(len(rules))])
				} else {
					x.retentionKey = unique.Make([]string{"", "shared"}[rng.IntN(2)])
				}
				ix.set(strings.Clone(key), old, true, x)
			default:
				ix.set(strings.Clone(key), old, had, random())
			}
			now := clock.Add(time.Duration(rng.IntN(4*3600)) * time.Second)
			got := ix.ret.expired(now, ruleOf)
			want, expiring, total := sortAndRank(ix.entries, now, ruleOf)
			sortExpiries(got)
			sortExpiries(want)
			require.Equal(t, describe(want), describe(got), "seed %d, change %d: executions to expire", seed, op)
			require.ElementsMatch(t, expiring, mapKeys(ix.ret.expiring), "seed %d, change %d: executions whose expiry is recorded", seed, op)
			require.Equal(t, total, ix.ret.finished(), "seed %d, change %d: finished executions", seed, op)
			for name, g := range ix.ret.groups {
				require.Positive(t, g.live, "seed %d, change %d: group %s is empty and kept", seed, op, name)
				require.LessOrEqual(t, g.head+g.gone, max(g.live, 16), "seed %d, change %d: group %s keeps its gone members", seed, op, name)
			}
		}
	}
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
// the groups in order (sort-every-group), and now (kept-in-order); and
// now with a thousand finished and a thousand deleted since the sweep
// before (turnover: what the index's changes cost too).
func BenchmarkRetentionDecision(b *testing.B) {
	const n = 100_000
	now := time.Date(2026, 12, 4, 6, 0, 0, 0, time.UTC)
	rule, err := retention.ParseRule("7d")
	require.NoError(b, err)
	ruleOf := func(string) (retention.Rule, bool) { return rule, true }
	model := func(i int) indexed {
		return indexed{kind: kindModel, rev: uint64(i), updated: noTime, expired: noTime,
			ended:    nanos(now.Add(-24 * time.Hour).Add(time.Duration(i) * time.Second)),
			workflow: unique.Make("orders"), status: unique.Make(projections.StatusSucceeded),
			retention: unique.Make("7d"), retentionKey: unique.Make("")}
	}
	key := func(i int) string { return fmt.Sprintf("exec-%09d", i) }
	ix := modelIndex{entries: map[string]indexed{}, ret: newRetained()}
	for i := range n {
		ix.entries[key(i)] = model(i)
	}
	ix.ret.build(ix.entries)
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
			if got := ix.ret.expired(now, ruleOf); len(got) != 0 {
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
			if got := ix.ret.expired(now.Add(time.Duration(next-n)*time.Second), ruleOf); len(got) != 0 {
				b.Fatal(len(got))
			}
		}
	})
}
