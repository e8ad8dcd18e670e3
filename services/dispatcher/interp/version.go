package interp

import (
	"cmp"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/retention"
	"jetflow.dev/pkg/workflow"
)

// Moving an execution to another version of its workflow (TaskFlow's
// resumption with a changed flow). A resume, force-resume or replay that
// names a version first records io.jetflow.execution.definition_changed,
// carrying the new definition, and is then decided as usual against it.
// Steps are matched by id (their paths): an instance the new version
// still has keeps its recorded result; one it has not is retired (its
// result ignored, no expression sees it); a step new in it runs when it
// is reached. The history is never rewritten.

// changeVersion decides an action that moves the execution to cmd.Version
// of its workflow first.
func changeVersion(in Input, cmd ActionCommand) Decision {
	s := in.State
	if !s.Status.Settled() {
		return reject(events.CodeConflict, "execution %q is %s: only an execution that is over or suspended moves to another version "+
			"(cancel it first, or resume it without a version)", in.ID, s.Status)
	}
	ref := CalledRef{Name: in.Workflow} // version 0: the latest
	if cmd.Version != events.LatestVersion {
		ref.Version = int(cmd.Version)
	}
	rec, loaded := in.Called[ref]
	switch {
	case !loaded:
		return Decision{Need: NeedWorkflow{Ref: ref}}
	case rec == nil:
		return reject(events.CodeNotFound, "workflow %s has no version %s: it cannot be resumed or replayed on it", in.Workflow, cmd.Version)
	}
	same := cmd
	same.Version = 0
	if rec.Version == s.Version {
		return Action(in, same) // on that version already
	}
	refuse := func(why string) Decision {
		return reject(events.CodeConflict, "execution %q cannot move from version %d to version %d of %s: %s",
			in.ID, s.Version, rec.Version, in.Workflow, why)
	}
	to := rec.Definition
	if problems := to.CheckInput(s.Input); len(problems) > 0 {
		return refuse(fmt.Sprintf("its input does not fit the new version's input schema: %s %s", problems[0].Field, problems[0].Message))
	}
	moved := moves(to, s)
	for _, st := range s.Steps {
		if to, ok := events.MovedPath(st.ID, moved); ok && st.Status == projections.OpPending && st.ChildStep() {
			// Its child names the step it was started by: moved, the
			// step would no longer be its parent's.
			return refuse(fmt.Sprintf("step %s waits for its child execution %s, and the new version moves it to %s: "+
				"wait for the child's end (resume without a version takes it), or cancel the child", st.ID, childOfStep(st), to))
		}
	}
	inMoved := renamed(s, moved) // the state with the moved instances at their new paths
	retired, why := retire(in.Def, to, inMoved, cmd.Record.Action)
	if why != "" {
		return refuse(why)
	}
	raw, err := json.Marshal(to)
	if err != nil {
		return Decision{Err: err}
	}
	change := &events.DefinitionChanged{ActionRecord: cmd.Record, FromVersion: s.Version, Version: rec.Version,
		Definition: raw, Steps: to.StepRefs(), Moved: moved, Retired: retired}
	if to.Retention != "" && to.Retention != in.Def.Retention {
		// The new version's workflow rule, in the context of the rule in
		// force (as a step's retention: is).
		prev := retention.Default
		if r, err := retention.ParseRule(s.Retention); s.Retention != "" && err == nil {
			prev = r
		}
		if change.Retention, err = to.Retention.Resolve(prev, s.RetentionKey, func() map[string]any { return baseEnvOf(s) }); err != nil {
			return refuse("the new version's retention: " + err.Error())
		}
	}
	next, err := projections.Apply(s, events.Event{Type: change.EventType(), Subject: in.ID, Workflow: in.Workflow,
		Time: in.Now, Data: change})
	if err != nil {
		return Decision{Err: fmt.Errorf("move to version %d: %w", rec.Version, err)}
	}
	after := in
	after.State, after.Def, after.Memo = next, to, nil
	d := Action(after, same)
	if d.Need != nil || d.Reject != nil || d.Err != nil {
		return d
	}
	d.Events = append([]events.Payload{change}, d.Events...)
	// A force-resume gives up the operations it retires: the agents are
	// told to terminate them, once the move is recorded (as for the
	// attempts it runs again).
	for _, id := range retired {
		if st, ok := instanceOf(inMoved, id); ok && st.Status.InFlight() && st.TaskID != "" {
			d.After = append(d.After, PublishKill{TaskID: st.TaskID,
				Reason: fmt.Sprintf("a force-resume moved the execution to version %d, which has no step %s", rec.Version, id)})
		}
	}
	return d
}

