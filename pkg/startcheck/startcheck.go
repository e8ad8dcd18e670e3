// Package startcheck is the one check of a start command
// (io.jetflow.execution.start). The api runs it before it publishes a
// start, and the dispatcher when it handles one, which may have come
// straight from NATS: the same start gets the same answer, naming the same
// field with the same message, as an HTTP error and as a rejection.
//
// [Check] does no I/O and reads no clock or randomness: the caller looks
// the workflow up in the registry and says when the start is checked. It
// measures the execution's first event as it will be stored with pkg/bus's
// codec, which brings nats.go into its dependencies (a build matter only:
// nothing here talks to a server). The package sits apart from pkg/events
// (which pkg/workflow imports, so it cannot know definitions) and
// pkg/catalog (a NATS store).
package startcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/retention"
	"jetflow.dev/pkg/workflow"
)

// Definition is the workflow definition a start names, as the registry
// resolved it (the latest version when the start names none).
type Definition struct {
	// Name and Version are the registered name and version.
	Name    string
	Version int
	Spec    workflow.Definition

	// canonical and steps are what every start of it records, computed
	// once by Prepare (nil: at each Check).
	canonical json.RawMessage
	steps     []events.StepRef
}

// Size is what a prepared definition holds, near enough for a cache's
// bound: its canonical form's bytes (0 unprepared).
func (d *Definition) Size() int { return len(d.canonical) }

// Prepare returns the definition of a registered version with what every
// start of it records computed once: its canonical form (the pinned
// definition) and its steps. A version never changes, so a caller that
// checks many starts keeps it; it is shared by the starts checked
// against it, and must never be changed.
func Prepare(name string, version int, spec workflow.Definition) (*Definition, error) {
	canonical, err := spec.Canonical()
	if err != nil {
		return nil, fmt.Errorf("encode workflow %s version %d: %w", name, version, err)
	}
	return &Definition{Name: name, Version: version, Spec: spec, canonical: canonical, steps: spec.StepRefs()}, nil
}

// Options are what a start is checked against besides its definition.
type Options struct {
	// MaxPayload is the largest message the NATS server takes
	// (nats.Conn.MaxPayload): the execution's first history event, which
	// holds the input and the pinned definition, must fit in one. 0 skips
	// the check.
	MaxPayload int64
	// Now is when the execution starts: its workflow.started_at, which a
	// retention hash may use.
	Now time.Time
}

// Start is a start command that passed the check, normalized.
type Start struct {
	// ExecutionID is the command's, or the one derived from its key.
	ExecutionID string
	// CommandKey is the command's key, its CloudEvent source#id.
	CommandKey string
	// Digest is what the command asks for ([events.StartExecution.Digest]),
	// which the claim of the execution id records.
	Digest string
	// Started is the execution's first history event, complete but for
	// Token and APIURL, which the dispatcher sets.
	Started *events.ExecutionStarted
}

// Problem is why a start cannot be accepted. It is an error.
type Problem struct {
	// Code is the rejection code: events.CodeInvalid, or
	// events.CodeNotFound for a workflow or version the registry does not
	// hold.
	Code string
	// Field is the member of the command's data at fault, as the
	// CloudEvent's data names it: workflow, version, execution_id, input,
	// input.<path> (a member of the input the schema refuses), or a member
	// the data should not have; "" for the data as a whole.
	Field string
	// Message is one line for people that says what to fix.
	Message string
	// Input lists every way the input fails the workflow's input schema
	// (Field is the first's); nil for other problems.
	Input []workflow.FieldError
}

func (p *Problem) Error() string { return p.Message }

// historyReserve is room left in a message, besides the first history
// event as Check builds it, for what the dispatcher adds: its source, the
// event's time, the execution token (32 bytes), the api url (at most 512:
// the dispatcher refuses a longer -api-url), the Nats-Msg-Id and
// expected-sequence headers, and the framing.
const historyReserve = 1024

// Identify returns the key of a start command (its CloudEvent source#id)
// and the execution id it names: its execution_id, or else the id derived
// from the key, so that the same CloudEvent always names the same
// execution. The id is "" when ev is not a start.
func Identify(ev events.Event) (key, executionID string) {
	key = events.CommandKey(ev.Source, ev.ID)
	cmd, ok := ev.Data.(*events.StartExecution)
	if !ok {
		return key, ""
	}
	if cmd.ExecutionID != "" {
		return key, cmd.ExecutionID
	}
	return key, events.DerivedExecutionID(key)
}

