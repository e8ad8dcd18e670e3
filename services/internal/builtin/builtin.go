// Package builtin holds the built-in operations that need nothing of the
// process that runs them: noop and log. Agents run them, and so do
// dispatchers for local steps (docs/adr/0014).
package builtin

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/workflow"
)

// Noop does nothing, and has no output.
var Noop operation.Handler = operation.HandlerFunc(func(context.Context, operation.Task) (any, error) { return nil, nil })

// Log returns the log operation: it writes the step's message to log at
// the step's level (info by default), and outputs both.
func Log(log zerolog.Logger) operation.Handler { return logHandler{log: log} }

type logHandler struct{ log zerolog.Logger }

func (h logHandler) Handle(_ context.Context, t operation.Task) (any, error) {
	s, err := Spec(t)
	if err != nil {
		return nil, err
	}
	lvl, err := zerolog.ParseLevel(cmp.Or(s.Level, "info"))
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	h.log.WithLevel(lvl).Str("execution_id", t.ExecutionID).Str("step_id", t.StepID).Str("step_message", s.Message).Msg("workflow log")
	return map[string]string{"message": s.Message, "level": cmp.Or(s.Level, "info")}, nil
}

// Spec decodes the step a task runs.
func Spec(t operation.Task) (workflow.Step, error) {
	var s workflow.Step
	if err := json.Unmarshal(t.Spec, &s); err != nil {
		return s, fmt.Errorf("decode %s step spec: %w", t.Kind, err)
	}
	return s, nil
}
