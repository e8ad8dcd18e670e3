package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// Brooklyn's replay. A replay goes on from a replay point (a step marked
// replayable, or the start) with the variables as they were when it was
// entered, re-checking conditions and re-evaluating inputs; or it resumes
// at the last incomplete step, if that step is idempotent, running it
// again with its recorded input. Nothing recorded is rewritten: the steps
// that run again get new attempts (new tasks, timers and nested
// instances), and the replay itself is an event.

// maxAutomaticReplays bounds the replays jetflow asks itself for one
// execution (replayable: automatically), so that agents that keep dying
// on a step do not replay it forever.
const maxAutomaticReplays = 3

// replayPlan is what a replay does, decided from the definition and the
// recorded state alone (so that decide can plan the replays that retry
// steps and automatic recovery ask for).
type replayPlan struct {
	// point is the instance the execution goes on from ("" = the start,
	// or, resuming, nothing to run again); mode is how.
	point string
	mode  string
	// resume, reopen and reset: see events.ExecutionReplayed.
	resume, reopen, reset []string
	// entered is the point's entry event: the variables are those of the
	// events before it. 0 means none (the start) unless keepVars.
	entered  int
	keepVars bool
}

// replayRefused is a replay that cannot be done as asked: the operator is
// told why (and the command rejected), a retry step fails with it.
type replayRefused struct{ msg string }

func (e *replayRefused) Error() string { return e.msg }

func refuse(format string, args ...any) error {
	return &replayRefused{msg: fmt.Sprintf(format, args...)}
}

// ran is a step instance that ran (or runs) in the execution as it is now.
type ran struct {
	st   projections.Step
	step workflow.Step
	// hidden: in on-error steps, or in a block replayable: disabled;
	// neither a replay point nor a place to resume at.
	hidden bool
	// allIdempotent: the workflow, or a block around it, says idempotent: all.
	allIdempotent bool
}

// instances returns the step instances that ran, in the order they were
// entered.
func instances(d workflow.Definition, s projections.Execution) []ran {
	var out []ran
	for _, st := range s.Steps {
		if st.Status == projections.OpNone || st.Entered == 0 {
			continue
		}
		step, ok := resolveStep(d, s, st.ID)
		if !ok {
			continue // not in the pinned definition
		}
		anc, _, inHandler := ancestry(s, st.ID)
		r := ran{st: st, step: step, hidden: inHandler, allIdempotent: d.IdempotentAll()}
		for _, a := range anc {
			if as, ok := resolveStep(d, s, a); ok {
				r.hidden = r.hidden || as.ReplayDisabled()
				r.allIdempotent = r.allIdempotent || as.IdempotentAll()
			}
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b ran) int { return a.st.Entered - b.st.Entered })
	return out
}

// point is a replay point: a step instance, or the start (path "").
type point struct {
	path    string
	entered int
}

// replayPoints returns the replay points valid now: the start if the
// workflow is replayable from start, then each step marked replayable
// from here that ran; "from here only" and "reset" clear the ones before.
func replayPoints(d workflow.Definition, runs []ran) []point {
	var pts []point
	if d.ReplayPolicy().FromStart {
		pts = append(pts, point{})
	}
	for _, r := range runs {
		if r.hidden {
			continue
		}
		switch r.step.ReplayMark() {
		case workflow.ReplayReset:
			pts = nil
		case workflow.ReplayFromHereOnly:
			pts = []point{{path: r.st.ID, entered: r.st.Entered}}
		case workflow.ReplayFromHere:
			pts = append(pts, point{path: r.st.ID, entered: r.st.Entered})
		}
	}
	return pts
}

// lastBefore returns the last replay point entered no later than entered.
func lastBefore(pts []point, entered int) (point, bool) {
	for i := len(pts) - 1; i >= 0; i-- {
		if pts[i].entered <= entered {
			return pts[i], true
		}
	}
	return point{}, false
}