// Check checks the start command ev against the definition it names (nil
// when the registry holds no such workflow, or no such version) and
// returns it normalized, or a [*Problem]. Any other error is not the
// command's fault (its definition cannot be encoded).
//
// In order, the first failing rule decides: the data holds only known
// members (when it came as JSON, ev.Raw); the workflow is named, and its
// name and the version and execution id are valid; the input is a JSON
// object (or absent or null, meaning {}); the workflow (or version) is
// registered; the input satisfies its input schema; the workflow's
// retention hash, if any, renders over the start to a usable group key;
// and the first history event fits in a message.
func Check(ev events.Event, def *Definition, opt Options) (Start, error) {
	cmd, ok := ev.Data.(*events.StartExecution)
	if !ok {
		return Start{}, fmt.Errorf("startcheck: %s is not a start command", ev.Type)
	}
	if err := events.StrictData(ev); err != nil {
		return Start{}, dataProblem(err)
	}
	key, id := Identify(ev)
	asked := *cmd
	asked.ExecutionID = id
	if p := checkCommand(&asked); p != nil {
		return Start{}, p
	}
	if def == nil {
		if asked.Version > 0 { // the version is at fault, whether or not others are there
			return Start{}, &Problem{Code: events.CodeNotFound, Field: "version",
				Message: fmt.Sprintf("workflow %q has no version %d", asked.Workflow, asked.Version)}
		}
		return Start{}, &Problem{Code: events.CodeNotFound, Field: "workflow", Message: fmt.Sprintf("workflow %q is not registered", asked.Workflow)}
	}
	input := asked.Input
	if t := bytes.TrimSpace(input); len(t) == 0 || string(t) == "null" {
		input = json.RawMessage(`{}`)
	}
	if problems := def.Spec.CheckInput(input); len(problems) > 0 {
		all := make([]string, len(problems))
		for i, p := range problems {
			all[i] = p.Field + " " + p.Message
		}
		return Start{}, &Problem{Code: events.CodeInvalid, Field: problems[0].Field, Input: problems,
			Message: fmt.Sprintf("the input does not match workflow %s's input schema: %s", def.Name, strings.Join(all, "; "))}
	}
	var err error
	canonical, steps := def.canonical, slices.Clone(def.steps) // the steps are the execution's own
	if canonical == nil {
		if canonical, err = def.Spec.Canonical(); err != nil {
			return Start{}, fmt.Errorf("encode workflow %s version %d: %w", def.Name, def.Version, err)
		}
		steps = def.Spec.StepRefs()
	}
	started := &events.ExecutionStarted{
		Workflow: def.Name, Version: def.Version, Input: input, Steps: steps, Definition: canonical,
		CommandKey: key, CommandDigest: asked.Digest(), StartedBy: ev.Source, Actor: asked.Actor,
		WaitAfterFail: asked.WaitAfterFail, DryRun: asked.DryRun,
		Chain: asked.Chain, Run: asked.Run, ContinuedFrom: asked.ContinuedFrom, Parent: asked.Parent,
	}
	if asked.Actor != nil {
		started.StartedBy = asked.Actor.Subject // who, as authenticated; the command key keeps the source
	}
	if def.Spec.Retention != "" {
		// The workflow's rule, with context meaning parent (nothing came
		// before), its hash rendered over the start.
		started.Retention, err = def.Spec.Retention.Resolve(retention.Default, "", func() map[string]any {
			return ChainEnv(id, def.Name, def.Version, input, opt.Now, asked.Chain, asked.Run)
		})
		if err != nil {
			field := "input" // what the hash is rendered from
			if errors.Is(err, retention.ErrInvalid) {
				field = "" // the rule itself (checked when the definition was applied)
			}
			return Start{}, &Problem{Code: events.CodeInvalid, Field: field, Message: err.Error()}
		}
	}
	if p := asked.Parent; p != nil && p.Retention != "" {
		// A child execution: parent is its parent's rule (its default too).
		parent, err := retention.Parse(p.Retention)
		if err != nil {
			return Start{}, &Problem{Code: events.CodeInvalid, Field: "parent", Message: fmt.Sprintf("the parent's retention: %v", err)}
		}
		rule, key := retention.Default, ""
		if started.Retention != nil {
			own, err := retention.Parse(started.Retention.Rule)
			if err != nil {
				return Start{}, fmt.Errorf("retention of workflow %s: %w", def.Name, err)
			}
			rule, key = own.Rule, started.Retention.Key
		}
		started.Retention = &events.Retention{Rule: rule.WithParent(parent.Rule).String(), Key: key}
	}
	if opt.MaxPayload > 0 {
		size, err := historySize(id, started)
		if err != nil {
			return Start{}, err
		}
		if size > opt.MaxPayload {
			// The sizes of what the start asks for, not of the whole event,
			// which also holds who asked (and so differs between the api
			// and the dispatcher, whose commands carry other actors).
			return Start{}, &Problem{Code: events.CodeInvalid, Field: "input", Message: fmt.Sprintf(
				"the input (%d bytes) and the pinned definition (%d bytes) make the execution's first event larger than the %d bytes a message may hold; make the input smaller",
				len(input), len(canonical), opt.MaxPayload)}
		}
	}
	return Start{ExecutionID: id, CommandKey: key, Digest: started.CommandDigest, Started: started}, nil
}

