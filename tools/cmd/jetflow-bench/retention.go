package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/janitor/janitor"
	"jetflow.dev/tools/internal/devstack"
)

// retentionWorkflow is the workflow of the retention run: one noop step
// (so that an agent reports results, which the janitor purges too: the
// run stores every report, none handed straight to the dispatcher) and a
// count rule, so that which executions expire depends only on the order
// in which they finished.
const retentionWorkflow = "bench-retention"

// endedExecution is one execution of the retention run as its read model
// shows it before the sweep.
type endedExecution struct {
	id      string
	endedAt time.Time
}

// runRetention runs n executions of a workflow whose rule keeps the keep
// most recent, waits for their read models, then times the sweeps of a
// janitor of its own. Expiry takes two steps: the first sweep asks the
// dispatcher to record the expiry of the n-keep that finished first;
// once it has, the second sweep deletes them; a third finds nothing to
// do. It then checks, execution by execution, that exactly those n-keep
// are gone and the others intact.
func runRetention(ctx context.Context, out io.Writer, conn *bus.Conn, store *catalog.Store, stack devstack.Info, n, keep, inflight int) error {
	def := workflow.Definition{Name: retentionWorkflow, Retention: workflow.Retention(strconv.Itoa(keep)), Steps: []workflow.Step{
		{ID: "op", Kind: workflow.KindNoop},
	}}
	if _, _, err := store.Apply(ctx, def); err != nil {
		return err
	}
	tr := newTracker(conn.NC, retentionWorkflow)
	defer tr.close()
	prefix := batchPrefix("retention")
	began := time.Now()
	if _, err := tr.runBatch(ctx, conn, prefix, n, inflight); err != nil {
		return fmt.Errorf("retention run: %w", err)
	}
	ran := time.Since(began)
	kv, err := conn.JS.KeyValue(ctx, bus.BucketExecutions)
	if err != nil {
		return err
	}
	ended, others, err := waitReadModels(ctx, kv, prefix, n, n, func(m modelStatus) bool { return m.finished() })
	if err != nil {
		return fmt.Errorf("retention run: finished read models: %w", err)
	}
	projected := time.Since(began)
	finished := n + others // what the janitor reads: every finished read model
	ours := make([]endedExecution, 0, n)
	for id, m := range ended {
		ours = append(ours, endedExecution{id, m.EndedAt})
	}

	// The janitor measured: one like the service's (its own connection,
	// its metrics counted, an info log written), whose system default keeps
	// what the earlier runs left, so that it deletes only executions of the
	// retention run.
	jc, err := stack.Dial(ctx, auth.RoleJanitor, "jetflow-bench-janitor")
	if err != nil {
		return err
	}
	defer jc.NC.Close()
	j, err := janitor.New(janitor.Config{RetentionDefault: "forever", BindOnly: stack.CredsDir != ""}, jc.JS,
		zerolog.New(io.Discard).Level(zerolog.InfoLevel).With().Timestamp().Logger())
	if err != nil {
		return err
	}
	rec, err := newExpiryTracker(conn, prefix)
	if err != nil {
		return err
	}
	defer rec.close()
	sweep := func(name string) (janitor.Result, time.Duration, error) {
		t0 := time.Now()
		res, err := j.RunOnce(ctx)
		if err != nil {
			return res, 0, fmt.Errorf("retention run: %s: %w", name, err)
		}
		return res, time.Since(t0), nil
	}
	deleted := n - keep
	asked := time.Now()
	first, d1, err := sweep("first sweep")
	if err != nil {
		return err
	}
	// The dispatcher records the expiries the sweep asked for, and the
	// projector writes them; in production the next sweep comes an
	// interval later (30 s by default).
	_, _, err = waitReadModels(ctx, kv, prefix, n, deleted, func(m modelStatus) bool { return !m.ExpiredAt.IsZero() })
	if err != nil {
		return fmt.Errorf("retention run: expiries recorded: %w", err)
	}
	expiredIn := time.Since(asked)
	recorded, lastRecorded := rec.wait(deleted, 5*time.Second)
	second, d2, err := sweep("second sweep")
	if err != nil {
		return err
	}
	third, d3, err := sweep("third sweep")
	if err != nil {
		return err
	}

	fmt.Fprintf(out, "\nretention run: %d finished executions of a one-noop-step workflow with retention: %d (%d to delete)\n", n, keep, deleted)
	fmt.Fprintf(out, "  created          %d in %s (%.0f executions/s, %d in flight), read models caught up after %s\n",
		n, ran.Round(time.Millisecond), float64(n)/ran.Seconds(), inflight, projected.Round(time.Millisecond))
	printSweep(out, "first sweep", first, d1)
	if deleted > 0 {
		took := lastRecorded.Sub(asked)
		fmt.Fprintf(out, "  expiries         %d recorded by the dispatcher %s after the first sweep began (%.0f/s), all projected after %s\n",
			recorded, took.Round(time.Millisecond), float64(recorded)/took.Seconds(), expiredIn.Round(time.Millisecond))
	}
	printSweep(out, "second sweep", second, d2)
	printSweep(out, "third sweep", third, d3)

	// A benchmark that cannot tell a wrong result is no benchmark.
	var wrong []string
	for _, c := range []struct {
		name                     string
		res                      janitor.Result
		finished, asked, deleted int
	}{
		{"first sweep", first, finished, deleted, 0},
		{"second sweep", second, finished, 0, deleted},
		{"third sweep", third, finished - deleted, 0, 0},
	} {
		if c.res.Finished != c.finished || c.res.ExpiryRequested != c.asked || c.res.Expired != c.deleted || c.res.Errors != 0 {
			wrong = append(wrong, fmt.Sprintf("%s read %d finished executions, asked for %d expiries, deleted %d, with %d errors; want %d, %d, %d and 0",
				c.name, c.res.Finished, c.res.ExpiryRequested, c.res.Expired, c.res.Errors, c.finished, c.asked, c.deleted))
		}
	}
	if recorded != deleted {
		wrong = append(wrong, fmt.Sprintf("the dispatcher recorded %d expiries, want %d", recorded, deleted))
	}
	problems, err := checkRetained(ctx, conn.JS, kv, ours, keep)
	if err != nil {
		return fmt.Errorf("retention run: check: %w", err)
	}
	if wrong = append(wrong, problems...); len(wrong) > 0 {
		if len(wrong) > 10 {
			wrong = append(wrong[:10], fmt.Sprintf("and %d more", len(wrong)-10))
		}
		return fmt.Errorf("retention run: wrong result:\n  %s", strings.Join(wrong, "\n  "))
	}
	fmt.Fprintf(out, "  checked          the %d that finished first: history, results and read model gone, id claim marked expired;\n", deleted)
	fmt.Fprintf(out, "                   the %d most recent: history, results, read model (not expired) and claim intact\n", keep)
	return nil
}

