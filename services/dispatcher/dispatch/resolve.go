package dispatch

import (
	"encoding/json"
	"strconv"
	"strings"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// resolveStep finds the definition of a step instance from its path:
// "id" at the top level, "blk/id" in a workflow block or a called
// workflow (whose definition was recorded when it was scheduled),
// "each[3]/id" in a foreach, "par/branch/id" in a parallel,
// "sw/case1/id" or "sw/default/id" in a switch.
func resolveStep(d workflow.Definition, s projections.Execution, path string) (workflow.Step, bool) {
	segs := strings.Split(path, "/")
	steps := d.Steps
	for i := 0; i < len(segs); i++ {
		id := localID(segs[i])
		if j := strings.IndexByte(id, '['); j > 0 {
			id = id[:j]
		}
		var cur workflow.Step
		found := false
		for _, st := range steps {
			if st.ID == id {
				cur, found = st, true
				break
			}
		}
		if !found {
			return workflow.Step{}, false
		}
		if i == len(segs)-1 {
			return cur, true
		}
		switch cur.Kind {
		case workflow.KindForeach:
			steps = cur.Steps
		case workflow.KindWorkflow:
			if cur.Workflow == "" {
				steps = cur.Steps
				break
			}
			idx := s.StepIndex(strings.Join(segs[:i+1], "/"))
			if idx < 0 {
				return workflow.Step{}, false
			}
			var called struct {
				Definition workflow.Definition `json:"definition"`
			}
			if json.Unmarshal(s.Steps[idx].Input, &called) != nil {
				return workflow.Step{}, false
			}
			steps = called.Definition.Steps
		case workflow.KindParallel:
			i++
			if i >= len(segs) {
				return workflow.Step{}, false
			}
			steps = nil
			for _, b := range cur.Branches {
				if b.ID == segs[i] {
					steps = b.Steps
				}
			}
		case workflow.KindSwitch:
			i++
			if i >= len(segs) {
				return workflow.Step{}, false
			}
			if segs[i] == "default" {
				steps = cur.Default
			} else if n, err := strconv.Atoi(strings.TrimPrefix(segs[i], "case")); err == nil && n >= 0 && n < len(cur.Cases) {
				steps = cur.Cases[n].Steps
			} else {
				return workflow.Step{}, false
			}
		default:
			return workflow.Step{}, false
		}
	}
	return workflow.Step{}, false
}
