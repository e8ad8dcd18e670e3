package interp

import (
	"cmp"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
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
	moved := moves(rec.Definition, s)
	retired, why := retire(rec.Definition, s, moved, cmd.Record.Action)
	if why != "" {
		return reject(events.CodeConflict, "execution %q cannot move from version %d to version %d of %s: %s",
			in.ID, s.Version, rec.Version, in.Workflow, why)
	}
	raw, err := json.Marshal(rec.Definition)
	if err != nil {
		return Decision{Err: err}
	}
	change := &events.DefinitionChanged{ActionRecord: cmd.Record, FromVersion: s.Version, Version: rec.Version,
		Definition: raw, Steps: rec.Definition.StepRefs(), Moved: moved, Retired: retired}
	next, err := projections.Apply(s, events.Event{Type: change.EventType(), Subject: in.ID, Workflow: in.Workflow,
		Time: in.Now, Data: change})
	if err != nil {
		return Decision{Err: fmt.Errorf("move to version %d: %w", rec.Version, err)}
	}
	after := in
	after.State, after.Def, after.Memo = next, rec.Definition, nil
	d := Action(after, same)
	if d.Need != nil || d.Reject != nil || d.Err != nil {
		return d
	}
	d.Events = append([]events.Payload{change}, d.Events...)
	return d
}

// retire matches the execution's recorded step instances with version
// to, by path: it returns those to has not (to be retired), or why the
// move is refused. An operation still with an agent that to has not would
// lose its report: only a force-resume gives it up. A step whose kind
// changes keeps its result only if it succeeded (or was skipped): a step
// whose code changes takes a new id. An instance that never ran and whose
// kind changed is retired too, and starts anew as the new kind.
func retire(to workflow.Definition, s projections.Execution, moved map[string]string, action string) (retired []string, why string) {
	for _, st := range s.Steps {
		if _, ok := events.MovedPath(st.ID, moved); ok {
			continue
		}
		_, step, ok := resolveFrame(to, s, st.ID)
		switch {
		case !ok && st.Status.InFlight() && action != events.ActionForceResume:
			return nil, fmt.Sprintf("step %s (%s) was sent to an agent and has not reported, and the new version has no step %s: "+
				"its report would be lost; wait for it, or force-resume to give it up", st.ID, cmp.Or(st.Kind, "operation"), st.ID)
		case !ok:
			retired = append(retired, st.ID)
		case st.Kind == "" || step.Kind == st.Kind:
		case st.Status == projections.OpNone:
			retired = append(retired, st.ID)
		case st.Status != projections.OpSucceeded && st.Status != projections.OpSkipped:
			return nil, fmt.Sprintf("step %s was %s %s step and is %s %s step in the new version, and it has not succeeded (%s): "+
				"give a step whose code changes a new id", st.ID, workflow.Article(st.Kind), st.Kind, workflow.Article(step.Kind), step.Kind, st.Status)
		}
	}
	return retired, ""
}

// moves finds the recorded step instances that version to moved into or
// out of a block (or a parallel branch, or a switch case): an instance
// that to has not at its path, that ended (succeeded, skipped or failed),
// and whose id is the id of exactly one step of to of the same kind,
// reachable through blocks, branches and cases, which has no instance
// yet. It is moved there, with the instances inside it, keeping its
// result. Only plain paths move: not a foreach item's, a round's after a
// goto, a container's later attempt's, nor an on-error step's.
func moves(to workflow.Definition, s projections.Execution) map[string]string {
	var moved map[string]string
	var where map[string][]string // id -> the plain paths of to's steps with it
	taken := map[string]bool{}
	for _, st := range s.Steps {
		if _, ok := events.MovedPath(st.ID, moved); ok || !plainPath(st.ID) {
			continue
		}
		switch st.Status {
		case projections.OpSucceeded, projections.OpSkipped, projections.OpFailed:
		default:
			continue
		}
		if _, _, ok := resolveFrame(to, s, st.ID); ok {
			continue
		}
		if where == nil {
			where = map[string][]string{}
			plainPaths(to.Steps, "", where)
		}
		cands := where[lastSegment(st.ID)]
		if len(cands) != 1 || taken[cands[0]] || s.StepIndex(cands[0]) >= 0 {
			continue
		}
		if step, ok := resolveStep(to, s, cands[0]); !ok || step.Kind != st.Kind {
			continue
		}
		if moved == nil {
			moved = map[string]string{}
		}
		moved[st.ID], taken[cands[0]] = cands[0], true
	}
	return moved
}

// plainPaths adds the paths of steps (under prefix) to where, by id,
// through blocks, parallel branches and switch cases.
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
		case st.Kind == workflow.KindSwitch:
			for i, c := range st.Cases {
				plainPaths(c.Steps, p+"/case"+strconv.Itoa(i)+"/", where)
			}
			plainPaths(st.Default, p+"/default/", where)
		}
	}
}

// plainPath reports whether path names a step by ids alone: no foreach
// index, round, container attempt or on-error steps.
func plainPath(path string) bool {
	return !strings.ContainsAny(path, "[~@") && !strings.Contains("/"+path, "/on-error")
}
