// Package operation is the Go SDK for agent operations: implement
// [Handler] and register it with an agent under a kind name.
package operation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Task is what a handler receives.
type Task struct {
	// TaskID identifies (execution, step, attempt) and is stable across
	// redeliveries: use it as an idempotency key towards other systems.
	TaskID      string
	ExecutionID string
	Workflow    string
	StepID      string
	Attempt     int
	// Delivery counts deliveries of this task (1 = first run). A value
	// above 1 means an earlier run may have had effects.
	Delivery int
	Kind     string
	// Spec is the step's definition as JSON, its expressions evaluated.
	Spec json.RawMessage
	// Input is a call step's input, its expressions evaluated (JSON; nil
	// when the step has none).
	Input json.RawMessage
}

// Handler runs one kind of operation. It must return when ctx ends (the
// execution was killed or the agent is shutting down). The output is
// stored as the step's output (JSON).
type Handler interface {
	Handle(ctx context.Context, t Task) (output any, err error)
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, t Task) (any, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, t Task) (any, error) { return f(ctx, t) }

// Failure is an error that carries an output, e.g. a command's stderr.
type Failure struct {
	Err    error
	Output any
}

func (f *Failure) Error() string { return f.Err.Error() }
func (f *Failure) Unwrap() error { return f.Err }

type heartbeatKey struct{}

// Heartbeat tells the agent that the operation running in ctx is alive.
// A step with a heartbeat (heartbeat: 30s) whose handler does not call it
// for longer is terminated (ctx is cancelled) and its attempt fails as
// lost, to be retried per the step's policy. Without one it does nothing:
// any handler may call it.
func Heartbeat(ctx context.Context) {
	if beat, ok := ctx.Value(heartbeatKey{}).(func()); ok {
		beat()
	}
}

// WithHeartbeat returns ctx with beat called by Heartbeat: for agents.
func WithHeartbeat(ctx context.Context, beat func()) context.Context {
	return context.WithValue(ctx, heartbeatKey{}, beat)
}

// Run calls h, and turns a panic of the handler into an error, so that
// one faulty handler fails its step instead of its process.
func Run(ctx context.Context, h Handler, t Task) (out any, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("operation %s panicked: %v", t.Kind, r)
		}
	}()
	return h.Handle(ctx, t)
}

// EncodeOutput is a handler's output as stored: its JSON, or nothing for
// a nil output.
func EncodeOutput(out any) (json.RawMessage, error) {
	if out == nil {
		return nil, nil
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("encode operation output: %w", err)
	}
	return b, nil
}

// InputOf is a call step's input, from the step's spec ([Task.Spec]):
// nil if it has none.
func InputOf(spec json.RawMessage) json.RawMessage {
	var s struct {
		Input json.RawMessage `json:"input"`
	}
	if json.Unmarshal(spec, &s) != nil || len(s.Input) == 0 || string(s.Input) == "null" {
		return nil
	}
	return s.Input
}

// MaxErrorText bounds the text of a failed operation's error as reported.
const MaxErrorText = 8 << 10

// Failed is what a report of a failed run says: the error's text (at
// most MaxErrorText bytes, then "…") and the output a [Failure] carries
// (nil for any other error).
func Failed(err error) (text string, output json.RawMessage) {
	var fail *Failure
	if errors.As(err, &fail) {
		output, _ = EncodeOutput(fail.Output)
	}
	text = err.Error()
	if len(text) > MaxErrorText {
		text = text[:MaxErrorText] + "…"
	}
	return text, output
}
