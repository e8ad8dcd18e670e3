package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/workflow"
)

// foreachWorkflow is the foreach run's workflow: one foreach over n
// items, 50 at a time, of a let step the dispatcher runs itself.
const foreachWorkflow = "bench-foreach"

// foreachOf is the workflow name: a foreach over n items, 50 at a time,
// each running step (a YAML flow mapping).
func foreachOf(name string, n int, step string) (workflow.Definition, error) {
	return workflow.Parse(fmt.Appendf(nil, `
name: %s
steps:
  - id: each
    kind: foreach
    items: ${0..%d}
    concurrency: 50
    steps:
      - %s
`, name, n-1, step))
}

// runForeach times one execution of a foreach over n items whose steps
// the dispatcher runs itself: what one large execution costs the
// dispatcher, decision after decision.
func runForeach(ctx context.Context, out io.Writer, conn *bus.Conn, store *catalog.Store, n int) error {
	d, err := foreachOf(foreachWorkflow, n, `{id: v, kind: let, vars: {last: "${item}"}}`)
	if err != nil {
		return err
	}
	if _, _, err := store.Apply(ctx, d); err != nil {
		return err
	}
	tr := newTracker(conn.NC, foreachWorkflow)
	defer tr.close()
	lat, err := tr.runBatch(ctx, conn, batchPrefix("foreach"), 1, 1)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nforeach run: one execution of a foreach over %d let items, 50 at a time\n", n)
	fmt.Fprintf(out, "  start-to-finish  %s (%.0f items/s)\n", lat[0].Round(time.Millisecond), float64(n)/lat[0].Seconds())
	return nil
}
