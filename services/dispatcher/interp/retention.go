package interp

import (
	"fmt"
	"strings"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/expression"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/retention"
	"jetflow.dev/pkg/workflow"
)

// StartRetention is the retention an execution of d starts with, recorded
// in ExecutionStarted: the workflow's rule with context meaning parent
// (nothing came before), and its hash key rendered over the start (input
// and workflow metadata). It is nil when the workflow sets no retention.
func StartRetention(d workflow.Definition, x projections.Execution) (*events.Retention, error) {
	if d.Retention == "" {
		return nil, nil
	}
	return resolveRetention(string(d.Retention), retention.Default, "", func() map[string]any { return envOf(x) })
}

func stepsMayRetain(steps []workflow.Step) bool {
	for _, st := range steps {
		if st.Retention != "" || st.Workflow != "" || stepsMayRetain(st.Steps) || stepsMayRetain(st.OnError) || stepsMayRetain(st.Default) {
			return true
		}
		for _, b := range st.Branches {
			if stepsMayRetain(b.Steps) {
				return true
			}
		}
		for _, c := range st.Cases {
			if stepsMayRetain(c.Steps) {
				return true
			}
		}
	}
	return false
}

// resolveRetention reads a retention: field in the context of the rule
// and key in force before it.
func resolveRetention(text string, prev retention.Rule, prevKey string, env func() map[string]any) (*events.Retention, error) {
	spec, err := retention.Parse(text)
	if err != nil { // validated when the definition was applied
		return nil, fmt.Errorf("retention: %w", err)
	}
	out := &events.Retention{Rule: spec.Rule.InContext(prev).String(), Key: prevKey}
	if spec.Hash == "" {
		return out, nil
	}
	key, err := expression.RenderString(spec.Hash, env())
	if err != nil {
		return nil, fmt.Errorf("retention hash: %w", err)
	}
	key = strings.TrimSpace(key)
	switch {
	case key == "":
		return nil, fmt.Errorf("retention hash %q gives an empty key", spec.Hash)
	case len(key) > retention.MaxKey:
		return nil, fmt.Errorf("retention hash %q gives a key of %d bytes, at most %d", spec.Hash, len(key), retention.MaxKey)
	}
	out.Key = key
	return out, nil
}

// withRetention adds to a step's first schedule the retention its
// retention: field sets, so that the change is part of the history. A hash
// key that cannot be rendered fails the step, as any other expression of
// the step would. Other events are returned as they are.
func (in Input) withRetention(p events.Payload) events.Payload {
	e, ok := p.(*events.StepScheduled)
	if !ok || e.Retention != nil {
		return p
	}
	if !in.mayRetain() {
		return p // no step has a retention: field (resolving the frame costs what the execution did)
	}
	if i := in.State.StepIndex(e.StepID); i >= 0 && in.State.Steps[i].Status != projections.OpNone {
		return p // a retry or a later attempt: the step was entered already
	}
	f, step, ok := resolveFrame(in.Def, in.State, e.StepID)
	if !ok || step.Retention == "" {
		return p
	}
	prev := retention.Default
	if in.State.Retention != "" {
		if r, err := retention.ParseRule(in.State.Retention); err == nil {
			prev = r
		}
	}
	r, err := resolveRetention(string(step.Retention), prev, in.State.RetentionKey, func() map[string]any { return newEngine(in.Def, in.State).env(f) })
	if err != nil {
		return &events.StepFailed{StepID: e.StepID, Kind: e.Kind, Attempt: e.Attempt, Error: err.Error(), Final: true}
	}
	next := *e
	next.Retention = r
	return &next
}

// mayRetain reports whether any step of the execution's definition may
// set a retention (it has a retention: field, or calls another workflow,
// whose recorded definition may). It is worked out once per state kept.
func (in Input) mayRetain() bool {
	if len(in.Def.Steps) == 0 {
		return true // no definition yet: do not remember
	}
	m := in.Memo
	if m == nil {
		m = &Memo{}
	}
	if m.retains == 0 {
		m.retains = -1
		if stepsMayRetain(in.Def.Steps) || stepsMayRetain(in.Def.OnError) {
			m.retains = 1
		}
	}
	return m.retains > 0
}
