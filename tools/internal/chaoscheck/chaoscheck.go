// Package chaoscheck checks what a chaos run left behind: every
// execution's history, the read models the projector wrote, the commands
// the api accepted and the marks the operations wrote themselves. It is
// pure (no I/O, no clock: the caller gives the time it read everything
// at), so each rule is tested with hand-made histories that break it.
//
// The rules (DESIGN.md, invariants) are:
//
//   - [RuleUnfinished]: every execution has ended, or is legitimately
//     waiting (for a signal nobody sent, or a sleep not yet due);
//   - [RuleSucceededTwice]: a step attempt's success is recorded at most once;
//   - [RuleNotLinear]: each history is linear (the prevseq chain unbroken);
//   - [RuleLockOverlap]: no more holders of a lock than it allows at any
//     moment, from the holders' own enter and exit marks and from the
//     histories (a holder's scope ran a step after the next holder had
//     acquired the lock);
//   - [RuleLostCommand]: every accepted start has an execution;
//   - [RuleReadModel]: every read model equals the fold of its history.
//
// Operations that ran more than once (allowed: at least once) are counted,
// not reported as violations.
package chaoscheck

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/redact"
	"jetflow.dev/pkg/workflow"
)

// Rule names one invariant.
type Rule string

// The rules a run is checked against.
const (
	RuleUnfinished     Rule = "unfinished"
	RuleSucceededTwice Rule = "succeeded-twice"
	RuleNotLinear      Rule = "not-linear"
	RuleLockOverlap    Rule = "lock-overlap"
	RuleLostCommand    Rule = "lost-command"
	RuleReadModel      Rule = "read-model"
)

// Rules lists every rule, in the order reports show them.
var Rules = []Rule{RuleUnfinished, RuleSucceededTwice, RuleNotLinear, RuleLockOverlap, RuleLostCommand, RuleReadModel}

// Execution is what was read of one execution.
type Execution struct {
	// ID is the execution's id.
	ID string
	// Events is its history, in stream order, from its first event.
	Events []events.Event
	// ReadModel is the read model the projector stored (nil: none).
	ReadModel []byte
}

// Signal is a signal the api accepted for an execution.
type Signal struct {
	Execution, Name string
}

// MarkKind says what an operation marked.
type MarkKind string

// The marks operations write.
const (
	// MarkRun: an operation began to run (once per run, so a task run
	// again after its agent died marks twice).
	MarkRun MarkKind = "run"
	// MarkEnter and MarkExit: a holder of a lock entered and left its
	// critical section.
	MarkEnter MarkKind = "enter"
	MarkExit  MarkKind = "exit"
)

// Mark is one line an operation appended to the marks file: they are in
// the order they were written, which is the order they happened.
type Mark struct {
	Kind MarkKind
	// Execution is the execution that ran the operation.
	Execution string
	// Step and Attempt identify a run (MarkRun).
	Step    string
	Attempt int
	// Lock is the lock held (MarkEnter, MarkExit).
	Lock string
}

// Input is everything a check looks at.
type Input struct {
	// Executions are every execution found, by id.
	Executions map[string]Execution
	// Accepted are the ids of the starts the api accepted.
	Accepted []string
	// Signals are the signals the api accepted.
	Signals []Signal
	// Marks are the operations' marks, in the order written.
	Marks []Mark
	// Limits are the holders each lock allows (1 when a lock is missing).
	Limits map[string]int
	// Now is when everything was read: a sleep due after it may still wait.
	Now time.Time
}

// Violation is one broken rule.
type Violation struct {
	Rule      Rule
	Execution string
	// Seq is the stream sequence of the event at fault (0: none).
	Seq    uint64
	Detail string
}

func (v Violation) String() string {
	s := fmt.Sprintf("%s: %s", v.Rule, v.Execution)
	if v.Seq > 0 {
		s += fmt.Sprintf(" at seq %d", v.Seq)
	}
	return s + ": " + v.Detail
}

// Report is the outcome of a check.
type Report struct {
	// Executions counts the executions checked, ByStatus by their status.
	Executions int
	ByStatus   map[projections.Status]int
	// Waiting counts those legitimately waiting.
	Waiting int
	// FailedWhy counts the failed executions by their error: a failure
	// breaks no rule (a step may fail), but under chaos it says what the
	// kills cost.
	FailedWhy map[string]int
	// RunTwice counts the operation runs (execution, step, attempt) that
	// the marks show ran more than once; Reruns the extra runs.
	RunTwice, Reruns int
	// StartedAgain counts the step attempts whose history records more
	// than one start (an agent reported it again, after a redelivery),
	// counting a start recorded with the step's result.
	StartedAgain int
	// Violations are the broken rules; a run passes when there are none.
	Violations []Violation
}

