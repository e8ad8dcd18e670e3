package interp

import (
	"cmp"
	"encoding/json"
	"time"

	"jetflow.dev/pkg/projections"
)

// envOf builds what expressions see from the execution's state: the start
// input, the variables, each step's output and status, and the execution's
// metadata. Everything comes from recorded events, so evaluating an
// expression again after a crash gives the same value.
func envOf(x projections.Execution) map[string]any {
	steps := make(map[string]any, len(x.Steps))
	for _, st := range x.Steps {
		steps[st.ID] = map[string]any{"output": decode(st.Output), "status": string(st.RecordedStatus()),
			"error": st.Error, "attempt": float64(st.Attempt)}
	}
	env := baseEnvOf(x)
	env["steps"] = steps
	return env
}

// baseEnvOf is envOf without steps.
func baseEnvOf(x projections.Execution) map[string]any {
	vars := make(map[string]any, len(x.Vars))
	for k, v := range x.Vars {
		vars[k] = decode(v)
	}
	input, _ := decode(x.Input).(map[string]any)
	if input == nil {
		input = map[string]any{}
	}
	return map[string]any{
		"input": input,
		"vars":  vars,
		"workflow": map[string]any{"id": x.ID, "name": x.Workflow, "version": float64(x.Version),
			"attempt": float64(1), "started_at": x.StartedAt.UTC().Format(time.RFC3339Nano), "api_url": x.APIURL,
			"chain": cmp.Or(x.Chain, x.ID), "run": float64(max(x.Run, 1))},
	}
}

func decode(b json.RawMessage) any {
	if len(b) == 0 {
		return nil
	}
	var v any
	if json.Unmarshal(b, &v) != nil {
		return nil
	}
	return v
}

// with returns env plus one more root.
func with(env map[string]any, name string, v any) map[string]any {
	out := make(map[string]any, len(env)+1)
	for k, e := range env {
		out[k] = e
	}
	out[name] = v
	return out
}
