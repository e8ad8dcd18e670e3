package janitor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/janitor/janitor"
)

// retentionBundle is a janitor with a clock the test moves, on a real
// JetStream server, with histories, read models and claims as the
// dispatcher and the projector write them.
type retentionBundle struct {
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	ids     *claim.Store
	now     time.Time
	reg     *prometheus.Registry
	janitor *janitor.Janitor
}

func setupRetention(t *testing.T, systemDefault string) *retentionBundle {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	b := &retentionBundle{js: js, now: now, reg: prometheus.NewRegistry()}
	var err error
	b.kv, err = js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	b.ids, err = claim.Open(t.Context(), js)
	require.NoError(t, err)
	b.janitor, err = janitor.New(janitor.Config{IdleAfter: idleAfter, Now: func() time.Time { return b.now },
		RetentionDefault: systemDefault, Registerer: b.reg}, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	return b
}

// run is one execution to store: its workflow, how it ended (or that it
// did not), when, and the retention its events record.
type run struct {
	wf, id string
	status projections.Status
	ended  time.Time
	// rule and key go in ExecutionStarted (nil: the workflow sets none).
	rule *events.Retention
	// step, if set, is recorded as a step scheduled with this retention.
	step *events.Retention
}

// store writes the execution's history, a result an agent reported for
// it, its id's claim and its read model (the fold of the history).
func (b *retentionBundle) store(t *testing.T, r run) projections.Execution {
	t.Helper()
	ctx := t.Context()
	started := r.ended.Add(-time.Minute)
	evs := []events.Event{events.New("test", r.id, r.wf, started, &events.ExecutionStarted{Workflow: r.wf, Version: 1,
		Steps: []events.StepRef{{ID: "mark", Kind: "workflow"}, {ID: "op", Kind: "noop"}}, Token: "t", CommandKey: "test#" + r.id, Retention: r.rule})}
	if r.step != nil {
		evs = append(evs, events.New("test", r.id, r.wf, started.Add(time.Second), &events.StepScheduled{StepID: "mark", Attempt: 1, Retention: r.step}))
	}
	switch r.status {
	case projections.StatusSucceeded:
		evs = append(evs, events.New("test", r.id, r.wf, r.ended, &events.ExecutionSucceeded{}))
	case projections.StatusFailed:
		evs = append(evs, events.New("test", r.id, r.wf, r.ended, &events.ExecutionFailed{Error: "boom"}))
	case projections.StatusCancelled:
		evs = append(evs, events.New("test", r.id, r.wf, r.ended, &events.ExecutionCancelled{ActionRecord: events.ActionRecord{Action: events.ActionForceCancel}}))
	case projections.StatusSuspended:
		evs = append(evs, events.New("test", r.id, r.wf, r.ended, &events.ExecutionSuspended{Error: "boom"}))
	case projections.StatusCancelling:
		evs = append(evs, events.New("test", r.id, r.wf, r.ended, &events.ExecutionCancelling{ActionRecord: events.ActionRecord{Action: events.ActionCancel}}))
	case projections.StatusStarted:
	default:
		t.Fatalf("status %s", r.status)
	}
	var x projections.Execution
	var last uint64
	for _, ev := range evs {
		ev.PrevSeq = last
		seq, err := history.Append(ctx, b.js, bus.ExecutionSubject(r.wf, r.id), last, ev)
		require.NoError(t, err)
		ev.Seq, last = seq, seq
		x, err = projections.Apply(x, ev)
		require.NoError(t, err)
	}
	require.Equal(t, r.status, x.Status)
	v, err := projections.EncodeStored(x, nil) // as the projector stores it (other tests store models as written before)
	require.NoError(t, err)
	_, err = b.kv.Put(ctx, r.id, v)
	require.NoError(t, err)
	_, err = b.ids.Claim(ctx, r.id, claim.Record{CommandKey: "test#" + r.id, Workflow: r.wf, ClaimedAt: started})
	require.NoError(t, err)
	res := events.New("agent", r.id, r.wf, started, &events.OperationSucceeded{TaskRef: events.TaskRef{TaskID: r.id + ".op.1", ExecutionID: r.id, Workflow: r.wf, StepID: "op", Attempt: 1, Queue: "default"}})
	msg, err := bus.Encode(bus.ResultSubject("default", r.id), res)
	require.NoError(t, err)
	_, err = b.js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	return x
}

// finished stores n succeeded executions of wf, ended one minute apart,
// the last (id wf-n) ending at end; rule as in run.
func (b *retentionBundle) finished(t *testing.T, wf string, n int, end time.Time, rule *events.Retention) {
	t.Helper()
	for i := 1; i <= n; i++ {
		b.store(t, run{wf: wf, id: fmt.Sprintf("%s-%d", wf, i), status: projections.StatusSucceeded,
			ended: end.Add(-time.Duration(n-i) * time.Minute), rule: rule})
	}
}

// sweep runs the two steps of an expiry: a sweep that asks the
// dispatcher to record the expiries, the dispatcher's part (recordExpiries)
// and the sweep that deletes. It returns what the two sweeps did, summed.
func (b *retentionBundle) sweep(t *testing.T) janitor.Result {
	t.Helper()
	res, err := b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	if res.ExpiryRequested == 0 {
		return res
	}
	b.recordExpiries(t)
	again, err := b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	require.Zero(t, again.ExpiryRequested, "everything asked for was recorded")
	res.Expired += again.Expired
	res.Errors += again.Errors
	return res
}

// recordExpiries does the dispatcher's part of the expire commands the
// janitor published, as the dispatcher does it (its own tests cover it):
// execution.expired is appended only if the history still ends at the
// sequence the command names. It returns how many it recorded.
func (b *retentionBundle) recordExpiries(t *testing.T) int {
	t.Helper()
	cmds, err := history.ReadStream(t.Context(), b.js, bus.StreamCommands, bus.SubjectExpire, 0, 0)
	require.NoError(t, err)
	recorded := 0
	for _, c := range cmds {
		p := c.Data.(*events.ExpireExecution)
		require.Equal(t, "jetflow/janitor", c.Source)
		ev := events.New("test-dispatcher", p.ExecutionID, p.Workflow, b.now, &events.ExecutionExpired{Rule: p.Rule, Group: p.Group, RequestedBy: c.Source})
		ev.PrevSeq = p.LastSeq
		_, err := history.Append(t.Context(), b.js, bus.ExecutionSubject(p.Workflow, p.ExecutionID), p.LastSeq, ev)
		if errors.Is(err, bus.ErrConflict) {
			continue // the history moved on (or this was recorded already)
		}
		require.NoError(t, err)
		recorded++
	}
	return recorded
}

// kept lists the executions that have a read model, sorted.
func (b *retentionBundle) kept(t *testing.T) []string {
	t.Helper()
	keys, err := b.kv.Keys(t.Context())
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil
	}
	require.NoError(t, err)
	slices.Sort(keys)
	return keys
}