// Count returns the violations of rule.
func (r Report) Count(rule Rule) int {
	n := 0
	for _, v := range r.Violations {
		if v.Rule == rule {
			n++
		}
	}
	return n
}

// Check checks in against every rule.
func Check(in Input) Report {
	r := Report{ByStatus: map[projections.Status]int{}, FailedWhy: map[string]int{}}
	sent := map[string]map[string]bool{}
	for _, s := range in.Signals {
		if sent[s.Execution] == nil {
			sent[s.Execution] = map[string]bool{}
		}
		sent[s.Execution][s.Name] = true
	}
	ids := slices.Sorted(maps.Keys(in.Executions))
	for _, id := range ids {
		x := in.Executions[id]
		r.Executions++
		r.Violations = append(r.Violations, checkHistory(x, in.Now, sent[id], &r)...)
	}
	for _, id := range in.Accepted {
		if x, ok := in.Executions[id]; !ok || !hasStart(x.Events) {
			r.Violations = append(r.Violations, Violation{Rule: RuleLostCommand, Execution: id,
				Detail: "the api accepted its start, but it has no execution"})
		}
	}
	r.Violations = append(r.Violations, checkMarks(in.Marks, in.Limits, &r)...)
	r.Violations = append(r.Violations, checkLockHistory(in.Executions, in.Limits)...)
	return r
}

func hasStart(evs []events.Event) bool {
	return len(evs) > 0 && evs[0].Type == events.TypeExecutionStarted
}

// attempt names one attempt of one step instance.
type attempt struct {
	step string
	n    int
}

// checkHistory checks one execution's history and read model.
func checkHistory(x Execution, now time.Time, sent map[string]bool, r *Report) []Violation {
	var out []Violation
	bad := func(rule Rule, seq uint64, format string, args ...any) {
		out = append(out, Violation{Rule: rule, Execution: x.ID, Seq: seq, Detail: fmt.Sprintf(format, args...)})
	}
	if err := history.Linear(x.Events); err != nil {
		bad(RuleNotLinear, 0, "%v", err)
	}
	succeeded, started := map[attempt]uint64{}, map[attempt]int{}
	waits := map[string]*events.StepWaiting{} // by step instance, the last wait recorded
	for _, ev := range x.Events {
		data := ev.Data
		if end, ok := data.(*events.ExecutionSucceeded); ok && end.Step != nil {
			data = end.Step // the last step's success, carried by the end
		}
		switch p := data.(type) {
		case *events.StepSucceeded:
			a := attempt{p.StepID, p.Attempt}
			if first, ok := succeeded[a]; ok {
				bad(RuleSucceededTwice, ev.Seq, "step %s attempt %d succeeded again (first at seq %d)", p.StepID, p.Attempt, first)
			} else {
				succeeded[a] = ev.Seq
			}
			if !p.StartedAt.IsZero() { // a start recorded with the result
				started[a]++
			}
		case *events.StepFailed:
			if !p.StartedAt.IsZero() {
				started[attempt{p.StepID, p.Attempt}]++
			}
		case *events.StepStarted:
			started[attempt{p.StepID, p.Attempt}]++
		case *events.StepWaiting:
			waits[p.StepID] = p
		}
	}
	for _, n := range started {
		if n > 1 {
			r.StartedAgain++
		}
	}
	state := projections.FoldQuarantined(x.ID, x.Events)
	r.ByStatus[state.Status]++
	if state.Status == projections.StatusFailed {
		r.FailedWhy[state.Error]++
	}
	switch {
	case state.Damaged != nil:
		bad(RuleUnfinished, state.Damaged.Seq, "damaged: %s", state.Damaged.Reason)
	case state.Status.Terminal():
	default:
		if why := notWaiting(state, waits, sent, now); why != "" {
			bad(RuleUnfinished, state.LastSeq, "status %q and %s", state.Status, why)
		} else {
			r.Waiting++
		}
	}
	if len(x.Events) > 0 {
		if v, ok := compareReadModel(x, state); !ok {
			bad(RuleReadModel, state.LastSeq, "%s", v)
		}
	}
	return out
}