// planReplay plans a replay from where (resume, last, start, or a step's
// id or path); force ignores idempotency and replay points.
func planReplay(d workflow.Definition, s projections.Execution, from string, force bool) (replayPlan, error) {
	runs := instances(d, s)
	pts := replayPoints(d, runs)
	var p replayPlan
	switch from {
	case events.ReplayStart:
		if !force && (len(pts) == 0 || pts[0].path != "") {
			if d.ReplayPolicy().FromStart {
				return p, refuse("a later step cleared the start as a replay point (replayable: from here only, or reset); replay from last, or force")
			}
			return p, refuse("workflow %s is not replayable from start (say replayable: from start); replay from last, or force", d.Name)
		}
		return startPlan(s), nil
	case events.ReplayLast:
		if len(pts) == 0 {
			return p, refuse("no replay point: no step marked replayable: from here has run (or a later one cleared them), and the workflow is not replayable from start")
		}
		return pointPlan(d, s, pts[len(pts)-1], force)
	case events.ReplayResume, "":
		return resumePlan(d, s, runs, pts, force)
	}
	target, ok := findRun(runs, from)
	if !ok {
		if _, exists := findStep(d, from); exists {
			return p, refuse("step %q has not run in this execution: replay from a step that ran", from)
		}
		return p, refuse("no step %q in workflow %s", from, d.Name)
	}
	if target.hidden {
		return p, refuse("step %s is in on-error steps or in a block that is replayable: disabled; replay from a step around it", target.st.ID)
	}
	if force {
		return pointPlan(d, s, point{path: target.st.ID, entered: target.st.Entered}, true)
	}
	pt, ok := lastBefore(pts, target.st.Entered)
	if !ok {
		return p, refuse("step %s is not a replay point and no replay point ran before it (mark steps replayable: from here, or the workflow replayable: from start); or force", target.st.ID)
	}
	return pointPlan(d, s, pt, false)
}

// resumePlan plans a replay resuming: at the last incomplete step if it
// is idempotent (or forced), else from the last replay point before it.
func resumePlan(d workflow.Definition, s projections.Execution, runs []ran, pts []point, force bool) (replayPlan, error) {
	incomplete := map[string]bool{}
	for _, id := range resetFor(d, s, true, nil) { // unrecovered failures, retries due, operations with the agents
		incomplete[id] = true
	}
	var last *ran
	for i := range runs {
		r := &runs[i]
		switch r.st.Status {
		case projections.OpPending, projections.OpWaiting:
			if workflow.IsContainer(r.st.Kind) {
				continue // its steps say where it is
			}
		default:
			if !incomplete[r.st.ID] {
				continue
			}
		}
		if !r.hidden && (last == nil || r.st.Entered > last.st.Entered) {
			last = r
		}
	}
	if last == nil {
		if s.Status == projections.StatusSucceeded {
			return replayPlan{}, refuse("nothing to resume: the execution succeeded; replay from a step, from last or from start")
		}
		return replayPlan{mode: events.ReplayModeResume, keepVars: true}, nil // it goes on where it stopped
	}
	if force || last.step.IsIdempotent(last.allIdempotent) {
		anc, frame, _ := ancestry(s, last.st.ID)
		p := replayPlan{point: last.st.ID, mode: events.ReplayModeResume, entered: last.st.Entered,
			resume: []string{last.st.ID}, reopen: anc}
		reset := map[string]bool{}
		addDescendants(s, reset, last.st.ID)
		addHandlers(s, reset, frame, anc)
		p.reset = sortedPaths(s, reset)
		return p, nil
	}
	pt, ok := lastBefore(pts, last.st.Entered)
	if !ok {
		return replayPlan{}, refuse("step %s is not idempotent (say idempotent: yes if it may run again) and no replay point ran before it; replay from start, or force", last.st.ID)
	}
	return pointPlan(d, s, pt, false)
}

// startPlan runs every step again from the start, with no variables.
func startPlan(s projections.Execution) replayPlan {
	p := replayPlan{mode: events.ReplayModeReplay}
	for _, st := range s.Steps {
		if st.Status != projections.OpNone {
			p.reset = append(p.reset, st.ID)
		}
	}
	return p
}