// printSweep prints what a sweep did and how long it took, in all and in
// its two parts: the idle sweep (and locks), which looks at every read
// model, then retention.
func printSweep(out io.Writer, name string, res janitor.Result, d time.Duration) {
	fmt.Fprintf(out, "  %-16s %d finished read", name, res.Finished)
	switch {
	case res.ExpiryRequested > 0:
		fmt.Fprintf(out, ", %d expiries asked in %s (%.0f/s)", res.ExpiryRequested, d.Round(time.Millisecond), float64(res.ExpiryRequested)/d.Seconds())
	case res.Expired > 0:
		fmt.Fprintf(out, ", %d deleted in %s (%.0f deletions/s)", res.Expired, d.Round(time.Millisecond), float64(res.Expired)/d.Seconds())
	default:
		fmt.Fprintf(out, ", nothing to do, in %s", d.Round(time.Millisecond))
	}
	fmt.Fprintf(out, "\n  %-16s idle executions %s, retention %s\n", "", res.IdleTook.Round(time.Millisecond), res.RetentionTook.Round(time.Millisecond))
}

// expiryTracker counts the execution.expired events the dispatcher
// records for the run's executions, with a core NATS subscription.
type expiryTracker struct {
	sub    *nats.Subscription
	mu     sync.Mutex
	n      int
	last   time.Time
	prefix string
}

func newExpiryTracker(conn *bus.Conn, prefix string) (*expiryTracker, error) {
	t := &expiryTracker{prefix: prefix}
	sub, err := conn.NC.Subscribe(bus.WorkflowSubjects(retentionWorkflow), func(m *nats.Msg) {
		if events.Type(m.Header.Get("ce-type")) != events.TypeExecutionExpired {
			return
		}
		if _, ok := ourIndex(m.Subject[strings.LastIndexByte(m.Subject, '.')+1:], t.prefix); !ok {
			return
		}
		t.mu.Lock()
		t.n++
		t.last = time.Now()
		t.mu.Unlock()
	})
	if err != nil {
		return nil, err
	}
	_ = sub.SetPendingLimits(-1, -1)
	// The subscription is in place once the server has it.
	if err := conn.NC.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	t.sub = sub
	return t, nil
}