// notWaiting says why a running execution is not legitimately waiting
// ("" when it is): it must wait in at least one step, each wait must be
// for a signal nobody sent or a time not yet come, and no step may be
// in the hands of an agent or about to be.
func notWaiting(x projections.Execution, waits map[string]*events.StepWaiting, sent map[string]bool, now time.Time) string {
	if x.Status != projections.StatusStarted {
		return "no step waits"
	}
	waiting := 0
	for _, st := range x.Steps {
		switch st.Status {
		case projections.OpPending, projections.OpSending, projections.OpSent, projections.OpRescheduled:
			return fmt.Sprintf("step %s is %s", st.ID, st.Status)
		case projections.OpStarted:
			switch st.Kind {
			case workflow.KindWorkflow, workflow.KindForeach, workflow.KindParallel, workflow.KindSwitch:
				// a block runs while its steps wait
			default:
				return fmt.Sprintf("step %s is %s", st.ID, st.Status)
			}
		case projections.OpWaiting:
			w := waits[st.ID]
			if w == nil {
				return fmt.Sprintf("step %s waits, but its history records no wait", st.ID)
			}
			for _, s := range w.Signals {
				if sent[s] {
					return fmt.Sprintf("step %s still waits for signal %q, which was sent", st.ID, s)
				}
			}
			if len(w.Signals) == 0 && !w.Until.After(now) {
				return fmt.Sprintf("step %s still sleeps, though it was due at %s", st.ID, w.Until.Format(time.RFC3339Nano))
			}
			waiting++
		}
	}
	if waiting == 0 {
		return "no step waits"
	}
	return ""
}

// compareReadModel compares a stored read model with the fold of the
// history, as the projector would store it (package redact hides the
// same values). A truncated model (too large to store whole) is compared
// on what it keeps whole: its status and last sequence.
func compareReadModel(x Execution, fold projections.Execution) (string, bool) {
	if x.ReadModel == nil {
		return "no read model", false
	}
	var stored projections.Execution
	if err := json.Unmarshal(x.ReadModel, &stored); err != nil {
		return fmt.Sprintf("read model does not decode: %v", err), false
	}
	if stored.LastSeq != fold.LastSeq || stored.Status != fold.Status {
		return fmt.Sprintf("read model at seq %d status %q, history at seq %d status %q",
			stored.LastSeq, stored.Status, fold.LastSeq, fold.Status), false
	}
	if stored.Truncated != nil {
		return "", true
	}
	want, err := json.Marshal(redact.FromHistory(x.Events).Execution(fold))
	if err != nil {
		return fmt.Sprintf("encode the fold: %v", err), false
	}
	got, err := json.Marshal(stored) // re-encoded: the same field order
	if err != nil {
		return fmt.Sprintf("encode the read model: %v", err), false
	}
	if !bytes.Equal(got, want) {
		return fmt.Sprintf("read model differs from the fold of its history:\n stored %s\n folded %s", got, want), false
	}
	return "", true
}

// checkMarks counts the operations run more than once and checks, from
// the enter and exit marks in the order they were written, that no lock
// had more holders inside than it allows. A holder is inside from its
// first mark to its last: an enter or exit run again (its agent died and
// the task went to another) keeps it inside until then.
func checkMarks(marks []Mark, limits map[string]int, r *Report) []Violation {
	runs := map[[3]string]int{}
	type holder struct{ lock, execution string }
	last := map[holder]int{}
	for i, m := range marks {
		switch m.Kind {
		case MarkRun:
			runs[[3]string{m.Execution, m.Step, fmt.Sprint(m.Attempt)}]++
		case MarkEnter, MarkExit:
			last[holder{m.Lock, m.Execution}] = i
		}
	}
	for _, n := range runs {
		if n > 1 {
			r.RunTwice++
			r.Reruns += n - 1
		}
	}
	var out []Violation
	inside := map[string][]string{} // by lock, the holders inside, in order of entry
	reported := map[string]bool{}
	for i, m := range marks {
		if m.Kind != MarkEnter && m.Kind != MarkExit {
			continue
		}
		in := inside[m.Lock]
		if !slices.Contains(in, m.Execution) {
			in = append(in, m.Execution)
		}
		if limit := limitOf(limits, m.Lock); len(in) > limit && !reported[m.Lock+m.Execution] {
			reported[m.Lock+m.Execution] = true
			out = append(out, Violation{Rule: RuleLockOverlap, Execution: m.Execution, Detail: fmt.Sprintf(
				"marks: %s entered lock %s (limit %d) while %s were inside", m.Execution, m.Lock, limit, strings.Join(in[:len(in)-1], ", "))})
		}
		if last[holder{m.Lock, m.Execution}] == i {
			in = slices.DeleteFunc(in, func(e string) bool { return e == m.Execution })
		}
		inside[m.Lock] = in
	}
	return out
}

