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

// ApplyOwned gives the state Apply gives, event after event, and Apply
// leaves the state it was given as it was.
func TestApplyOwnedAppliesAsApplyDoes(t *testing.T) {
	t.Parallel()

	evs := tenStepHistory()
	var copied, owned projections.Execution
	for i, ev := range evs {
		before, err := json.Marshal(copied)
		if err != nil {
			t.Fatal(err)
		}
		next, err := projections.Apply(copied, ev)
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if after, _ := json.Marshal(copied); string(after) != string(before) {
			t.Fatalf("event %d: Apply changed the state it was given", i)
		}
		copied = next
		if owned, err = projections.ApplyOwned(owned, ev); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		a, _ := json.Marshal(copied)
		b, _ := json.Marshal(owned)
		if string(a) != string(b) {
			t.Fatalf("event %d: ApplyOwned gives\n%s\nApply gives\n%s", i, b, a)
		}
	}
	if owned.Status != projections.StatusSucceeded {
		t.Fatalf("the history folds to %s", owned.Status)
	}
}

// BenchmarkApplyEach applies a 10-step history's events one by one, each
// onto the state the last gave, as a re-projection does: with Apply
// (copying the steps at every event) and with ApplyOwned.
func BenchmarkApplyEach(b *testing.B) {
	evs := tenStepHistory()
	for _, bb := range []struct {
		name  string
		apply func(projections.Execution, events.Event) (projections.Execution, error)
	}{{"Apply", projections.Apply}, {"ApplyOwned", projections.ApplyOwned}} {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var s projections.Execution
				for _, ev := range evs {
					var err error
					if s, err = bb.apply(s, ev); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// BenchmarkStoredHead reads the head of a 10-step execution's stored
// read model (the members before its step table, and its step counts),
// as the visibility index does at each write of the model and the
// janitor's sweep for each model written since the one before.
func BenchmarkStoredHead(b *testing.B) {
	x, err := projections.Fold(tenStepHistory())
	if err != nil {
		b.Fatal(err)
	}
	doc, err := projections.EncodeStored(x, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, ok := projections.StoredHead(doc); !ok {
			b.Fatal("no head")
		}
	}
}
