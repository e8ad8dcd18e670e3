package interp

import (
	"encoding/json"
	"strconv"
	"strings"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// resolveStep finds the definition of a step instance from its path.
func resolveStep(d workflow.Definition, s projections.Execution, path string) (workflow.Step, bool) {
	_, step, ok := resolveFrame(d, s, path)
	return step, ok
}

// resolveFrame finds a step instance's definition and the frame it runs
// in (its prefix, sibling steps, extra expression roots and default retry
// policy) from its path: "id" at the top level, "blk/id" in a workflow
// block or a called workflow (whose definition was recorded when it was
// scheduled), "each[3]/id" in a foreach, "par/branch/id" in a parallel,
// "sw/case1/id" or "sw/default/id" in a switch, "id/on-error2/h" in the
// on-error steps of a failed step, "on-error/h" in the workflow's; "~r"
// marks a round after a goto, "@a" a container's attempt.
func resolveFrame(d workflow.Definition, s projections.Execution, path string) (frame, workflow.Step, bool) {
	segs := strings.Split(path, "/")
	f := frame{steps: d.Steps, retry: d.Retry}
	if len(segs) > 1 && segs[0] == "on-error" { // the workflow's on-error steps
		// The error they see is the failure of the workflow's steps, as
		// decide computes it.
		msg := lookingEngine(d, s).run(frame{steps: d.Steps, retry: d.Retry}).err
		f = f.child("on-error/", d.OnError, map[string]any{"error": map[string]any{"message": msg}})
		f.handler = true
		segs = segs[1:]
	}
	for i := 0; i < len(segs); i++ {
		seg := segs[i]
		cur, ok := stepOf(f.steps, localID(seg))
		if !ok {
			return frame{}, workflow.Step{}, false
		}
		if i == len(segs)-1 {
			return f, cur, true
		}
		inst := f.prefix + containerPath(seg)
		next := segs[i+1]
		if isCompensateSeg(next) && len(cur.Compensate) > 0 { // the step's compensate steps
			f = f.child(inst+"/"+next+"/", cur.Compensate, compensatingRoot(s, inst))
			i++
			continue
		}
		if strings.HasPrefix(next, "on-error") && len(cur.OnError) > 0 && isHandlerSeg(next) {
			attempt, _ := strconv.Atoi(strings.TrimPrefix(next, "on-error"))
			st, _ := instanceOf(s, inst)
			f = f.child(inst+"/"+next+"/", cur.OnError, map[string]any{"error": map[string]any{
				"message": st.Error, "step": localID(lastSegment(inst)), "attempt": float64(attempt - st.RetryBase)}})
			f.handler = true
			i++
			continue
		}
		switch cur.Kind {
		case workflow.KindForeach:
			st, _ := instanceOf(s, inst)
			var rec struct {
				Items []any `json:"items"`
			}
			_ = json.Unmarshal(st.Input, &rec)
			idx := -1
			if j := strings.IndexByte(seg, '['); j > 0 {
				idx, _ = strconv.Atoi(strings.TrimSuffix(seg[j+1:], "]"))
			}
			var item any
			if idx >= 0 && idx < len(rec.Items) {
				item = rec.Items[idx]
			}
			f = f.child(f.prefix+seg+"/", cur.Steps, map[string]any{"item": item, "index": float64(idx)})
		case workflow.KindWorkflow:
			if cur.Workflow == "" {
				f = f.child(f.prefix+seg+"/", cur.Steps, nil)
				break
			}
			st, _ := instanceOf(s, inst)
			var called struct {
				Definition workflow.Definition `json:"definition"`
				Input      json.RawMessage     `json:"input"`
			}
			if json.Unmarshal(st.Input, &called) != nil {
				return frame{}, workflow.Step{}, false
			}
			f = f.child(f.prefix+seg+"/", called.Definition.Steps, map[string]any{"input": orObject(decode(called.Input))})
			f.retry = called.Definition.Retry
			if next == "on-error" { // the called workflow's own on-error steps
				msg := lookingEngine(d, s).run(f).err // the called workflow's failure, as decide computes it
				f = f.child(f.prefix+"on-error/", called.Definition.OnError, map[string]any{"error": map[string]any{"message": msg}})
				f.handler = true
				i++
			}
		case workflow.KindParallel:
			i++
			b, ok := branchOf(cur.Branches, next)
			if !ok {
				return frame{}, workflow.Step{}, false
			}
			f = f.child(f.prefix+seg+"/"+next+"/", b.Steps, nil)
		case workflow.KindSwitch:
			i++
			var steps []workflow.Step
			if next == "default" {
				steps = cur.Default
			} else if n, err := strconv.Atoi(strings.TrimPrefix(next, "case")); err == nil && n >= 0 && n < len(cur.Cases) {
				steps = cur.Cases[n].Steps
			} else {
				return frame{}, workflow.Step{}, false
			}
			f = f.child(f.prefix+seg+"/"+next+"/", steps, nil)
		default:
			return frame{}, workflow.Step{}, false
		}
	}
	return frame{}, workflow.Step{}, false
}

// containerPath is a path segment without the foreach index and the
// container attempt: the container instance's own last part.
func containerPath(seg string) string {
	if j := strings.IndexAny(seg, "[@"); j > 0 {
		return seg[:j]
	}
	return seg
}

func isHandlerSeg(seg string) bool {
	_, err := strconv.Atoi(strings.TrimPrefix(seg, "on-error"))
	return err == nil
}

func instanceOf(s projections.Execution, path string) (projections.Step, bool) {
	if i := s.StepIndex(path); i >= 0 {
		return s.Steps[i], true
	}
	return projections.Step{}, false
}

func stepOf(steps []workflow.Step, id string) (workflow.Step, bool) {
	for _, s := range steps {
		if s.ID == id {
			return s, true
		}
	}
	return workflow.Step{}, false
}

func branchOf(branches []workflow.Branch, id string) (workflow.Branch, bool) {
	for _, b := range branches {
		if b.ID == id {
			return b, true
		}
	}
	return workflow.Branch{}, false
}