func limitOf(limits map[string]int, lock string) int {
	return cmp.Or(limits[lock], 1)
}

// checkLockHistory checks the lock events against each other in stream
// order (one stream holds every history, so its sequence orders them
// all): a holder's scope is inside from its lock.acquired to the last
// step event of the scope before its release; the lock bucket is given
// up before lock.released is recorded, so the next holder may record its
// acquisition first, but never before the last holder's steps ended.
func checkLockHistory(xs map[string]Execution, limits map[string]int) []Violation {
	type span struct {
		execution, lock, path string
		from, to              uint64
	}
	var spans []span
	for _, id := range slices.Sorted(maps.Keys(xs)) {
		open := map[string]*span{} // by scope path
		for _, ev := range xs[id].Events {
			switch p := ev.Data.(type) {
			case *events.LockAcquired:
				open[p.Path] = &span{execution: id, lock: p.Lock, path: p.Path, from: ev.Seq, to: ev.Seq}
			case *events.LockReleased:
				if s := open[p.Path]; s != nil {
					spans = append(spans, *s)
					delete(open, p.Path)
				}
			case *events.LockCleared:
				if s := open[p.Path]; s != nil {
					spans = append(spans, *s)
					delete(open, p.Path)
				}
			default:
				step, ok := stepOf(ev.Data)
				if !ok {
					continue
				}
				for path, s := range open {
					if path == "" || step == path || strings.HasPrefix(step, path+"/") {
						s.to = ev.Seq
					}
				}
			}
		}
		for _, s := range open { // still held at the end
			spans = append(spans, *s)
		}
	}
	var out []Violation
	byLock := map[string][]span{}
	for _, s := range spans {
		byLock[s.lock] = append(byLock[s.lock], s)
	}
	for _, lock := range slices.Sorted(maps.Keys(byLock)) {
		ss := byLock[lock]
		slices.SortFunc(ss, func(a, b span) int { return cmp.Compare(a.from, b.from) })
		limit := limitOf(limits, lock)
		for i, s := range ss {
			var inside []string
			for _, o := range ss[:i] {
				if o.to > s.from {
					inside = append(inside, o.execution)
				}
			}
			if len(inside) >= limit {
				out = append(out, Violation{Rule: RuleLockOverlap, Execution: s.execution, Seq: s.from, Detail: fmt.Sprintf(
					"history: acquired lock %s (limit %d) while %s still ran steps under it", lock, limit, strings.Join(inside, ", "))})
			}
		}
	}
	return out
}

// stepOf returns the step instance a step event is about.
func stepOf(p events.Payload) (string, bool) {
	switch p := p.(type) {
	case *events.StepScheduled:
		return p.StepID, true
	case *events.StepSending:
		return p.StepID, true
	case *events.StepDispatched:
		return p.StepID, true
	case *events.StepSent:
		return p.StepID, true
	case *events.StepStarted:
		return p.StepID, true
	case *events.StepSucceeded:
		return p.StepID, true
	case *events.ExecutionSucceeded:
		if p.Step != nil { // the last step's success, carried by the end
			return p.Step.StepID, true
		}
	case *events.StepFailed:
		return p.StepID, true
	case *events.StepSkipped:
		return p.StepID, true
	case *events.StepWaiting:
		return p.StepID, true
	case *events.StepRescheduled:
		return p.StepID, true
	}
	return "", false
}

// ParseMark reads one line of a marks file: "run EXECUTION STEP ATTEMPT"
// or "enter|exit LOCK EXECUTION".
func ParseMark(line string) (Mark, error) {
	f := strings.Fields(line)
	switch {
	case len(f) == 4 && f[0] == string(MarkRun):
		var n int
		if _, err := fmt.Sscan(f[3], &n); err != nil {
			return Mark{}, fmt.Errorf("chaoscheck: mark %q: attempt: %w", line, err)
		}
		return Mark{Kind: MarkRun, Execution: f[1], Step: f[2], Attempt: n}, nil
	case len(f) == 3 && (f[0] == string(MarkEnter) || f[0] == string(MarkExit)):
		return Mark{Kind: MarkKind(f[0]), Lock: f[1], Execution: f[2]}, nil
	}
	return Mark{}, fmt.Errorf("chaoscheck: malformed mark %q", line)
}
