package dispatch

import (
	"fmt"
	"testing"
	"time"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// BenchmarkMetricsAppended is what counting costs an append: a step's
// success in a 10-step execution (a counter and a histogram of its kind),
// and an event that counts nothing; against the fold of the same event
// (projections.Apply), which every append pays anyway.
func BenchmarkMetricsAppended(b *testing.B) {
	m, err := NewMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	started := &events.ExecutionStarted{Workflow: "wf", Version: 1, Token: "t"}
	for i := range 10 {
		started.Steps = append(started.Steps, events.StepRef{ID: fmt.Sprintf("s%d", i), Kind: "let"})
	}
	evs := []events.Event{events.New("bench", "x", "wf", now, started)}
	for i := range 10 {
		evs = append(evs, events.New("bench", "x", "wf", now, &events.StepScheduled{StepID: fmt.Sprintf("s%d", i), Attempt: 1}))
	}
	before, err := projections.Fold(evs)
	if err != nil {
		b.Fatal(err)
	}
	done := events.New("bench", "x", "wf", now.Add(time.Millisecond), &events.StepSucceeded{StepID: "s9", Attempt: 1})
	after, err := projections.Apply(before, done)
	if err != nil {
		b.Fatal(err)
	}
	vars := events.New("bench", "x", "wf", now, &events.VariablesSet{Vars: nil})
	b.Run("StepSucceeded", func(b *testing.B) {
		for b.Loop() {
			m.appended(&before, &after, &done, time.Now)
		}
	})
	b.Run("Uncounted", func(b *testing.B) {
		for b.Loop() {
			m.appended(&before, &before, &vars, time.Now)
		}
	})
	b.Run("Off", func(b *testing.B) {
		var off *Metrics
		for b.Loop() {
			off.appended(&before, &after, &done, time.Now)
		}
	})
	b.Run("FoldForComparison", func(b *testing.B) {
		for b.Loop() {
			if _, err := projections.Apply(before, done); err != nil {
				b.Fatal(err)
			}
		}
	})
}
