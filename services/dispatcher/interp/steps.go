package interp

import (
	"encoding/json"
	"fmt"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// taskToken is the execution token an attempt's task carries: the one
// current when it was sent (a plain resume waits for the results of tasks
// sent before it, with the old token).
func taskToken(s projections.Execution, st projections.Step) string {
	if st.Token != "" {
		return st.Token
	}
	return s.Token
}

// dryRunSkip says why a dry run skips what a would do ("" if it does it):
// an operation that would be sent (its input is recorded with its
// schedule), a sleep, a wait for a signal.
func dryRunSkip(s projections.Execution, a action) string {
	if !s.DryRun {
		return ""
	}
	switch a.kind {
	case actSend:
		return fmt.Sprintf("dry run: would run %s with the input recorded", a.step.OperationKind())
	case actSleep:
		return "dry run: would sleep"
	case actWaitSignal:
		return "dry run: would wait for a signal"
	case actSchedule:
		switch a.step.Kind {
		case workflow.KindClearLock:
			return "dry run: would clear the lock's holders"
		case workflow.KindContinue:
			return "dry run: would end, and continue as a new execution"
		case workflow.KindWorkflow:
			if a.step.Child && a.step.Workflow != "" {
				return "dry run: would start workflow " + a.step.Workflow + " as a child execution"
			}
		}
	}
	return ""
}

func signalOutput(s *projections.Signal) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"name": s.Name, "data": decode(s.Data), "signal_id": s.ID})
	return b
}