// pointPlan replays from a replay point: it and what follows it in its
// list (rounds after a goto included) start over, the containers around
// it are reopened and what follows each of them starts over too, as do
// the on-error steps that ran for those lists. Without force, nothing that
// starts over may still be with an agent.
func pointPlan(d workflow.Definition, s projections.Execution, pt point, force bool) (replayPlan, error) {
	if pt.path == "" {
		p := startPlan(s)
		return p, checkIdle(s, p.reset, force)
	}
	anc, frame, _ := ancestry(s, pt.path)
	reset := map[string]bool{}
	addFollowing(d, s, reset, frame, pt.path, true)
	for _, a := range anc {
		_, af, _ := ancestry(s, a)
		addFollowing(d, s, reset, af, a, false)
	}
	addHandlers(s, reset, frame, anc)
	for id := range reset {
		addDescendants(s, reset, id)
	}
	p := replayPlan{point: pt.path, mode: events.ReplayModeReplay, entered: pt.entered, reopen: anc, reset: sortedPaths(s, reset)}
	return p, checkIdle(s, p.reset, force)
}

// checkIdle refuses to start over an operation still with an agent unless
// forced (its late result is then ignored).
func checkIdle(s projections.Execution, reset []string, force bool) error {
	if force {
		return nil
	}
	for _, id := range reset {
		if st, ok := instanceOf(s, id); ok && st.Status.InFlight() {
			return refuse("step %s is still running on an agent: wait for its result, cancel the execution first, or force", id)
		}
	}
	return nil
}

// addFollowing adds the instances of the list with prefix frame that come
// at (inclusive) or after path: later in the list, or in a later round.
func addFollowing(d workflow.Definition, s projections.Execution, reset map[string]bool, frame, path string, inclusive bool) {
	f, _, ok := resolveFrame(d, s, path)
	if !ok {
		return
	}
	idx, round := position(f.steps, path[len(frame):])
	for _, st := range s.Steps {
		if st.Status == projections.OpNone || !strings.HasPrefix(st.ID, frame) || strings.Contains(st.ID[len(frame):], "/") {
			continue
		}
		i, r := position(f.steps, st.ID[len(frame):])
		if r > round || (r == round && (i > idx || (inclusive && i == idx))) {
			reset[st.ID] = true
		}
	}
}

// position is a list member's index in the list and its round.
func position(steps []workflow.Step, seg string) (int, int) {
	round := 0
	if i := strings.IndexByte(seg, '~'); i >= 0 {
		round, _ = strconv.Atoi(seg[i+1:])
	}
	id := localID(seg)
	return slices.IndexFunc(steps, func(s workflow.Step) bool { return s.ID == id }), round
}

// addDescendants adds the instances nested in instance id (its on-error
// steps, a container's steps) that ran.
func addDescendants(s projections.Execution, reset map[string]bool, id string) {
	for _, st := range s.Steps {
		if st.Status == projections.OpNone || len(st.ID) <= len(id) || !strings.HasPrefix(st.ID, id) {
			continue
		}
		if c := st.ID[len(id)]; c == '/' || c == '@' || c == '[' {
			reset[st.ID] = true
		}
	}
}

// addHandlers adds the instances of the on-error steps of the workflow
// (and of called workflows) around the lists that run again, and those
// of the containers around the point (which are reopened).
func addHandlers(s projections.Execution, reset map[string]bool, frame string, anc []string) {
	frames := []string{frame}
	for _, a := range anc {
		_, af, _ := ancestry(s, a)
		frames = append(frames, af)
	}
	for _, st := range s.Steps {
		if st.Status == projections.OpNone {
			continue
		}
		for _, f := range frames {
			if strings.HasPrefix(st.ID, f+"on-error/") {
				reset[st.ID] = true
			}
		}
		for _, a := range anc { // the on-error steps of a container that failed
			if strings.HasPrefix(st.ID, a+"/on-error") {
				reset[st.ID] = true
			}
		}
	}
}

// sortedPaths lists the set's paths in the order of the state's steps.
func sortedPaths(s projections.Execution, set map[string]bool) []string {
	var out []string
	for _, st := range s.Steps {
		if set[st.ID] {
			out = append(out, st.ID)
		}
	}
	return out
}