// requireGone checks that nothing of an expired execution is left but its
// claim, marked expired.
func (b *retentionBundle) requireGone(t *testing.T, wf, id string) {
	t.Helper()
	evs, err := history.Read(t.Context(), b.js, bus.ExecutionSubject(wf, id), 0)
	require.NoError(t, err)
	require.Empty(t, evs, "history of %s", id)
	results, err := history.ReadStream(t.Context(), b.js, bus.StreamResults, bus.ExecutionResults(id), 0, 0)
	require.NoError(t, err)
	require.Empty(t, results, "results of %s", id)
	_, err = b.kv.Get(t.Context(), id)
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "read model of %s", id)
	c, err := b.ids.Get(t.Context(), id)
	require.NoError(t, err, "the claim of %s is kept: ids are unique forever", id)
	require.Equal(t, "test#"+id, c.CommandKey)
	require.True(t, c.ExpiredAt.Equal(b.now), "claim of %s marked expired at the sweep's time, got %s", id, c.ExpiredAt)
}

// requireIntact checks that a kept execution still has its history and
// read model, and an unmarked claim.
func (b *retentionBundle) requireIntact(t *testing.T, wf, id string) {
	t.Helper()
	evs, err := history.Read(t.Context(), b.js, bus.ExecutionSubject(wf, id), 0)
	require.NoError(t, err)
	require.NotEmpty(t, evs, "history of %s", id)
	_, err = b.kv.Get(t.Context(), id)
	require.NoError(t, err, "read model of %s", id)
	c, err := b.ids.Get(t.Context(), id)
	require.NoError(t, err)
	require.False(t, c.Expired(), "claim of %s marked expired", id)
}

func rule(r string) *events.Retention { return &events.Retention{Rule: r} }

func ids(wf string, from, to int) []string {
	var out []string
	for i := from; i <= to; i++ {
		out = append(out, fmt.Sprintf("%s-%d", wf, i))
	}
	return out
}

