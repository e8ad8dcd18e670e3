package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/visibility"
	"jetflow.dev/services/api/visibility/pgstore"
	"jetflow.dev/services/api/visibility/sqlitestore"
)

// The visibility run (-visibility N) fills the api's visibility index
// with N executions and measures its lists. It fills the store directly,
// through the write path the feed uses (Store.Apply, batches of 1,000
// rows, each a transaction), not through the executions bucket: a
// million read models are gigabytes of KV values that the run would spend
// its time writing and reading back, and the feed's cost per row (a
// watch delivery and the decoding of a read model) is the projector's,
// not the index's. The lists are Store.Query calls, what
// GET /v1/executions does after it checked the index is fresh (one
// stream-info request to NATS, not measured here) and before it writes
// the JSON.

// visibility run shape: how the rows are spread.
const (
	visWorkflows = 20
	visCustomers = 10000
	visDays      = 30
	visBatch     = 1000
	visPage      = 50
)

// visRow is the i-th of n synthetic rows: started in order over visDays
// (with a jitter), mostly finished, a few damaged, half of the
// workflows with a customer and region attribute.
func visRow(rnd *rand.Rand, i, n int, t0 time.Time) visibility.Row {
	span := time.Duration(visDays) * 24 * time.Hour
	started := t0.Add(span/time.Duration(n)*time.Duration(i) + time.Duration(rnd.IntN(60))*time.Second)
	wf := rnd.IntN(visWorkflows)
	r := visibility.Row{
		// Ids shaped as the api's (uuid v7, 36 characters), unique.
		ID:        fmt.Sprintf("%08x-%04x-7%03x-8%03x-%012x", started.Unix(), i>>16&0xffff, i>>4&0xfff, i&0xfff, rnd.Uint64()&0xffffffffffff),
		Workflow:  fmt.Sprintf("workflow-%02d", wf),
		Version:   1 + rnd.IntN(3),
		StartedAt: started,
		UpdatedAt: started,
		Steps:     1 + rnd.IntN(20),
		Rev:       uint64(i + 1),
	}
	switch p := rnd.IntN(100); {
	case p < 70:
		r.Status = projections.StatusSucceeded
	case p < 80:
		r.Status, r.Error = projections.StatusFailed, "step call-service: exit status 1: connection refused"
	case p < 85:
		r.Status = projections.StatusCancelled
	case p < 95:
		r.Status = projections.StatusStarted
	case p < 98:
		r.Status = projections.StatusSuspended
	default:
		r.Status = projections.StatusCancelling
	}
	r.Done = r.Steps
	if r.Status.Terminal() {
		r.EndedAt = started.Add(time.Duration(rnd.IntN(3600)) * time.Second)
		r.UpdatedAt = r.EndedAt
	} else {
		r.Done = rnd.IntN(r.Steps)
	}
	if rnd.IntN(1000) == 0 {
		r.Damaged = &projections.Damage{Seq: uint64(i), Type: "io.jetflow.unknown", Reason: "unknown event type"}
	}
	if wf%2 == 0 {
		r.Attrs = map[string]string{"customer": fmt.Sprintf("customer-%05d", rnd.IntN(visCustomers)),
			"region": []string{"eu-west", "eu-north", "us-east", "us-west", "ap-south", "ap-east", "sa-east", "af-south"}[rnd.IntN(8)]}
	}
	return r
}

// benchStore is a store the benchmark fills and reads.
type benchStore interface {
	visibility.Store
	Size(ctx context.Context) (int64, error)
}

// benchSchema is the PostgreSQL schema the benchmark fills (kept, as the
// SQLite file is: a second run skips the fill).
const benchSchema = "jetflow_visibility_bench"