// ancestry returns the container instances around a step instance
// (outermost first), the prefix of the list it is in, and whether it is
// in on-error steps.
func ancestry(s projections.Execution, path string) (anc []string, prefix string, inHandler bool) {
	segs := strings.Split(path, "/")
	i := 0
	if len(segs) > 1 && segs[0] == "on-error" {
		prefix, inHandler, i = "on-error/", true, 1
	}
	for ; i < len(segs)-1; i++ {
		seg := segs[i]
		inst := prefix + containerPath(seg)
		next := segs[i+1]
		st, _ := instanceOf(s, inst)
		switch {
		case isHandlerSeg(next) && i+1 < len(segs)-1: // the on-error steps of a failed step
			inHandler = true
			anc = append(anc, inst)
			prefix += seg + "/" + next + "/"
			i++
		case (st.Kind == workflow.KindParallel || st.Kind == workflow.KindSwitch) && i+1 < len(segs)-1:
			anc = append(anc, inst)
			prefix += seg + "/" + next + "/"
			i++
		case st.Kind == workflow.KindWorkflow && next == "on-error" && i+1 < len(segs)-1:
			inHandler = true
			anc = append(anc, inst)
			prefix += seg + "/on-error/"
			i++
		default:
			anc = append(anc, inst)
			prefix += seg + "/"
		}
	}
	return anc, prefix, inHandler
}

// findRun finds the last instance that ran of a step given by its path
// (e.g. blk/x) or its id.
func findRun(runs []ran, from string) (ran, bool) {
	for i := len(runs) - 1; i >= 0; i-- {
		if runs[i].st.ID == from {
			return runs[i], true
		}
	}
	for i := len(runs) - 1; i >= 0; i-- {
		if causeKey(runs[i].st.ID) == from || localID(lastSegment(runs[i].st.ID)) == from {
			return runs[i], true
		}
	}
	return ran{}, false
}

// findStep reports whether the definition has a step with this id (at any depth).
func findStep(d workflow.Definition, id string) (workflow.Step, bool) {
	var walk func([]workflow.Step) (workflow.Step, bool)
	walk = func(steps []workflow.Step) (workflow.Step, bool) {
		for _, s := range steps {
			if s.ID == id {
				return s, true
			}
			lists := [][]workflow.Step{s.Steps, s.Default, s.OnError}
			for _, b := range s.Branches {
				lists = append(lists, b.Steps)
			}
			for _, c := range s.Cases {
				lists = append(lists, c.Steps)
			}
			for _, l := range lists {
				if x, ok := walk(l); ok {
					return x, true
				}
			}
		}
		return workflow.Step{}, false
	}
	return walk(append(slices.Clone(d.Steps), d.OnError...))
}

// causeKey is a step instance's place in the definition: its path without
// rounds, attempts, foreach indexes and on-error attempts (a retry step's
// replays are counted by it).
func causeKey(path string) string {
	segs := strings.Split(path, "/")
	for i, seg := range segs {
		if isHandlerSeg(seg) {
			segs[i] = "on-error"
			continue
		}
		segs[i] = localID(seg)
	}
	return strings.Join(segs, "/")
}

// replaysBy counts the replays a retry step (by its causeKey) asked for.
func replaysBy(s projections.Execution, cause string) int {
	n := 0
	for _, r := range s.Replays {
		if r.Cause == cause {
			n++
		}
	}
	return n
}

// automaticReplays counts the replays jetflow asked itself for.
func automaticReplays(s projections.Execution) int {
	n := 0
	for _, r := range s.Replays {
		if r.Automatic {
			n++
		}
	}
	return n
}