func TestRetentionCount(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	b.finished(t, "wf", 5, now.Add(-time.Hour), rule("2"))

	res := b.sweep(t)
	require.Equal(t, 5, res.Finished)
	require.Equal(t, 3, res.Expired)
	require.Zero(t, res.Errors)
	require.Positive(t, res.IdleTook)
	require.Positive(t, res.RetentionTook)
	require.Equal(t, ids("wf", 4, 5), b.kept(t), "the two most recent are kept")
	for _, id := range ids("wf", 1, 3) {
		b.requireGone(t, "wf", id)
	}
	b.requireIntact(t, "wf", "wf-4")
	b.requireIntact(t, "wf", "wf-5")
	require.Equal(t, 3.0, b.purged(t, "wf"))

	// Idempotent: the next sweep finds nothing more to do.
	res = b.sweep(t)
	require.Equal(t, 2, res.Finished)
	require.Zero(t, res.Expired)
	require.Equal(t, ids("wf", 4, 5), b.kept(t))
}

// purged reads the purged counter of workflow wf back from the registry.
func (b *retentionBundle) purged(t *testing.T, wf string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "jetflow_janitor_executions_purged_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "workflow" && l.GetValue() == wf {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestRetentionDuration(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	b.store(t, run{wf: "wf", id: "recent", status: projections.StatusSucceeded, ended: now.Add(-30 * time.Minute), rule: rule("1h")})
	b.store(t, run{wf: "wf", id: "old", status: projections.StatusFailed, ended: now.Add(-61 * time.Minute), rule: rule("1h")})
	b.store(t, run{wf: "wf", id: "days", status: projections.StatusCancelled, ended: now.Add(-6 * 24 * time.Hour), rule: rule("7d")})

	require.Equal(t, 1, b.sweep(t).Expired)
	require.Equal(t, []string{"days", "recent"}, b.kept(t))
	b.requireGone(t, "wf", "old")

	b.now = now.Add(31 * time.Minute) // recent is now more than an hour old
	require.Equal(t, 1, b.sweep(t).Expired)
	require.Equal(t, []string{"days"}, b.kept(t))
	b.now = now.Add(24 * time.Hour)
	require.Equal(t, 1, b.sweep(t).Expired)
	require.Empty(t, b.kept(t))
}

func TestRetentionForever(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	b.finished(t, "wf", 6, now.Add(-1000*time.Hour), rule("forever"))
	require.Zero(t, b.sweep(t).Expired)
	require.Len(t, b.kept(t), 6)
}

// TestRetentionSystemDefault: executions whose workflow sets no rule, or
// says system or parent, get the configured default; max(3, 7d) unless
// set: the three most recent of each group, and all of the last week.
func TestRetentionSystemDefault(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	lastMonth := now.Add(-30 * 24 * time.Hour)
	b.finished(t, "plain", 5, lastMonth, nil)
	b.finished(t, "sys", 4, lastMonth, rule("system"))
	b.finished(t, "par", 4, lastMonth, rule("parent"))
	b.finished(t, "recent", 5, now.Add(-6*24*time.Hour), nil)
	require.Equal(t, 2+1+1, b.sweep(t).Expired)
	kept := b.kept(t)
	require.Equal(t, append(append(append(ids("par", 2, 4), ids("plain", 3, 5)...), ids("recent", 1, 5)...), ids("sys", 2, 4)...), kept)

	configured := setupRetention(t, "1")
	configured.finished(t, "plain", 3, now, nil)
	require.Equal(t, 2, configured.sweep(t).Expired)
	require.Equal(t, []string{"plain-3"}, configured.kept(t))
}

// TestRetentionContext: a workflow's max(context, 6h) is recorded as
// max(parent, 6h) (see the dispatcher): the system default's count, and
// everything that finished in the last six hours.
func TestRetentionContext(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "2")
	for i, age := range []time.Duration{9 * time.Hour, 8 * time.Hour, 7 * time.Hour, 5 * time.Hour, 4 * time.Hour, 3 * time.Hour} {
		b.store(t, run{wf: "wf", id: fmt.Sprintf("wf-%d", i+1), status: projections.StatusSucceeded, ended: now.Add(-age), rule: rule("max(parent, 6h)")})
	}
	require.Equal(t, 3, b.sweep(t).Expired)
	require.Equal(t, ids("wf", 4, 6), b.kept(t), "the three of the last six hours; the two most recent are among them")
}

