package interp

import (
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/retention"
	"jetflow.dev/pkg/workflow"
)

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
	r, err := step.Retention.Resolve(prev, in.State.RetentionKey, func() map[string]any { return newEngine(in.Def, in.State).env(f) })
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
