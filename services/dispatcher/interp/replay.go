package interp

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"jetflow.dev/pkg/events"
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
	// point is the instance the execution goes on from ("" = the start);
	// mode is how.
	point string
	mode  string
	// resume, reopen and reset: see events.ExecutionReplayed.
	resume, reopen, reset []string
	// entered is the point's entry event: the variables are those of the
	// events before it. 0 means none (the start).
	entered int
}

// replayRefused is a replay that cannot be done as asked: the operator is
// told why (and the command rejected), a retry step fails with it.
type replayRefused struct {
	// why, with what the workflow or the execution would need for it
	why string
	// instead, for an operator: the replays of this execution accepted
	// now ([alternatives]), tried rather than guessed.
	instead string
}

func (e *replayRefused) Error() string {
	if e.instead == "" {
		return e.why
	}
	return e.why + "; " + e.instead
}

func refuse(format string, args ...any) error {
	return &replayRefused{why: fmt.Sprintf(format, args...)}
}

// alternativesMax is the most step instances of an execution whose
// refused replay tries the others: each try plans a replay, which takes
// seconds on executions of thousands of instances, in the partition's
// turn.
const alternativesMax = 1000

// alternatives says which replays of the execution are accepted now in
// place of ask, which was refused: from resume, from last and from start,
// each unforced if it is accepted so, else forced, and ask itself forced.
// Each is planned as it would be asked, and only those planned without a
// refusal are named: a suggestion is never refused in turn.
func alternatives(d workflow.Definition, s projections.Execution, ask replayAsk) string {
	if len(s.Steps) > alternativesMax {
		return fmt.Sprintf("(other replays are not tried for an execution of %d step instances: ask from resume, last or start)", len(s.Steps))
	}
	asked := cmp.Or(ask.from, events.ReplayResume)
	runs := instances(d, s)
	pts := replayPoints(d, runs)
	accepted := func(from string, force bool) bool {
		alt := ask
		alt.from, alt.force = from, force
		_, err := planWith(d, s, runs, pts, alt)
		return err == nil
	}
	named := []string{events.ReplayResume, events.ReplayLast, events.ReplayStart}
	var ok []string
	for _, from := range named {
		switch {
		case from != asked && accepted(from, false):
			ok = append(ok, "from "+from)
		case (from != asked || !ask.force) && accepted(from, true):
			ok = append(ok, "from "+from+" with force")
		}
	}
	if !slices.Contains(named, asked) && !ask.force && accepted(asked, true) { // a step
		ok = append(ok, "from "+asked+" with force")
	}
	switch len(ok) {
	case 0:
		return "no replay of this execution is accepted now, forced or not"
	case 1:
		return "accepted now: replay " + ok[0]
	}
	return "accepted now: replay " + strings.Join(ok[:len(ok)-1], ", ") + " or " + ok[len(ok)-1]
}

// ran is a step instance that ran (or runs) in the execution as it is now.
type ran struct {
	st   projections.Step
	step workflow.Step
	// hidden: in on-error steps, or in a block replayable: disabled;
	// neither a replay point nor a place to resume at.
	hidden bool
	// allIdempotent: the workflow (or the called workflow, or a block
	// around it) says idempotent: all.
	allIdempotent bool
}