// renamed returns s with the moved instances (and those inside them) at
// their new paths, as the fold of the move leaves them.
func renamed(s projections.Execution, moved map[string]string) projections.Execution {
	if len(moved) == 0 {
		return s
	}
	s.Steps = slices.Clone(s.Steps)
	for i := range s.Steps {
		if to, ok := events.MovedPath(s.Steps[i].ID, moved); ok {
			s.Steps[i].ID = to
		}
	}
	return s
}

// retire matches the execution's recorded step instances (s: moved ones
// at their new paths) with version to, by path: it returns those to has
// not (to be retired), or why the move is refused. An operation still
// with an agent that to has not would lose its report: only a
// force-resume gives it up. A step whose kind changes keeps its result
// only if it succeeded (or was skipped): a step whose code changes takes
// a new id. An instance that never ran and whose kind changed is retired
// too, and starts anew as the new kind. A switch that has not finished
// must find the case it chose (from) at the same place in to.
func retire(from, to workflow.Definition, s projections.Execution, action string) (retired []string, why string) {
	for _, st := range s.Steps {
		_, step, ok := resolveFrame(to, s, st.ID)
		switch {
		case !ok && st.Status.InFlight() && action != events.ActionForceResume:
			how := "wait for it; a force-resume (jetflow resume --force) with this version gives it up"
			if action == events.ActionReplay {
				how = "wait for it; a replay cannot give it up, but a force-resume (jetflow resume --force) with this version can, before you replay"
			}
			return nil, fmt.Sprintf("step %s (%s) was sent to an agent and has not reported, and the new version has no step %s: "+
				"its report would be lost; %s", st.ID, cmp.Or(st.Kind, "operation"), st.ID, how)
		case !ok && leftRunning(from, s, st):
			return nil, fmt.Sprintf("step %s waits for its child execution %s, and the new version has no step %s: "+
				"wait for the child's end (resume without a version takes it), or cancel the child", st.ID, childOfStep(st), st.ID)
		case !ok:
			retired = append(retired, st.ID)
		case (st.Kind == "" || step.Kind == st.Kind) && st.Status != projections.OpNone && st.Status != projections.OpSucceeded &&
			st.Status != projections.OpSkipped && st.ChildStep() != (step.Child && step.Workflow != ""):
			return nil, fmt.Sprintf("step %s runs a workflow %s, and the new version runs it %s: "+
				"give a step that changes how it runs a workflow a new id", st.ID, runsAs(st.ChildStep()), runsAs(!st.ChildStep()))
		case st.Kind == "" || step.Kind == st.Kind:
			if why := switchMoved(from, to, s, st, step); why != "" {
				return nil, why
			}
		case st.Status == projections.OpNone:
			retired = append(retired, st.ID)
		case st.Status != projections.OpSucceeded && st.Status != projections.OpSkipped:
			return nil, fmt.Sprintf("step %s was %s %s step and is %s %s step in the new version, and it has not succeeded (%s): "+
				"give a step whose code changes a new id", st.ID, workflow.Article(st.Kind), st.Kind, workflow.Article(step.Kind), step.Kind, st.Status)
		}
	}
	return retired, ""
}

func runsAs(child bool) string {
	if child {
		return "as a child execution"
	}
	return "inline"
}

// switchMoved says why a switch instance st that has not finished cannot
// go on in version to (step): it recorded the case it chose by its place,
// and to has another case there.
func switchMoved(from, to workflow.Definition, s projections.Execution, st projections.Step, step workflow.Step) string {
	if step.Kind != workflow.KindSwitch || st.Status == projections.OpSucceeded || st.Status == projections.OpSkipped || len(st.Input) == 0 {
		return ""
	}
	var rec struct {
		Case int `json:"case"`
	}
	_ = json.Unmarshal(st.Input, &rec)
	old, ok := resolveStep(from, s, st.ID) // not if it moved: refused then, to be safe
	caseAt := func(sw workflow.Step, i int) any {
		if i >= 0 && i < len(sw.Cases) {
			return sw.Cases[i]
		}
		return sw.Default
	}
	if ok && reflect.DeepEqual(caseAt(old, rec.Case), caseAt(step, rec.Case)) {
		return ""
	}
	return fmt.Sprintf("switch %s chose its case %s, and the new version has another case there: "+
		"keep its cases in place, or give the switch a new id", st.ID, caseName(rec.Case))
}