// dataProblem explains data that does not decode strictly.
func dataProblem(err error) *Problem {
	if errors.Is(err, events.ErrUnknownType) {
		return &Problem{Code: events.CodeInvalid, Message: err.Error()}
	}
	field, msg := events.ExplainJSON(err)
	if field != "" && !strings.Contains(msg, field) {
		msg = field + " " + msg
	}
	if field == "id" {
		msg += `; in a CloudEvent's data the execution id is "execution_id"`
	}
	return &Problem{Code: events.CodeInvalid, Field: field, Message: "data: " + msg}
}

// checkCommand checks what shows without the registry; c.ExecutionID is
// set (given, or derived).
func checkCommand(c *events.StartExecution) *Problem {
	invalid := func(field, format string, args ...any) *Problem {
		return &Problem{Code: events.CodeInvalid, Field: field, Message: field + " " + fmt.Sprintf(format, args...)}
	}
	switch {
	case c.Workflow == "":
		return invalid("workflow", "is required")
	case !events.ValidWorkflowName(c.Workflow):
		return invalid("workflow", "%q is not a valid workflow name: %s", c.Workflow, events.WorkflowNameRule)
	case c.Version < 0:
		return invalid("version", "must be 0 (latest) or a positive version")
	case !events.ValidExecutionID(c.ExecutionID):
		return invalid("execution_id", "%q is not a valid execution id: %s", c.ExecutionID, events.ExecutionIDRule)
	}
	if t := bytes.TrimSpace(c.Input); len(t) > 0 && string(t) != "null" {
		var obj map[string]json.RawMessage
		if t[0] != '{' || json.Unmarshal(t, &obj) != nil {
			return invalid("input", "must be a JSON object")
		}
	}
	return nil
}

// Env is what expressions see at the start of an execution, before any
// step ran: the input, no variables, no steps, and the workflow's
// metadata (docs/workflow-language.md). A retention hash is rendered over
// it. It is the dispatcher's view of such an execution, which its tests
// hold it to.
func Env(executionID, workflowName string, version int, input json.RawMessage, startedAt time.Time) map[string]any {
	return ChainEnv(executionID, workflowName, version, input, startedAt, "", 0)
}

// ChainEnv is Env for run run of the chain of continue-as-new runs that
// execution chain began ("" and 0 for an execution no step continued).
func ChainEnv(executionID, workflowName string, version int, input json.RawMessage, startedAt time.Time, chain string, run int) map[string]any {
	if chain == "" {
		chain = executionID
	}
	var in map[string]any
	_ = json.Unmarshal(input, &in)
	if in == nil {
		in = map[string]any{}
	}
	return map[string]any{
		"input": in,
		"vars":  map[string]any{},
		"steps": map[string]any{},
		"workflow": map[string]any{"id": executionID, "name": workflowName, "version": float64(version),
			"attempt": float64(1), "started_at": startedAt.UTC().Format(time.RFC3339Nano), "api_url": "",
			"chain": chain, "run": float64(max(run, 1))},
	}
}

// historySize is the size of started as a history message (data, subject
// and headers), with historyReserve for what the dispatcher adds. It
// depends on nothing but the event: not on who checks, nor when.
func historySize(id string, started *events.ExecutionStarted) (int64, error) {
	ev := events.Event{ID: "00000000-0000-0000-0000-000000000000", Type: started.EventType(), Source: "jetflow",
		Subject: id, Workflow: started.Workflow, Time: time.Unix(0, 0).UTC(), Data: started}
	msg, err := bus.Encode(bus.ExecutionSubject(started.Workflow, id), ev)
	if err != nil {
		return 0, fmt.Errorf("encode the first history event of %s: %w", id, err)
	}
	n := int64(len(msg.Data) + len(msg.Subject))
	for k, vs := range msg.Header {
		for _, v := range vs {
			n += int64(len(k) + len(v) + 4)
		}
	}
	return n + historyReserve, nil
}