// TestRetentionMinMax runs the seed's examples: min(2, 3, 1h, 2h) keeps
// the two most recent only while they are less than an hour old;
// max(2, 3, 1h, 2h) keeps the three most recent, and all for two hours.
func TestRetentionMinMax(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	ages := []time.Duration{5 * time.Hour, 4 * time.Hour, 90 * time.Minute, 80 * time.Minute, 70 * time.Minute, 50 * time.Minute, 10 * time.Minute}
	for _, wf := range []string{"lo", "hi"} {
		r := map[string]string{"lo": "min(2, 3, 1h, 2h)", "hi": "max(2, 3, 1h, 2h)"}[wf]
		for i, age := range ages {
			b.store(t, run{wf: wf, id: fmt.Sprintf("%s-%d", wf, i+1), status: projections.StatusSucceeded, ended: now.Add(-age), rule: rule(r)})
		}
	}
	b.sweep(t)
	// hi: the three most recent (5..7), and 3..4 (less than two hours old).
	// lo: only 6 and 7 (the two most recent, both less than an hour old).
	require.Equal(t, append(ids("hi", 3, 7), ids("lo", 6, 7)...), b.kept(t))
}

func TestRetentionDisabled(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	b.store(t, run{wf: "wf", id: "quiet", status: projections.StatusSucceeded, ended: now, rule: rule("disabled")})
	b.store(t, run{wf: "wf", id: "busy", status: projections.StatusStarted, ended: now, rule: rule("disabled")})
	require.Equal(t, 1, b.sweep(t).Expired, "expired as soon as it finished, even as the only one")
	b.requireGone(t, "wf", "quiet")
	require.Equal(t, []string{"busy"}, b.kept(t))
}

// TestRetentionHashGroupsWorkflows: start, stop and restart share the
// group start-stop, so two executions are kept across the three; another
// workflow keeps its own count.
func TestRetentionHashGroupsWorkflows(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	grouped := &events.Retention{Rule: "2", Key: "start-stop"}
	b.store(t, run{wf: "start", id: "s1", status: projections.StatusSucceeded, ended: now.Add(-5 * time.Minute), rule: grouped})
	b.store(t, run{wf: "stop", id: "p1", status: projections.StatusSucceeded, ended: now.Add(-4 * time.Minute), rule: grouped})
	b.store(t, run{wf: "restart", id: "r1", status: projections.StatusFailed, ended: now.Add(-3 * time.Minute), rule: grouped})
	b.store(t, run{wf: "start", id: "s2", status: projections.StatusSucceeded, ended: now.Add(-2 * time.Minute), rule: grouped})
	b.finished(t, "other", 2, now.Add(-time.Hour), rule("2"))

	require.Equal(t, 2, b.sweep(t).Expired)
	require.Equal(t, []string{"other-1", "other-2", "r1", "s2"}, b.kept(t))
	b.requireGone(t, "start", "s1")
	b.requireGone(t, "stop", "p1")
	require.Equal(t, 1.0, b.purged(t, "stop"))
}

// TestRetentionStepChange: a step's retention (forever, in group "<name>
// failed") recorded in the history overrides the workflow's rule and
// group; the others of the workflow keep theirs.
func TestRetentionStepChange(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	b.store(t, run{wf: "prov", id: "kept-failure", status: projections.StatusFailed, ended: now.Add(-100 * time.Hour),
		rule: rule("1"), step: &events.Retention{Rule: "forever", Key: "prov failed"}})
	x := b.store(t, run{wf: "prov", id: "short", status: projections.StatusSucceeded, ended: now.Add(-50 * time.Hour),
		rule: rule("1"), step: &events.Retention{Rule: "1h"}})
	require.Equal(t, "1h", x.Retention)
	b.finished(t, "prov", 2, now.Add(-time.Minute), rule("1"))

	require.Equal(t, 2, b.sweep(t).Expired)
	require.Equal(t, []string{"kept-failure", "prov-2"}, b.kept(t))
	b.requireGone(t, "prov", "short")
	b.requireGone(t, "prov", "prov-1")
}

// TestRetentionNeverTouchesRunning: started, cancelling and suspended
// executions are never expired, however old and whatever their rule, and
// they do not count against a group's limit.
func TestRetentionNeverTouchesRunning(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	old := now.Add(-1000 * time.Hour)
	for _, st := range []projections.Status{projections.StatusStarted, projections.StatusCancelling, projections.StatusSuspended} {
		b.store(t, run{wf: "wf", id: string(st), status: st, ended: old, rule: rule("disabled")})
	}
	b.store(t, run{wf: "wf", id: "done", status: projections.StatusSucceeded, ended: old, rule: rule("1")})
	require.Zero(t, b.sweep(t).Expired)
	require.Equal(t, []string{"cancelling", "done", "started", "suspended"}, b.kept(t))
	for _, id := range []string{"started", "cancelling", "suspended", "done"} {
		b.requireIntact(t, "wf", id)
	}
}