func caseName(i int) string {
	if i < 0 {
		return "default"
	}
	return "case" + strconv.Itoa(i)
}

// moves finds the recorded step instances that version to moved into or
// out of a block (or a parallel branch): an instance that to has not at
// its path, that ended (succeeded, skipped or failed), that no later
// round follows, and whose id is the id of exactly one step of to of the
// same kind, reachable through blocks and branches, which has no
// instance yet. It is moved there, with the instances inside it, keeping
// its result. Only plain paths move: not a foreach item's, a round's
// after a goto, a container's later attempt's, an on-error step's, nor a
// step's in a switch case (the case is recorded by its place). A move is
// not made (before 2026-12-05 each was) that would put two instances on
// one path (one inside it landing where an instance is, or where
// another move puts one), that would carry an instance inside it that
// moves already (listed before it, after an earlier move: events.MovedPath
// moves it by the outer one, away from its own move), or that would land
// on the path of a retired instance (the instance moved there keeps its
// attempts, and would send its tasks again under the retired one's ids).
func moves(to workflow.Definition, s projections.Execution) map[string]string {
	var moved map[string]string
	var where map[string][]string // id -> the plain paths of to's steps with it
	taken := map[string]bool{}
	// occupied: an instance, another move's landing, or a retired
	// instance's attempts are at path.
	occupied := func(path string) bool {
		return taken[path] || s.StepIndex(path) >= 0 || s.RetiredAttempts(path) > 0
	}
	for _, st := range s.Steps {
		if _, ok := events.MovedPath(st.ID, moved); ok || !plainPath(st.ID) {
			continue
		}
		switch st.Status {
		case projections.OpSucceeded, projections.OpSkipped, projections.OpFailed:
		default:
			continue
		}
		if _, _, ok := resolveFrame(to, s, st.ID); ok || hasRounds(s, st.ID) || st.Kind == workflow.KindSwitch && st.Status == projections.OpFailed {
			continue
		}
		if where == nil {
			where = map[string][]string{}
			plainPaths(to.Steps, "", where)
		}
		cands := where[lastSegment(st.ID)]
		if len(cands) != 1 || occupied(cands[0]) || holdsAMove(moved, st.ID) {
			continue
		}
		if step, ok := resolveStep(to, s, cands[0]); !ok || step.Kind != st.Kind {
			continue
		}
		inside := movedInside(s, st.ID, cands[0])
		if slices.ContainsFunc(inside, occupied) {
			continue
		}
		if moved == nil {
			moved = map[string]string{}
		}
		moved[st.ID], taken[cands[0]] = cands[0], true
		for _, p := range inside {
			taken[p] = true
		}
	}
	return moved
}

// holdsAMove reports whether a move of moved is of an instance inside
// the one at path.
func holdsAMove(moved map[string]string, path string) bool {
	for from := range moved {
		if strings.HasPrefix(from, path+"/") {
			return true
		}
	}
	return false
}

// movedInside returns the paths the instances in the frames of the one at
// from take when it moves to to (those whose paths go on by a /: the
// others events.MovedPath moves with it, a later attempt's @n and a
// foreach item's [i], land under paths of their own).
func movedInside(s projections.Execution, from, to string) []string {
	var out []string
	for _, st := range s.Steps {
		if rest, ok := strings.CutPrefix(st.ID, from+"/"); ok {
			out = append(out, to+"/"+rest)
		}
	}
	return out
}

// hasRounds reports whether a later round of the instance at path ran (a
// goto came back to it): its latest round is not the one that would move.
func hasRounds(s projections.Execution, path string) bool {
	return slices.ContainsFunc(s.Steps, func(st projections.Step) bool { return strings.HasPrefix(st.ID, path+"~") })
}

// plainPaths adds the paths of steps (under prefix) to where, by id,
// through blocks and parallel branches.
func plainPaths(steps []workflow.Step, prefix string, where map[string][]string) {
	for _, st := range steps {
		p := prefix + st.ID
		where[st.ID] = append(where[st.ID], p)
		switch {
		case st.Kind == workflow.KindWorkflow && st.Workflow == "":
			plainPaths(st.Steps, p+"/", where)
		case st.Kind == workflow.KindParallel:
			for _, b := range st.Branches {
				plainPaths(b.Steps, p+"/"+b.ID+"/", where)
			}
		}
	}
}

// plainPath reports whether path names a step by ids alone: no foreach
// index, round, container attempt or on-error steps.
func plainPath(path string) bool {
	return !strings.ContainsAny(path, "[~@") && !strings.Contains("/"+path, "/on-error")
}