// retryReplay decides a retry step with replay (in on-error steps): while
// its limit allows, it waits for its backoff (if it has one) and then asks
// for a replay from its next (a step, last, or end: resuming); without a
// replay point to go to, it fails.
func (e *engine) retryReplay(step workflow.Step, st projections.Step) action {
	key := causeKey(st.ID)
	n := replaysBy(e.s, key)
	if n+1 >= step.Retry.Limit {
		return action{kind: actStepFail, step: step, path: st.ID, attempt: st.Attempt, final: true,
			err: fmt.Sprintf("no replays left: replayed %d times (limit %d attempts in all)", n, step.Retry.Limit)}
	}
	if e.s.DryRun {
		return action{kind: actStepFail, step: step, path: st.ID, attempt: st.Attempt, final: true, err: "a dry run does not replay"}
	}
	if step.Retry.Backoff != nil {
		fired := timerFired(e.s, events.TimerSleep, st.ID, st.Attempt)
		switch {
		case st.Status == projections.OpPending && !fired:
			return action{kind: actSleep, step: step, path: st.ID, attempt: st.Attempt, delay: step.Retry.Delay(n + 1)}
		case !fired:
			return action{kind: actWait}
		}
	}
	from := events.ReplayLast
	switch step.Next {
	case "", "last":
	case workflow.GotoEnd:
		from = events.ReplayResume
	default:
		from = step.Next
	}
	plan, err := planReplay(e.d, e.s, from, false)
	if err != nil {
		return action{kind: actStepFail, step: step, path: st.ID, attempt: st.Attempt, final: true, err: "replay: " + err.Error()}
	}
	return action{kind: actReplay, step: step, path: st.ID, replay: &replayRequest{plan: plan, from: from, cause: key}}
}

// autoReplay returns the replay resuming of an execution replayable
// automatically whose step st failed because its task was lost (its
// agents died), if one can be done.
func (e *engine) autoReplay(step workflow.Step, st projections.Step) (action, bool) {
	if !st.Lost || e.s.DryRun || !e.d.ReplayPolicy().Automatically || automaticReplays(e.s) >= maxAutomaticReplays {
		return action{}, false
	}
	plan, err := planReplay(e.d, e.s, events.ReplayResume, false)
	if err != nil {
		return action{}, false // the failure stands, and is handled as usual
	}
	return action{kind: actReplay, step: step, path: st.ID, replay: &replayRequest{plan: plan, from: events.ReplayResume, automatic: true}}, true
}

// replayRequest is a replay decided by decide (actReplay) or asked by an
// operator.
type replayRequest struct {
	plan      replayPlan
	from      string
	force     bool
	cause     string
	automatic bool
}

// replay records a replay and makes the execution go on: the variables
// are restored from the history, timers that came due while it was over
// fire, and results that arrived meanwhile are applied.
func (d *Dispatcher) replay(ctx context.Context, x *execState, rec events.ActionRecord, r replayRequest) error {
	vars, err := d.varsAt(ctx, x, r.plan)
	if err != nil {
		return err
	}
	p := &events.ExecutionReplayed{ActionRecord: rec, From: r.from, Force: r.force, Point: r.plan.point, Mode: r.plan.mode,
		Token: newToken(), Resume: r.plan.resume, Reopen: r.plan.reopen, Reset: r.plan.reset, Vars: vars,
		Cause: r.cause, Automatic: r.automatic}
	zerolog.Ctx(ctx).Info().Str("from", r.from).Str("point", r.plan.point).Str("mode", r.plan.mode).Str("cause", r.cause).
		Bool("automatic", r.automatic).Int("reset", len(r.plan.reset)).Msg("execution replayed")
	return d.append(ctx, x, p)
}

// varsAt returns the workflow variables as they were when the replay
// point was entered: the fold of the history's events before it.
func (d *Dispatcher) varsAt(ctx context.Context, x *execState, plan replayPlan) (map[string]json.RawMessage, error) {
	if plan.keepVars {
		return x.state.Vars, nil
	}
	if plan.entered <= 1 {
		return nil, nil
	}
	evs, err := history.Read(ctx, d.js, x.subject(), 0)
	if err != nil {
		return nil, fmt.Errorf("read history for the variables at %s: %w", plan.point, err)
	}
	if len(evs) < plan.entered-1 {
		return nil, fmt.Errorf("history of %s has %d events, the replay point is event %d", x.id, len(evs), plan.entered)
	}
	s, err := projections.Fold(evs[:plan.entered-1])
	if err != nil {
		return nil, permanentError{fmt.Errorf("fold history up to the replay point: %w", err)}
	}
	return s.Vars, nil
}