// TestRetentionRepairsHalfDone: a sweep that stopped after purging the
// history (before deleting the read model) is finished by the next one.
func TestRetentionRepairsHalfDone(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	b.store(t, run{wf: "wf", id: "half", status: projections.StatusSucceeded, ended: now, rule: rule("disabled")})
	stream, err := b.js.Stream(t.Context(), bus.StreamEvents)
	require.NoError(t, err)
	require.NoError(t, stream.Purge(t.Context(), jetstream.WithPurgeSubject(bus.ExecutionSubject("wf", "half"))))

	require.Equal(t, 1, b.sweep(t).Expired)
	b.requireGone(t, "wf", "half")
}

// TestRetentionWaitsForReadModel: when the history has gone on past the
// read model (a resume the projector has not written yet), nothing is
// deleted; the next sweep decides on the newer read model.
func TestRetentionWaitsForReadModel(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	x := b.store(t, run{wf: "wf", id: "resumed", status: projections.StatusFailed, ended: now, rule: rule("disabled")})
	ev := events.New("test", "resumed", "wf", now, &events.ExecutionResumed{ActionRecord: events.ActionRecord{Action: events.ActionResume}, Token: "t2"})
	ev.PrevSeq = x.LastSeq
	_, err := history.Append(t.Context(), b.js, bus.ExecutionSubject("wf", "resumed"), x.LastSeq, ev)
	require.NoError(t, err)

	res := b.sweep(t)
	require.Zero(t, res.Expired)
	require.Zero(t, res.Errors)
	b.requireIntact(t, "wf", "resumed")
}

func TestRetentionBadDefault(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	for _, bad := range []string{"system", "max(parent, 3)", "context", "sometimes", "3 hash x"} {
		_, err := janitor.New(janitor.Config{RetentionDefault: bad}, js, zerolog.Nop())
		require.Error(t, err, bad)
		require.True(t, strings.Contains(err.Error(), "RetentionDefault"), err.Error())
	}
}

// TestRetentionManySweptAtOnce: a sweep that deletes more executions than
// the read-model watcher buffers (256) ends without leaving the watcher's
// goroutine blocked (TestMain checks for leaks).
func TestRetentionManySweptAtOnce(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	b.finished(t, "bulk", 300, now, rule("0"))
	require.Equal(t, 300, b.sweep(t).Expired)
	require.Empty(t, b.kept(t))
	require.Equal(t, 300.0, b.purged(t, "bulk"))
}

// expireCommands reads the expire commands the janitor published.
func (b *retentionBundle) expireCommands(t *testing.T) []*events.ExpireExecution {
	t.Helper()
	cmds, err := history.ReadStream(t.Context(), b.js, bus.StreamCommands, bus.SubjectExpire, 0, 0)
	require.NoError(t, err)
	out := make([]*events.ExpireExecution, len(cmds))
	for i, c := range cmds {
		out[i] = c.Data.(*events.ExpireExecution)
	}
	return out
}

// TestRetentionAsksTheDispatcherFirst: the janitor deletes nothing until
// the history ends with execution.expired; it asks the dispatcher to
// record it, once per history position however many sweeps pass.
func TestRetentionAsksTheDispatcherFirst(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	b.finished(t, "wf", 3, now.Add(-time.Hour), &events.Retention{Rule: "1", Key: "grp"})
	x := b.store(t, run{wf: "wf", id: "wf-9", status: projections.StatusFailed, ended: now.Add(-2 * time.Hour), rule: &events.Retention{Rule: "1", Key: "grp"}})

	for range 2 {
		res, err := b.janitor.RunOnce(t.Context())
		require.NoError(t, err)
		require.Equal(t, 3, res.ExpiryRequested)
		require.Zero(t, res.Expired)
	}
	cmds := b.expireCommands(t)
	require.Len(t, cmds, 3, "asked once per execution, however many sweeps")
	slices.SortFunc(cmds, func(a, c *events.ExpireExecution) int { return strings.Compare(a.ExecutionID, c.ExecutionID) })
	require.Equal(t, &events.ExpireExecution{ExecutionID: "wf-9", Workflow: "wf", LastSeq: x.LastSeq, Rule: "1", Group: "grp"}, cmds[2])
	require.Equal(t, []string{"wf-1", "wf-2", "wf-3", "wf-9"}, b.kept(t))
	for _, id := range []string{"wf-1", "wf-2", "wf-3", "wf-9"} {
		b.requireIntact(t, "wf", id)
	}

	require.Equal(t, 3, b.recordExpiries(t))
	res, err := b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 3, res.Expired)
	require.Equal(t, []string{"wf-3"}, b.kept(t))
	for _, id := range []string{"wf-1", "wf-2", "wf-9"} {
		b.requireGone(t, "wf", id)
	}
}