// wait returns how many expiries it has seen, and when the last came,
// once it has seen want of them or after timeout (the subscription's
// messages are handled apart from the read models that show them).
func (t *expiryTracker) wait(want int, timeout time.Duration) (int, time.Time) {
	deadline := time.Now().Add(timeout)
	for {
		t.mu.Lock()
		n, last := t.n, t.last
		t.mu.Unlock()
		if n >= want || time.Now().After(deadline) {
			return n, last
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (t *expiryTracker) close() { _ = t.sub.Unsubscribe() }

// modelStatus is what the retention run reads of a read model.
type modelStatus struct {
	Status    projections.Status `json:"status"`
	EndedAt   time.Time          `json:"ended_at"`
	ExpiredAt time.Time          `json:"expired_at"`
}

// finished is what the janitor counts as finished.
func (m modelStatus) finished() bool { return m.Status.Terminal() && !m.EndedAt.IsZero() }

// waitReadModels follows the executions bucket until want of the n
// executions prefix-0 to prefix-(n-1) have a read model that ok accepts,
// and returns those, and how many finished read models of other
// executions the bucket holds.
func waitReadModels(ctx context.Context, kv jetstream.KeyValue, prefix string, n, want int, ok func(modelStatus) bool) (map[string]modelStatus, int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	ours := map[string]modelStatus{}
	others := map[string]bool{} // finished read models of other runs
	err := scanBucket(ctx, kv, func(e jetstream.KeyValueEntry) bool {
		if e == nil {
			return len(ours) < want
		}
		var m modelStatus
		put := e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &m) == nil
		if i, mine := ourIndex(e.Key(), prefix); mine && i < n {
			if put && ok(m) {
				ours[e.Key()] = m
			} else {
				delete(ours, e.Key())
			}
			return len(ours) < want
		}
		if put && m.finished() {
			others[e.Key()] = true
		} else {
			delete(others, e.Key())
		}
		return true
	})
	if err != nil {
		return nil, 0, fmt.Errorf("%d of %d: %w", len(ours), want, err)
	}
	return ours, len(others), nil
}

// ourIndex returns i for an id prefix-i.
func ourIndex(id, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(id, prefix+"-")
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil
}

// scanBucket reads a bucket with one watcher: every current entry, then
// nil once they have all been seen, then the updates that follow, for as
// long as see returns true.
func scanBucket(ctx context.Context, kv jetstream.KeyValue, see func(jetstream.KeyValueEntry) bool) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer bus.StopWatch(w)
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watcher closed")
			}
			if !see(e) {
				return nil
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// checkRetained checks what is left of each execution of the run: the
// keep that finished last (ranked as the janitor ranks them: by end,
// then by id) must be intact and the others deleted. It reads each store
// once, not each execution.
func checkRetained(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue, ours []endedExecution, keep int) ([]string, error) {
	slices.SortFunc(ours, func(a, b endedExecution) int { // most recent first
		if c := b.endedAt.Compare(a.endedAt); c != 0 {
			return c
		}
		return cmp.Compare(b.id, a.id)
	})
	models := map[string]modelStatus{}
	if err := scanBucket(ctx, kv, func(e jetstream.KeyValueEntry) bool {
		if e != nil && e.Operation() == jetstream.KeyValuePut {
			var m modelStatus
			_ = json.Unmarshal(e.Value(), &m)
			models[e.Key()] = m
		}
		return e != nil
	}); err != nil {
		return nil, fmt.Errorf("read models: %w", err)
	}
	ids, err := claim.Open(ctx, js)
	if err != nil {
		return nil, err
	}
	claims := map[string]bool{} // id -> marked expired
	if err := ids.Each(ctx, func(id string, c claim.Record) error {
		claims[id] = c.Expired()
		return nil
	}); err != nil {
		return nil, fmt.Errorf("id claims: %w", err)
	}
	histories, err := subjects(ctx, js, bus.StreamEvents, bus.WorkflowSubjects(retentionWorkflow))
	if err != nil {
		return nil, err
	}
	stored, err := subjects(ctx, js, bus.StreamResults, bus.ResultsPrefix+".*.*.*")
	if err != nil {
		return nil, err
	}
	results := map[string]uint64{} // by execution id
	for subj, n := range stored {
		results[subj[strings.LastIndexByte(subj, '.')+1:]] += n
	}
	var wrong []string
	for rank, x := range ours {
		kept := rank < keep
		expired, claimed := claims[x.id]
		model, modeled := models[x.id]
		got := map[string]bool{
			"history":                  histories[bus.ExecutionSubject(retentionWorkflow, x.id)] > 0,
			"results":                  results[x.id] > 0,
			"read model":               modeled,
			"expiry in the read model": !model.ExpiredAt.IsZero(),
			"id claim":                 claimed,
			"expired mark":             expired,
		}
		want := map[string]bool{"history": kept, "results": kept, "read model": kept, "id claim": true, "expired mark": !kept}
		for _, what := range []string{"history", "results", "read model", "expiry in the read model", "id claim", "expired mark"} {
			if got[what] == want[what] {
				continue
			}
			verb := "gone"
			if got[what] {
				verb = "still there"
			}
			wrong = append(wrong, fmt.Sprintf("%s (rank %d, kept: %t): %s %s", x.id, rank, kept, what, verb))
		}
	}
	return wrong, nil
}

// subjects counts the messages of each subject of a stream that match filter.
func subjects(ctx context.Context, js jetstream.JetStream, stream, filter string) (map[string]uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("subjects of %s: %w", stream, err)
	}
	return info.State.Subjects, nil
}