// instances returns the step instances of the current run that ran, in
// the order they were entered: not those of an earlier attempt of a
// container or of an earlier attempt's on-error steps.
func instances(d workflow.Definition, s projections.Execution) []ran {
	var out []ran
	for _, st := range s.Steps {
		if st.Status == projections.OpNone || st.Entered == 0 || !current(s, st.ID) || inCompensation(st.ID) {
			continue // compensate steps are not the run's: a replay neither goes to nor resumes at them
		}
		step, ok := resolveStep(d, s, st.ID)
		if !ok {
			continue // not in the pinned definition
		}
		anc, _, inHandler := ancestry(s, st.ID)
		r := ran{st: st, step: step, hidden: inHandler, allIdempotent: d.IdempotentAll()}
		for _, a := range anc {
			as, ok := resolveStep(d, s, a)
			if !ok {
				continue
			}
			r.hidden = r.hidden || as.ReplayDisabled()
			switch {
			case as.Kind == workflow.KindWorkflow && as.Workflow != "": // idempotent: all does not reach into a called workflow
				r.allIdempotent = calledDefinition(s, a).IdempotentAll()
			case as.IdempotentAll():
				r.allIdempotent = true
			}
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(a, b ran) int { return a.st.Entered - b.st.Entered })
	return out
}

// calledDefinition is the definition a call step's instance recorded.
func calledDefinition(s projections.Execution, inst string) workflow.Definition {
	st, _ := instanceOf(s, inst)
	var called struct {
		Definition workflow.Definition `json:"definition"`
	}
	_ = json.Unmarshal(st.Input, &called)
	return called.Definition
}

// current reports whether a step instance belongs to the current attempt
// of every container and failed step around it.
func current(s projections.Execution, path string) bool {
	if staleHandler(s, path, nil) {
		return false
	}
	segs := strings.Split(path, "/")
	prefix := ""
	for _, seg := range segs[:len(segs)-1] {
		if seg == "on-error" || isHandlerSeg(seg) {
			prefix += seg + "/"
			continue
		}
		if st, ok := instanceOf(s, prefix+containerPath(seg)); ok && workflow.IsContainer(st.Kind) {
			attempt := 1
			if i := strings.IndexByte(seg, '@'); i >= 0 {
				attempt, _ = strconv.Atoi(digitsAfter(seg[i+1:]))
			}
			if attempt != max(st.Attempt, 1) {
				return false
			}
		}
		prefix += seg + "/"
	}
	return true
}

// digitsAfter returns the leading digits of s (a container attempt, before
// a foreach index).
func digitsAfter(s string) string {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	return s[:i]
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

// replayAsk is what a replay is asked to do.
type replayAsk struct {
	from  string
	force bool
	// step, for a replay asked for a failed step (by a retry step in its
	// on-error steps, or after its task was lost), is that step's
	// instance: resuming resumes at it, and the replay point must lead
	// to it again.
	step string
	// settled are operations with the agents whose result is already
	// stored: they are not running any more.
	settled map[string]bool
}

// planReplay plans a replay.
func planReplay(d workflow.Definition, s projections.Execution, ask replayAsk) (replayPlan, error) {
	runs := instances(d, s)
	return planWith(d, s, runs, replayPoints(d, runs), ask)
}

// planWith plans a replay with the execution's step instances and replay
// points worked out (the costly part of a plan, on a large execution).
func planWith(d workflow.Definition, s projections.Execution, runs []ran, pts []point, ask replayAsk) (replayPlan, error) {
	var p replayPlan
	switch ask.from {
	case events.ReplayStart:
		if !ask.force && (len(pts) == 0 || pts[0].path != "") {
			if d.ReplayPolicy().FromStart {
				return p, refuse("a later step cleared the start as a replay point (replayable: from here only, or reset)")
			}
			return p, refuse("workflow %s is not replayable from start (say replayable: from start)", d.Name)
		}
		p = startPlan(s)
		return p, checkIdle(d, s, p.reset, ask)
	case events.ReplayLast:
		if ask.step != "" {
			return pointBefore(d, s, pts, ask, ask.step, 0)
		}
		if len(pts) == 0 {
			return p, refuse("no replay point: no step marked replayable: from here has run (or a later one cleared them), and the workflow is not replayable from start")
		}
		return pointPlan(d, s, pts[len(pts)-1], ask)
	case events.ReplayResume, "":
		return resumePlan(d, s, runs, pts, ask)
	}
	target, ok := findRun(runs, ask.from)
	if !ok {
		if _, exists := findStep(d, ask.from); exists {
			return p, refuse("step %q has not run in this execution", ask.from)
		}
		return p, refuse("no step %q in workflow %s", ask.from, d.Name)
	}
	if target.hidden {
		return p, refuse("step %s is in on-error steps or in a block that is replayable: disabled: no replay goes back to it", target.st.ID)
	}
	if ask.force {
		return pointPlan(d, s, point{path: target.st.ID, entered: target.st.Entered}, ask)
	}
	return pointBefore(d, s, pts, ask, target.st.ID, target.st.Entered)
}

// pointBefore plans a replay from the last replay point (entered no later
// than upTo, if not 0) from which the execution comes to instance path
// again: one in its list before it, before a container around it, or
// inside it (a container).
func pointBefore(d workflow.Definition, s projections.Execution, pts []point, ask replayAsk, path string, upTo int) (replayPlan, error) {
	for i := len(pts) - 1; i >= 0; i-- {
		if upTo > 0 && pts[i].entered > upTo {
			continue
		}
		p, err := pointPlan(d, s, pts[i], ask)
		if err != nil {
			return p, err
		}
		if pts[i].path == path || slices.Contains(p.reset, path) || slices.Contains(p.reopen, path) { // before it, or inside it
			return p, nil
		}
	}
	return replayPlan{}, refuse("no replay point before step %s leads to it again (mark a step before it replayable: from here, or the workflow replayable: from start)", path)
}

// resumePlan plans a replay resuming: at the last incomplete step if it
// is idempotent (or forced), else from the last replay point before it.
func resumePlan(d workflow.Definition, s projections.Execution, runs []ran, pts []point, ask replayAsk) (replayPlan, error) {
	var last *ran
	for i := range runs {
		r := &runs[i]
		if ask.step != "" {
			if r.st.ID == ask.step {
				last = r
			}
			continue
		}
		if r.hidden || !incomplete(r.st) || (last != nil && r.st.Entered < last.st.Entered) {
			continue
		}
		last = r
	}
	if last == nil {
		return replayPlan{}, refuse("nothing to resume: no step is incomplete")
	}
	idempotent := last.step.IsIdempotent(last.allIdempotent) && !last.hidden
	if workflow.IsContainer(last.st.Kind) && hasChildren(s, last.st.ID) {
		idempotent = false // what failed inside it is hidden from replays (replayable: disabled)
	}
	if !ask.force && !idempotent {
		if len(pts) == 0 {
			return replayPlan{}, refuse("step %s is not idempotent (say idempotent: yes if it may run again) and no replay point ran before it", last.st.ID)
		}
		return pointBefore(d, s, pts, ask, last.st.ID, last.st.Entered)
	}
	if !ask.force && last.st.Status.InFlight() && !ask.settled[last.st.ID] {
		return replayPlan{}, refuse("step %s is still running on an agent: wait for its result, or cancel the execution first", last.st.ID)
	}
	if err := checkIdle(d, s, []string{last.st.ID}, replayAsk{force: true}); err != nil { // a child it waits for
		return replayPlan{}, err
	}
	anc, frame, _ := ancestry(s, last.st.ID)
	p := replayPlan{point: last.st.ID, mode: events.ReplayModeResume, entered: last.st.Entered,
		resume: []string{last.st.ID}, reopen: anc}
	reset := map[string]bool{}
	if !workflow.IsContainer(last.st.Kind) { // a container resumed keeps what ran in it
		addDescendants(s, reset, last.st.ID)
	}
	addHandlers(s, reset, frame, anc)
	p.reset = sortedPaths(s, reset)
	return p, nil
}

// incomplete reports whether a step instance has yet to finish: it
// failed, waits for a retry, a timer or a signal, or is with the agents.
// Containers say so only when they failed (their steps say where they are).
func incomplete(st projections.Step) bool {
	switch st.Status {
	case projections.OpFailed:
		return true
	case projections.OpPending, projections.OpWaiting, projections.OpRescheduled:
		return !workflow.IsContainer(st.Kind) || st.ChildStep() // a child step waits as an operation does
	}
	return st.Status.InFlight()
}

func hasChildren(s projections.Execution, id string) bool {
	set := map[string]bool{}
	addDescendants(s, set, id)
	return len(set) > 0
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
func pointPlan(d workflow.Definition, s projections.Execution, pt point, ask replayAsk) (replayPlan, error) {
	if pt.path == "" {
		p := startPlan(s)
		return p, checkIdle(d, s, p.reset, ask)
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
	return p, checkIdle(d, s, p.reset, ask)
}

// checkIdle refuses to start over an operation still with an agent unless
// forced (its late result is then ignored), and a step waiting for a
// child execution that must not be left running.
func checkIdle(d workflow.Definition, s projections.Execution, reset []string, ask replayAsk) error {
	for _, id := range reset { // forced or not: a child runs on its own, and would be left running
		if st, ok := instanceOf(s, id); ok && leftRunning(d, s, st) {
			return refuse("step %s waits for its child execution %s, which its parent must stop when it ends (on_parent_end: cancel): "+
				"wait for the child's end, or cancel the child, before replaying over it", id, childOfStep(st))
		}
	}
	if ask.force {
		return nil
	}
	for _, id := range reset {
		if st, ok := instanceOf(s, id); ok && st.Status.InFlight() && !ask.settled[id] {
			return refuse("step %s is still running on an agent: wait for its result, or cancel the execution first", id)
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

// findRun finds the last run of a step given by its id (e.g. x), its
// place (blk/x) or an instance's exact path (x~1, blk@2/x): of a step
// that ran several times (a goto's rounds, a container's attempts), the
// latest; a step's run before one in on-error steps with the same id.
func findRun(runs []ran, from string) (ran, bool) {
	if strings.ContainsAny(from, "~@[") {
		for i := len(runs) - 1; i >= 0; i-- {
			if runs[i].st.ID == from {
				return runs[i], true
			}
		}
	}
	var found *ran
	for i := len(runs) - 1; i >= 0; i-- {
		r := &runs[i]
		if causeKey(r.st.ID) != from && localID(lastSegment(r.st.ID)) != from {
			continue
		}
		if !r.hidden {
			return *r, true
		}
		if found == nil {
			found = r
		}
	}
	if found != nil {
		return *found, true
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
// rounds, container attempts and on-error attempts, with its foreach
// indexes (a retry step's replays are counted by it, per item).
func causeKey(path string) string {
	segs := strings.Split(path, "/")
	for i, seg := range segs {
		if isHandlerSeg(seg) {
			segs[i] = "on-error"
			continue
		}
		index := ""
		if j := strings.IndexByte(seg, '['); j >= 0 {
			index = seg[j:]
		}
		segs[i] = localID(seg) + index
	}
	return strings.Join(segs, "/")
}

// replaysBy counts the replays a retry step (by its causeKey) asked for
// since an operator last replayed the execution: an operator's replay
// gives retry steps their count afresh, as a resume does.
func replaysBy(s projections.Execution, cause string) int {
	n := 0
	for _, r := range s.Replays {
		switch {
		case r.Cause == cause:
			n++
		case r.Cause == "" && !r.Automatic:
			n = 0
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
	if e.noReplay {
		return action{kind: actWait}
	}
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
	plan, err := planReplay(e.d, e.s, replayAsk{from: from, step: failedOwner(e.d, e.s, st.ID)})
	if err != nil {
		return action{kind: actStepFail, step: step, path: st.ID, attempt: st.Attempt, final: true, err: "replay: " + err.Error()}
	}
	return action{kind: actReplay, step: step, path: st.ID, replay: &replayRequest{plan: plan, from: from, cause: key}}
}

// autoReplay returns the replay resuming of an execution replayable
// automatically whose step st failed because its task was lost (its
// agents died), if one can be done.
func (e *engine) autoReplay(step workflow.Step, st projections.Step) (action, bool) {
	if e.noReplay || !st.Lost || e.s.DryRun || !e.d.ReplayPolicy().Automatically || automaticReplays(e.s) >= maxAutomaticReplays ||
		inCompensation(st.ID) {
		return action{}, false
	}
	plan, err := planReplay(e.d, e.s, replayAsk{from: events.ReplayResume, step: st.ID})
	if err != nil {
		return action{}, false // the failure stands, and is handled as usual
	}
	return action{kind: actReplay, step: step, path: st.ID, replay: &replayRequest{plan: plan, from: events.ReplayResume, automatic: true}}, true
}

// failedOwner returns the failed step whose on-error steps hold the
// instance at path: the step that owns them, or for the workflow's (or a
// called workflow's) on-error steps, the last failed step of its steps.
func failedOwner(d workflow.Definition, s projections.Execution, path string) string {
	segs := strings.Split(path, "/")
	for i := len(segs) - 2; i >= 0; i-- {
		switch {
		case isHandlerSeg(segs[i]):
			return strings.Join(segs[:i], "/")
		case segs[i] == "on-error":
			within := strings.Join(segs[:i], "/")
			if within != "" {
				within += "/"
			}
			last := ""
			for _, r := range instances(d, s) {
				if !r.hidden && r.st.Status == projections.OpFailed && strings.HasPrefix(r.st.ID, within) {
					last = r.st.ID
				}
			}
			return last
		}
	}
	return ""
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