// TestRetentionKeepsAResumeThatCameFirst: an operator resumes a failed
// execution after the janitor asked for its expiry but before the
// dispatcher recorded it. The dispatcher refuses the expiry (the history
// moved), and the janitor never deletes the resumed execution.
func TestRetentionKeepsAResumeThatCameFirst(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	x := b.store(t, run{wf: "wf", id: "resumed", status: projections.StatusFailed, ended: now, rule: rule("disabled")})
	res, err := b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, res.ExpiryRequested)

	ev := events.New("test", "resumed", "wf", now, &events.ExecutionResumed{ActionRecord: events.ActionRecord{Action: events.ActionResume}, Token: "t2"})
	ev.PrevSeq = x.LastSeq
	_, err = history.Append(t.Context(), b.js, bus.ExecutionSubject("wf", "resumed"), x.LastSeq, ev)
	require.NoError(t, err)

	require.Zero(t, b.recordExpiries(t), "the history moved on: not recorded")
	for range 2 {
		res, err := b.janitor.RunOnce(t.Context())
		require.NoError(t, err)
		require.Zero(t, res.Expired)
		require.Zero(t, res.ExpiryRequested, "the read model is behind the history: decided again later")
	}
	b.requireIntact(t, "wf", "resumed")
	require.Len(t, b.expireCommands(t), 1)
}

// TestRetentionKeepsDamaged: a damaged execution is never expired,
// whatever its status and rule: its history is what an admin repairs
// from. It does not count against its group either: under a rule that
// keeps one, the newer damaged execution does not push the older one out.
func TestRetentionKeepsDamaged(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	x := b.store(t, run{wf: "wf", id: "damaged", status: projections.StatusSucceeded, ended: now.Add(-time.Hour), rule: rule("1")})
	x.Damaged = &projections.Damage{Seq: x.LastSeq + 1, Reason: "not a CloudEvent"}
	v, err := json.Marshal(x)
	require.NoError(t, err)
	_, err = b.kv.Put(t.Context(), "damaged", v)
	require.NoError(t, err)
	b.store(t, run{wf: "wf", id: "done", status: projections.StatusSucceeded, ended: now.Add(-2 * time.Hour), rule: rule("1")})

	res := b.sweep(t)
	require.Zero(t, res.Expired)
	require.Equal(t, 1, res.Finished, "only the undamaged one is counted")
	require.Equal(t, []string{"damaged", "done"}, b.kept(t))
	b.requireIntact(t, "wf", "damaged")
	b.requireIntact(t, "wf", "done")

	b.store(t, run{wf: "wf", id: "newer", status: projections.StatusSucceeded, ended: now.Add(-time.Minute), rule: rule("1")})
	require.Equal(t, 1, b.sweep(t).Expired, "done goes once a newer undamaged one ends")
	require.Equal(t, []string{"damaged", "newer"}, b.kept(t))
}

// TestTheClaimSaysWhenTheExecutionExpired: the deleted execution's claim
// (what a start, a query or an action for its id is answered with: 410,
// "expired at ...") carries the time its expiry was recorded, not the
// time of the sweep that deleted it, which `jetflow show` printed before
// the deletion.
func TestTheClaimSaysWhenTheExecutionExpired(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "forever")
	x := b.store(t, run{wf: "w", id: "w-1", status: projections.StatusSucceeded, ended: b.now.Add(-time.Hour)})
	expiredAt := b.now.Add(-10 * time.Minute)
	ev := events.New("test-dispatcher", x.ID, x.Workflow, expiredAt, &events.ExecutionExpired{Rule: "1h", Group: "w", RequestedBy: "jetflow/janitor"})
	ev.PrevSeq = x.LastSeq
	seq, err := history.Append(t.Context(), b.js, bus.ExecutionSubject(x.Workflow, x.ID), x.LastSeq, ev)
	require.NoError(t, err)
	ev.Seq = seq
	x, err = projections.Apply(x, ev)
	require.NoError(t, err)
	require.True(t, x.ExpiredAt.Equal(expiredAt), "the read model has the expiry's time")
	v, err := json.Marshal(x)
	require.NoError(t, err)
	_, err = b.kv.Put(t.Context(), x.ID, v)
	require.NoError(t, err)

	res, err := b.janitor.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, res.Expired)
	c, err := b.ids.Get(t.Context(), x.ID)
	require.NoError(t, err)
	require.True(t, c.ExpiredAt.Equal(expiredAt), "claim marked expired at %s, want %s", c.ExpiredAt, expiredAt)
}

