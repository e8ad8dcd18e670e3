package projections_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// tenStepHistory is the history of an execution of ten noop steps run by
// an agent, as the dispatcher records it today: started, then each step
// scheduled, sending, sent, started and succeeded, then succeeded.
func tenStepHistory() []events.Event {
	t0 := time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)
	ids := make([]string, 10)
	refs := make([]events.StepRef, 10)
	for i := range ids {
		ids[i] = fmt.Sprintf("s%d", i+1)
		refs[i] = events.StepRef{ID: ids[i], Kind: "noop"}
	}
	var evs []events.Event
	add := func(p events.Payload) {
		seq := uint64(len(evs) + 1)
		evs = append(evs, events.Event{ID: fmt.Sprintf("e%d", seq), Type: p.EventType(), Source: "jetflow/dispatcher",
			Subject: "x1", Workflow: "bench", Time: t0.Add(time.Duration(seq) * time.Millisecond), Seq: seq, PrevSeq: seq - 1, Data: p})
	}
	add(&events.ExecutionStarted{Workflow: "bench", Version: 1, Input: json.RawMessage(`{}`), Steps: refs,
		Definition: json.RawMessage(`{"name":"bench"}`), Token: "tok"})
	for i, id := range ids {
		task := "x1." + id + ".1"
		add(&events.StepScheduled{StepID: id, Attempt: 1})
		add(&events.StepSending{StepID: id, Attempt: 1, TaskID: task, Queue: "default"})
		add(&events.StepSent{StepID: id, Attempt: 1, TaskID: task, TaskSeq: uint64(100 + i)})
		add(&events.StepStarted{StepID: id, Attempt: 1, Agent: "agent-1", Delivery: 1})
		add(&events.StepSucceeded{StepID: id, Attempt: 1, Output: json.RawMessage(`{}`)})
	}
	add(&events.ExecutionSucceeded{})
	return evs
}

// BenchmarkFold folds a whole 10-step history (52 events), as the
// dispatcher does when an execution is not in its cache and the
// projector for every batch of events.
func BenchmarkFold(b *testing.B) {
	evs := tenStepHistory()
	s, err := projections.Fold(evs)
	if err != nil || s.Status != projections.StatusSucceeded {
		b.Fatalf("the history folds to %s, %v", s.Status, err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := projections.Fold(evs); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApply applies one event to a state, as the dispatcher does for
// every event it appends: the 6th step's success, five steps in.
func BenchmarkApply(b *testing.B) {
	evs := tenStepHistory()
	const at = 1 + 5*5 + 4 // started, five whole steps, the 6th up to started
	ev := evs[at]
	if ev.Type != events.TypeStepSucceeded {
		b.Fatalf("event %d is %s", at, ev.Type)
	}
	s, err := projections.Fold(evs[:at])
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := projections.Apply(s, ev); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSizeEstimate estimates the bytes of a 10-step execution's
// state, as the dispatcher's and the projector's caches do each time they
// keep a changed state (bounded by bytes), with the dormancy check that
// goes with it.
func BenchmarkSizeEstimate(b *testing.B) {
	evs := tenStepHistory()
	s, err := projections.Fold(evs[:1+5*5+4])
	if err != nil {
		b.Fatal(err)
	}
	if projections.SizeEstimate(&s) <= 0 {
		b.Fatal("no size")
	}
	b.ReportAllocs()
	for b.Loop() {
		if projections.SizeEstimate(&s) <= 0 || projections.Dormant(&s, time.Minute) {
			b.Fatal("no size, or dormant")
		}
	}
}