// runVisibility fills an index with n rows in dir, or in PostgreSQL at
// pgURL when it is set (unless it holds them already), and prints the
// fill's time and the latencies of queries lists of each kind.
func runVisibility(ctx context.Context, out io.Writer, n int, dir, pgURL string, queries, cacheBytes int) error {
	path := filepath.Join(dir, "visibility-bench.db")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cacheBytes = cmp.Or(cacheBytes, sqlitestore.DefaultCacheBytes)
	open := func() (benchStore, error) { return sqlitestore.OpenCache(path, cacheBytes) }
	where := path + " (SQLite, modernc.org/sqlite)"
	if pgURL != "" {
		open = func() (benchStore, error) { return pgstore.Open(ctx, pgURL, benchSchema) }
		where = "PostgreSQL, schema " + benchSchema
	}
	store, err := open()
	if err != nil {
		return err
	}
	have, err := store.Count(ctx)
	if err != nil {
		store.Close()
		return err
	}
	fmt.Fprintf(out, "visibility: %d executions in %s\n", n, where)
	if have >= n {
		fmt.Fprintf(out, "  fill: skipped, the database holds %d rows already\n", have)
		n = have
	} else {
		if err := store.Reset(ctx); err != nil {
			store.Close()
			return err
		}
		rnd := rand.New(rand.NewPCG(1, 2))
		began := time.Now()
		batch := make([]visibility.Row, 0, visBatch)
		for i := range n {
			batch = append(batch, visRow(rnd, i, n, t0))
			if len(batch) == visBatch || i == n-1 {
				if err := store.Apply(ctx, visibility.Batch{Puts: batch, Position: visibility.Position{Revision: uint64(i + 1)}}); err != nil {
					store.Close()
					return fmt.Errorf("fill: %w", err)
				}
				batch = batch[:0]
			}
			if (i+1)%100000 == 0 {
				fmt.Fprintf(out, "  filled %d in %s\n", i+1, time.Since(began).Round(time.Second))
			}
			if ctx.Err() != nil {
				store.Close()
				return ctx.Err()
			}
		}
		took := time.Since(began)
		fmt.Fprintf(out, "  fill: %d rows in %s (%.0f rows/s), batches of %d in a transaction each, through Store.Apply\n",
			n, took.Round(time.Second), float64(n)/took.Seconds(), visBatch)
	}
	if err := store.Close(); err != nil {
		return err
	}
	// Measured on a store opened again: its page caches empty, as an api
	// that just started (the OS's file cache is warm; PostgreSQL's shared
	// buffers too).
	if store, err = open(); err != nil {
		return err
	}
	defer store.Close()
	size, err := store.Size(ctx)
	if err != nil {
		return err
	}
	wal := int64(0)
	if fi, err := os.Stat(path + "-wal"); err == nil && pgURL == "" {
		wal = fi.Size()
	}

	rnd := rand.New(rand.NewPCG(3, 4))
	day := func() time.Time { return t0.Add(time.Duration(rnd.IntN(visDays-1)) * 24 * time.Hour) }
	cases := []struct {
		name string
		q    func() (visibility.Query, int) // the query and the page whose time is measured (0: the first)
	}{
		{"first page: workflow + status, by start (latest first)", func() (visibility.Query, int) {
			return visibility.Query{Workflow: fmt.Sprintf("workflow-%02d", rnd.IntN(visWorkflows)), Status: projections.StatusSucceeded,
				Sort: visibility.SortStartedDesc}, 0
		}},
		{"a later page (cursor, pages 2-20) of the same", func() (visibility.Query, int) {
			return visibility.Query{Workflow: fmt.Sprintf("workflow-%02d", rnd.IntN(visWorkflows)), Status: projections.StatusSucceeded,
				Sort: visibility.SortStartedDesc}, 1 + rnd.IntN(19)
		}},
		{"time range: started within an hour, any workflow and status", func() (visibility.Query, int) {
			from := day().Add(time.Duration(rnd.IntN(23)) * time.Hour)
			return visibility.Query{StartedAfter: from, StartedBefore: from.Add(time.Hour), Sort: visibility.SortStartedDesc}, 0
		}},
		{"time range: ended within a day, one workflow, by end", func() (visibility.Query, int) {
			from := day()
			return visibility.Query{Workflow: fmt.Sprintf("workflow-%02d", rnd.IntN(visWorkflows)), EndedAfter: from,
				EndedBefore: from.Add(24 * time.Hour), Sort: visibility.SortEndedDesc}, 0
		}},
		{"attribute: customer = one of 10,000, by start", func() (visibility.Query, int) {
			return visibility.Query{Attrs: []visibility.Attr{{Name: "customer", Value: fmt.Sprintf("customer-%05d", rnd.IntN(visCustomers))}},
				Sort: visibility.SortStartedDesc}, 0
		}},
		{"attribute and workflow: region = one of 8, a workflow", func() (visibility.Query, int) {
			return visibility.Query{Attrs: []visibility.Attr{{Name: "region", Value: "eu-west"}},
				Workflow: fmt.Sprintf("workflow-%02d", 2*rnd.IntN(visWorkflows/2)), Sort: visibility.SortStartedDesc}, 0
		}},
		{"first page, no filter, by id (the default)", func() (visibility.Query, int) {
			return visibility.Query{Sort: visibility.SortID}, 0
		}},
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  list (%d per page, %d each)\tp50\tp99\trows\n", visPage, queries)
	for _, c := range cases {
		var lat []time.Duration
		rows := 0
		for range queries {
			q, page := c.q()
			q.Limit = visPage
			var p visibility.Page
			var took time.Duration
			for k := 0; k <= page; k++ {
				began := time.Now()
				if p, err = store.Query(ctx, q); err != nil {
					return fmt.Errorf("%s: %w", c.name, err)
				}
				took = time.Since(began)
				if p.Next == nil {
					break
				}
				q.After = p.Next
			}
			lat = append(lat, took)
			rows += len(p.Rows)
		}
		slices.Sort(lat)
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%.0f\n", c.name, msec(lat[len(lat)/2]), msec(lat[len(lat)*99/100]), float64(rows)/float64(queries))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	f := takeFootprint()
	peak := int64(-1)
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		for line := range strings.Lines(string(b)) {
			if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
				if kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64); err == nil {
					peak = kb << 10
				}
			}
		}
	}
	// The counts by status: a few rows, whatever n.
	var lat []time.Duration
	for i := range queries {
		wf := ""
		if i%2 == 1 {
			wf = fmt.Sprintf("workflow-%02d", rnd.IntN(visWorkflows))
		}
		began := time.Now()
		if _, err := store.Counts(ctx, wf); err != nil {
			return fmt.Errorf("counts: %w", err)
		}
		lat = append(lat, time.Since(began))
	}
	slices.Sort(lat)
	fmt.Fprintf(out, "  counts by status (all, or one workflow): p50 %s, p99 %s\n", msec(lat[len(lat)/2]), msec(lat[len(lat)*99/100]))
	if pgURL != "" {
		fmt.Fprintf(out, "  database: %.0f MiB (tables and indexes), %.0f bytes per execution\n", float64(size)/(1<<20), float64(size)/float64(n))
		if f.rss >= 0 {
			fmt.Fprintf(out, "  process: RSS %.0f MiB after the lists (the server's memory is its own)\n", float64(f.rss)/(1<<20))
		}
		return nil
	}
	fmt.Fprintf(out, "  database: %.0f MiB (+ %.0f MiB of WAL), %.0f bytes per execution\n",
		float64(size)/(1<<20), float64(wal)/(1<<20), float64(size)/float64(n))
	if f.rss >= 0 {
		cache := float64(cacheBytes) / (1 << 20)
		fmt.Fprintf(out, "  process: RSS %.0f MiB after the lists, %.0f MiB at its peak (Go heap in use %.0f MiB; SQLite's page caches are bounded: %.0f MiB for the writer, %.0f MiB per reader)\n",
			float64(f.rss)/(1<<20), float64(peak)/(1<<20), float64(f.heap)/(1<<20), cache, cache/4)
	}
	return nil
}

// msec prints d in milliseconds, to a hundredth.
func msec(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d.Microseconds())/1000) }