// TestSweepsAreCountedAndTimed: every sweep is counted by outcome and
// timed, a sweep with nothing to do too, and the time of the last one
// that ended well is kept: a failed sweep leaves it as it was.
func TestSweepsAreCountedAndTimed(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	require.Zero(t, b.metric(t, "jetflow_janitor_sweeps_total", "ok"), "both series exist before the first sweep")
	require.Zero(t, b.metric(t, "jetflow_janitor_sweeps_total", "failed"))
	require.Zero(t, b.metric(t, "jetflow_janitor_last_sweep_timestamp_seconds", ""))

	before := time.Now()
	res := b.sweep(t)
	require.Zero(t, res.Checked+res.Finished+res.Expired, "nothing to do")
	require.Equal(t, 1.0, b.metric(t, "jetflow_janitor_sweeps_total", "ok"))
	require.Equal(t, 1.0, b.metric(t, "jetflow_janitor_sweep_seconds", ""), "one sweep timed")
	last := b.metric(t, "jetflow_janitor_last_sweep_timestamp_seconds", "")
	require.GreaterOrEqual(t, last, float64(before.UnixNano())/1e9)
	require.LessOrEqual(t, last, float64(time.Now().UnixNano())/1e9)

	// A sweep cut short by a stop is not counted: a rolling restart is no
	// failure.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := b.janitor.RunOnce(ctx)
	require.Error(t, err)
	require.Zero(t, b.metric(t, "jetflow_janitor_sweeps_total", "failed"))
	require.Equal(t, 1.0, b.metric(t, "jetflow_janitor_sweep_seconds", ""))

	// A sweep that cannot read the read models fails.
	require.NoError(t, b.js.DeleteKeyValue(t.Context(), bus.BucketExecutions))
	_, err = b.janitor.RunOnce(t.Context())
	require.Error(t, err, "no executions bucket")
	require.Equal(t, 1.0, b.metric(t, "jetflow_janitor_sweeps_total", "failed"))
	require.Equal(t, 1.0, b.metric(t, "jetflow_janitor_sweeps_total", "ok"))
	require.Equal(t, 2.0, b.metric(t, "jetflow_janitor_sweep_seconds", ""), "the failed one is timed too")
	require.Equal(t, last, b.metric(t, "jetflow_janitor_last_sweep_timestamp_seconds", ""), "the last sweep that ended well")
}

// TestASweepStoppedInItsIdlePartIsNotCounted: a stop that comes while a
// sweep nudges idle executions ends the sweep there: it is neither a
// sweep that ended well nor a failed one, and the publishes the stop
// cut short are no errors (a rolling restart is no fault).
func TestASweepStoppedInItsIdlePartIsNotCounted(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	for _, id := range []string{"a", "b", "c"} {
		v, err := json.Marshal(projections.Execution{ID: id, Workflow: "wf", Version: 1, Status: projections.StatusStarted,
			Steps: []projections.Step{{ID: "ship", Kind: "noop"}}, StartedAt: now.Add(-time.Hour), UpdatedAt: now.Add(-2 * idleAfter), LastSeq: 5})
		require.NoError(t, err)
		_, err = kv.Put(t.Context(), id, v)
		require.NoError(t, err)
	}
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var calls atomic.Int32
	clock := func() time.Time {
		if calls.Add(1) == 2 { // the sweep's own time, then the first nudge's: the stop comes
			stop()
		}
		return now
	}
	reg := prometheus.NewRegistry()
	j, err := janitor.New(janitor.Config{IdleAfter: idleAfter, Now: clock, Registerer: reg}, js, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	b := &retentionBundle{reg: reg}

	res, err := j.RunOnce(ctx)
	require.ErrorIs(t, err, context.Canceled, "%+v", res)
	require.LessOrEqual(t, res.Checked, 1, "it stopped at the first")
	require.Zero(t, b.metric(t, "jetflow_janitor_sweeps_total", "ok"))
	require.Zero(t, b.metric(t, "jetflow_janitor_sweeps_total", "failed"))
	require.Zero(t, b.metric(t, "jetflow_janitor_sweep_errors_total", ""))
	require.Zero(t, b.metric(t, "jetflow_janitor_idle_executions", ""))
}

// TestWhatSweepsDoIsCounted: the idle executions the last sweep looked
// at, the reconciles it published and the tasks it failed are metrics,
// so that a janitor that looks and finds nothing to do shows it looked.
func TestWhatSweepsDoIsCounted(t *testing.T) {
	t.Parallel()
	b := setupRetention(t, "")
	put := func(x projections.Execution) {
		t.Helper()
		v, err := json.Marshal(x)
		require.NoError(t, err)
		_, err = b.kv.Put(t.Context(), x.ID, v)
		require.NoError(t, err)
	}
	idle := func(id string) projections.Execution {
		return projections.Execution{ID: id, Workflow: "wf", Version: 1, Status: projections.StatusStarted, Token: "tok",
			Steps:     []projections.Step{{ID: "ship", Kind: "noop"}},
			StartedAt: now.Add(-time.Hour), UpdatedAt: now.Add(-2 * idleAfter), LastSeq: 5}
	}
	put(idle("stuck")) // nothing in flight: nudged
	sleeping := idle("sleeping")
	sleeping.Steps[0] = projections.Step{ID: "ship", Kind: "wait", Status: projections.OpWaiting, Attempt: 1}
	put(sleeping)
	lost := idle("lost")
	taskID := events.TaskID("lost", "ship", 1)
	ev := events.New("test", "lost", "wf", now, &events.Task{TaskID: taskID, ExecutionID: "lost", Workflow: "wf", StepID: "ship", Attempt: 1, Kind: "noop", Queue: "default"})
	msg, err := bus.Encode(bus.TaskSubject("default"), ev)
	require.NoError(t, err)
	ack, err := b.js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
	tasks, err := b.js.Stream(t.Context(), bus.StreamTasks)
	require.NoError(t, err)
	require.NoError(t, tasks.DeleteMsg(t.Context(), ack.Sequence)) // taken, and no result came
	lost.Steps[0] = projections.Step{ID: "ship", Kind: "noop", Status: projections.OpStarted, Attempt: 1, TaskID: taskID, TaskSeq: ack.Sequence, Queue: "default"}
	put(lost)

	for _, m := range []string{"jetflow_janitor_idle_executions", "jetflow_janitor_reconciles_total", "jetflow_janitor_sweep_errors_total"} {
		require.Zero(t, b.metric(t, m, ""), m)
	}
	res := b.sweep(t)
	res.IdleTook, res.RetentionTook = 0, 0
	require.Equal(t, janitor.Result{Checked: 3, Reconciled: 1, LostTasks: 1}, res)
	require.Equal(t, 3.0, b.metric(t, "jetflow_janitor_idle_executions", ""))
	require.Equal(t, 1.0, b.metric(t, "jetflow_janitor_reconciles_total", ""))
	require.Equal(t, 1.0, b.labeled(t, "jetflow_janitor_failed_tasks_total", "why", "vanished"))
	require.Zero(t, b.labeled(t, "jetflow_janitor_failed_tasks_total", "why", "lost"))
	require.Zero(t, b.metric(t, "jetflow_janitor_sweep_errors_total", ""))

	b.sweep(t) // the same again
	require.Equal(t, 3.0, b.metric(t, "jetflow_janitor_idle_executions", ""))
	require.Equal(t, 1.0, b.metric(t, "jetflow_janitor_reconciles_total", ""), "published again, and dropped by the stream as a repeat: not counted")
	require.Equal(t, 1.0, b.labeled(t, "jetflow_janitor_failed_tasks_total", "why", "vanished"), "its failure is in the results: not reported again")
}

// metric is the value of metric name (of its series whose outcome label
// is outcome, unless outcome is ""): a counter's or gauge's value, a
// histogram's count.
func (b *retentionBundle) metric(t *testing.T, name, outcome string) float64 {
	t.Helper()
	if outcome == "" {
		return b.labeled(t, name, "", "")
	}
	return b.labeled(t, name, "outcome", outcome)
}

// labeled is metric with the series whose label has value (any series
// when label is "").
func (b *retentionBundle) labeled(t *testing.T, name, label, value string) float64 {
	t.Helper()
	mfs, err := b.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label != "" && !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
				return l.GetName() == label && l.GetValue() == value
			}) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.GetCounter().GetValue()
			case m.Gauge != nil:
				return m.GetGauge().GetValue()
			case m.Histogram != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	t.Fatalf("no metric %s{%s=%q}", name, label, value)
	return 0
}
