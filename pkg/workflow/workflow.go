// Package workflow parses and validates workflow definitions written in
// YAML (or JSON, which is YAML). Errors name the line, column and field
// path so that users can fix their file.
package workflow

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/spelling"
)

// Step kinds understood by this version.
const (
	KindNoop   = "noop"
	KindLog    = "log"
	KindExec   = "exec"
	KindHTTP   = "http"
	KindCall   = "call"
	KindLet    = "let"
	KindSleep  = "sleep"
	KindWait   = "wait"
	KindFail   = "fail"
	KindReturn = "return"
	KindGoto   = "goto"
	// KindRetry, in on-error steps only, runs the failed step again (or,
	// with replay, replays the workflow).
	KindRetry = "retry"
	// KindReplayable marks a replay point (or clears them): it does
	// nothing else (Brooklyn's "workflow replayable from here").
	KindReplayable = "replayable"
	// KindClearLock force-clears a lock's holders (but its own
	// execution), as an operator's clear does: Brooklyn's clear-sensor
	// lock-NAME.
	KindClearLock = "clear-lock"
	// KindContinue ends the execution and starts its successor, the next
	// run of the same workflow with a new input (Temporal's continue-as-new):
	// a long loop keeps a bounded history.
	KindContinue = "continue-as-new"
	// Containers: steps that run other steps.
	KindWorkflow = "workflow"
	// OnParentEndCancel and OnParentEndAbandon are what becomes of a
	// child execution still running when its parent ends.
	OnParentEndCancel  = "cancel"
	OnParentEndAbandon = "abandon"
	KindForeach        = "foreach"
	KindParallel       = "parallel"
	KindSwitch         = "switch"
)

// Kinds lists the step kinds, in documentation order.
var Kinds = []string{KindNoop, KindLog, KindExec, KindHTTP, KindCall, KindLet, KindSleep, KindWait, KindFail, KindReturn, KindGoto, KindRetry,
	KindReplayable, KindClearLock, KindContinue, KindWorkflow, KindForeach, KindParallel, KindSwitch}

// IsContainer reports whether steps of kind k run nested steps.
func IsContainer(k string) bool {
	switch k {
	case KindWorkflow, KindForeach, KindParallel, KindSwitch:
		return true
	}
	return false
}

// IsOperation reports whether steps of kind k run on an agent (and can
// have a queue, a timeout per attempt and retries). The others run in the
// dispatcher.
func IsOperation(k string) bool {
	switch k {
	case KindNoop, KindLog, KindExec, KindHTTP, KindCall:
		return true
	}
	return false
}

// When compensation runs (Definition.CompensateOn).
const (
	CompensateOnFailure = "failure"
	CompensateOnCancel  = "cancel"
)

// CompensatesOn reports whether the workflow compensates on failure or
// cancel (when).
func (d Definition) CompensatesOn(when string) bool {
	for _, w := range d.CompensateOn {
		if w == when {
			return true
		}
	}
	return false
}

// DefaultQueue is the agent queue of steps that name none.
const DefaultQueue = "default"

// MaxSize is the largest definition accepted, in bytes.
const MaxSize = 256 << 10

// MaxVersion is the highest version number a definition may have: the
// largest whole number every JSON reader keeps exact (2^53-1; a
// JavaScript client reads a larger one as another number).
const MaxVersion = 1<<53 - 1

// Definition is a workflow: a named list of steps run in order.
type Definition struct {
	Name string `yaml:"name" json:"name"`
	// Version, if set, is the version number this definition is stored
	// under; otherwise the registry numbers versions 1, 2, 3... itself.
	Version     int    `yaml:"version,omitempty" json:"version,omitempty"`
	Description string `yaml:"description,omitempty" json:"description,omitempty"`
	// Input is a JSON Schema the start input must satisfy.
	Input map[string]any `yaml:"input,omitempty" json:"input,omitempty"`
	// Output is the execution's output, usually an expression over step
	// outputs and variables; evaluated when the last step has succeeded.
	Output any `yaml:"output,omitempty" json:"output,omitempty"`
	// Timeout bounds the whole execution (a duration such as 10m).
	Timeout string `yaml:"timeout,omitempty" json:"timeout,omitempty"`
	// Retry is the retry policy of operation steps that set none.
	Retry *Retry `yaml:"retry,omitempty" json:"retry,omitempty"`
	// Retention says how long its finished executions are kept (see
	// docs/retention.md); default parent (the system default).
	Retention Retention `yaml:"retention,omitempty" json:"retention,omitempty"`
	// OnError runs when the workflow fails (for cleanup or notice); the
	// execution still fails unless a return or goto in it says otherwise.
	OnError []Step `yaml:"on-error,omitempty" json:"on-error,omitempty"`
	// CompensateOn says when the compensate steps of the steps that
	// succeeded run, in reverse order of completion (the saga pattern):
	// on failure, on cancel; an operator's compensate action runs them
	// whatever it says.
	CompensateOn []string `yaml:"compensate_on,omitempty" json:"compensate_on,omitempty"`
	// Idempotent "all" makes the external steps (operations) idempotent
	// unless they say otherwise: a replay may resume at them.
	Idempotent string `yaml:"idempotent,omitempty" json:"idempotent,omitempty"`
	// Replayable is enabled (the default), disabled, "from start" and/or
	// "automatically" (see docs/operations.md, Replay).
	Replayable string `yaml:"replayable,omitempty" json:"replayable,omitempty"`
	Steps      []Step `yaml:"steps" json:"steps"`
	// Lock and Semaphore: see [Step.Lock]; here they cover the whole
	// execution (its steps and on-error steps).
	Lock      string `yaml:"lock,omitempty" json:"lock,omitempty"`
	Semaphore int    `yaml:"semaphore,omitempty" json:"semaphore,omitempty"`
	// SearchAttributes names the input members ("input.<member>") and
	// variables ("vars.<name>") whose current values the api's
	// visibility index keeps, so that executions can be listed by them
	// (GET /v1/executions?attr=<name>:<value>). See [SearchAttribute].
	SearchAttributes []string `yaml:"search_attributes,omitempty" json:"search_attributes,omitempty"`
}

// Retry says how often and when a failed operation is tried again.
type Retry struct {
	// Limit is the number of attempts in all, the first included.
	Limit int `yaml:"limit" json:"limit"`
	// Backoff spaces the attempts (default: 1s, doubling, at most 1m).
	Backoff *Backoff `yaml:"backoff,omitempty" json:"backoff,omitempty"`
	// Jitter randomises each delay by up to this fraction (0 to 1).
	Jitter float64 `yaml:"jitter,omitempty" json:"jitter,omitempty"`
	// On lists texts, one of which the error must contain for a retry;
	// empty means every error.
	On []string `yaml:"on,omitempty" json:"on,omitempty"`
}

// Backoff is the delay before attempt n+1: Initial * Factor^(n-1), at most Max.
type Backoff struct {
	Initial string  `yaml:"initial,omitempty" json:"initial,omitempty"`
	Max     string  `yaml:"max,omitempty" json:"max,omitempty"`
	Factor  float64 `yaml:"factor,omitempty" json:"factor,omitempty"`
}

// Step is one step. Which fields apply depends on Kind.
type Step struct {
	ID          string `yaml:"id" json:"id"`
	Kind        string `yaml:"kind" json:"kind"`
	Description string `yaml:"description,omitempty" json:"description,omitempty"`
	// Queue is the agent queue that runs the operation (default "default").
	Queue string `yaml:"queue,omitempty" json:"queue,omitempty"`
	// Local runs the operation (noop, log, or a call of a handler the
	// dispatchers register) in the dispatcher that runs the execution,
	// not on an agent: no task is sent, and its result is recorded with
	// one append. It runs at least once: again, not waited for, after its
	// dispatcher stops (docs/adr/0014).
	Local bool `yaml:"local,omitempty" json:"local,omitempty"`

	// Condition, an expression, decides whether the step runs; a step
	// whose condition is false is skipped.
	Condition string `yaml:"condition,omitempty" json:"condition,omitempty"`
	// Output maps the step's result (the root "result" in expressions) to
	// what is stored as steps.<id>.output; for a return step it is the
	// execution's output.
	Output any `yaml:"output,omitempty" json:"output,omitempty"`
	// Timeout bounds one attempt of an operation, or a wait.
	Timeout string `yaml:"timeout,omitempty" json:"timeout,omitempty"`
	// Heartbeat bounds the silence of a running exec or call operation:
	// an exec that writes nothing to its stdout or stderr, or a Go
	// handler that does not call operation.Heartbeat, for longer is
	// terminated and its attempt fails as lost (retried per its policy).
	Heartbeat string `yaml:"heartbeat,omitempty" json:"heartbeat,omitempty"`
	// Retry overrides the workflow's retry policy for this operation; in a
	// retry step (within on-error) it limits and spaces the retries.
	Retry *Retry `yaml:"retry,omitempty" json:"retry,omitempty"`
	// OnError runs when the step has failed (after its retry policy):
	// if these steps complete, the step is recovered and its list goes on;
	// a fail step fails it, a goto moves within its list, a retry step
	// runs it again.
	OnError []Step `yaml:"on-error,omitempty" json:"on-error,omitempty"`
	// Compensate undoes what the step did once it succeeded, when the
	// execution is compensated (Definition.CompensateOn, or an
	// operator's compensate action).
	Compensate []Step `yaml:"compensate,omitempty" json:"compensate,omitempty"`
	// Idempotent (yes, no, default) says whether a replay may resume at
	// this step; on a workflow block, all applies to the steps in it.
	Idempotent string `yaml:"idempotent,omitempty" json:"idempotent,omitempty"`
	// Replayable makes the step a replay point ("from here"), the only
	// one ("from here only"), or clears the earlier ones ("reset"); on a
	// workflow block also "from start" (the block is a replay point) or
	// "disabled" (no replay point inside it, nor resuming in it).
	Replayable string `yaml:"replayable,omitempty" json:"replayable,omitempty"`
	// retry (in on-error): Replay replays the workflow instead of running
	// the failed step again, from Next (a step of the failed step's list,
	// "last" replay point, or "end": resuming); Next without Replay goes
	// on from that step like a goto.
	Replay bool   `yaml:"replay,omitempty" json:"replay,omitempty"`
	Next   string `yaml:"next,omitempty" json:"next,omitempty"`
	// Retention, on any step, changes the execution's retention rule (and
	// group, with hash) when the step is scheduled; a workflow step with
	// only retention does nothing else.
	Retention Retention `yaml:"retention,omitempty" json:"retention,omitempty"`

	// call: a custom operation, by name, on Queue, with Input.
	Operation string `yaml:"operation,omitempty" json:"operation,omitempty"`
	Input     any    `yaml:"input,omitempty" json:"input,omitempty"`

	// let: variables to set (values are templates).
	Vars map[string]any `yaml:"vars,omitempty" json:"vars,omitempty"`

	// sleep: how long, or until when (RFC 3339).
	Duration string `yaml:"duration,omitempty" json:"duration,omitempty"`
	Until    string `yaml:"until,omitempty" json:"until,omitempty"`

	// wait: the signal (or the first of several) to wait for, and an
	// optional condition on it (the root "signal": name and data).
	Signal  string   `yaml:"signal,omitempty" json:"signal,omitempty"`
	Signals []string `yaml:"signals,omitempty" json:"signals,omitempty"`
	Match   string   `yaml:"match,omitempty" json:"match,omitempty"`

	// workflow (a block of Steps, or another registered workflow by name
	// and version, given Input), foreach (Steps for each of Items, at most
	// Concurrency at once), parallel (Branches; Mode all or first), switch
	// (the Steps of the first of Cases whose when is true, else Default).
	// goto: the id of a step of the same list to go on from, or "end".
	Target string `yaml:"target,omitempty" json:"target,omitempty"`

	Steps       []Step   `yaml:"steps,omitempty" json:"steps,omitempty"`
	Workflow    string   `yaml:"workflow,omitempty" json:"workflow,omitempty"`
	Version     int      `yaml:"version,omitempty" json:"version,omitempty"`
	Items       any      `yaml:"items,omitempty" json:"items,omitempty"`
	Concurrency int      `yaml:"concurrency,omitempty" json:"concurrency,omitempty"`
	Branches    []Branch `yaml:"branches,omitempty" json:"branches,omitempty"`
	Mode        string   `yaml:"mode,omitempty" json:"mode,omitempty"`
	Cases       []Case   `yaml:"cases,omitempty" json:"cases,omitempty"`
	Default     []Step   `yaml:"default,omitempty" json:"default,omitempty"`
	// Lock (a workflow step) names a lock, an expression, that the step
	// holds while its steps (and its on-error steps) run; Semaphore lets
	// that many holders hold it at once (default 1). See docs/locks.md.
	Lock      string `yaml:"lock,omitempty" json:"lock,omitempty"`
	Semaphore int    `yaml:"semaphore,omitempty" json:"semaphore,omitempty"`
	// LockTimeout (a workflow step with a lock) bounds the wait for the
	// lock: if it is not acquired within it, the step leaves the queue
	// and fails.
	LockTimeout string `yaml:"lock_timeout,omitempty" json:"lock_timeout,omitempty"`

	// Child (a workflow step calling another workflow by name) runs the
	// called workflow as a child execution of its own (its own id,
	// history, status, timeout, retention and lock) instead of inline;
	// the step waits for its end. OnParentEnd says what becomes of a
	// child still running when its parent ends: cancel (the default) or
	// abandon (it runs on).
	Child       bool   `yaml:"child,omitempty" json:"child,omitempty"`
	OnParentEnd string `yaml:"on_parent_end,omitempty" json:"on_parent_end,omitempty"`

	// clear-lock: Lock is the lock to clear; Reason, an expression, is
	// recorded in each cleared holder's history.
	Reason string `yaml:"reason,omitempty" json:"reason,omitempty"`

	// log
	Message string `yaml:"message,omitempty" json:"message,omitempty"`
	Level   string `yaml:"level,omitempty" json:"level,omitempty"`

	// exec
	Command string            `yaml:"command,omitempty" json:"command,omitempty"`
	Args    []string          `yaml:"args,omitempty" json:"args,omitempty"`
	Env     map[string]string `yaml:"env,omitempty" json:"env,omitempty"`
	Dir     string            `yaml:"dir,omitempty" json:"dir,omitempty"`

	// http
	Method  string            `yaml:"method,omitempty" json:"method,omitempty"`
	URL     string            `yaml:"url,omitempty" json:"url,omitempty"`
	Headers map[string]string `yaml:"headers,omitempty" json:"headers,omitempty"`
	Body    any               `yaml:"body,omitempty" json:"body,omitempty"`

	// SecretRefs is not a definition field: the dispatcher sets it in the
	// step it renders for an agent. It maps the JSON pointer of each field
	// (within the step) that references secrets to its template, which
	// the agent resolves with expression.ResolveSecrets before running the
	// operation. The field itself holds the text with ${secret.NAME} in
	// place, for people to read; only templates listed here are resolved,
	// so text that came from data is never taken for a reference.
	SecretRefs map[string]string `yaml:"-" json:"secret_refs,omitempty"`
}

// Branch is one branch of a parallel step.
type Branch struct {
	ID    string `yaml:"id" json:"id"`
	Steps []Step `yaml:"steps" json:"steps"`
}

// Case is one case of a switch step.
type Case struct {
	When  string `yaml:"when" json:"when"`
	Steps []Step `yaml:"steps" json:"steps"`
}

// GotoEnd is the goto target that ends the list (the workflow, or the
// container the goto is in).
const GotoEnd = "end"

// MaxRounds bounds how often gotos may restart a list.
const MaxRounds = 1000

// Parallel modes.
const (
	ModeAll   = "all"
	ModeFirst = "first"
)

// LocalQueue is the queue recorded for a local step: no agent queue can
// have its name (a queue's starts with a letter or a digit).
const LocalQueue = "_local"

// QueueName returns the step's agent queue (LocalQueue for a local step).
func (s Step) QueueName() string {
	if s.Local {
		return LocalQueue
	}
	if s.Queue == "" {
		return DefaultQueue
	}
	return s.Queue
}

// FieldError is one problem in a definition, located by line and field.
type FieldError struct {
	// Field is the path of the offending field, e.g. "steps[2].kind".
	Field string `json:"field"`
	// Line and Column are 1-based; 0 when unknown.
	Line    int    `json:"line,omitempty"`
	Column  int    `json:"column,omitempty"`
	Message string `json:"message"`
	// at is, for an expression's problem, 1 + where in the field's
	// string it is (in letters): locate places it in the file. 0 for
	// other problems.
	at int
}

func (e FieldError) Error() string {
	loc := ""
	if e.Line > 0 {
		loc = fmt.Sprintf("line %d: ", e.Line)
	}
	if e.Field != "" {
		return fmt.Sprintf("%sfield %s: %s", loc, e.Field, e.Message)
	}
	return loc + e.Message
}

// ErrInvalid is wrapped by every validation error.
var ErrInvalid = errors.New("workflow: invalid definition")

// ValidationError lists every problem found in a definition.
type ValidationError struct {
	Problems []FieldError `json:"problems"`
}

func (e *ValidationError) Error() string {
	msgs := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		msgs[i] = p.Error()
	}
	return "invalid workflow: " + strings.Join(msgs, "; ")
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *ValidationError) Unwrap() error { return ErrInvalid }

var (
	tokenRe = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
	levels  = map[string]bool{"": true, "debug": true, "info": true, "warn": true, "error": true}
)

// Parse decodes and validates a definition from YAML or JSON. Any problem
// is returned as a *ValidationError naming line and field.
func Parse(data []byte) (d Definition, err error) {
	defer func() {
		if r := recover(); r != nil { // go-yaml v1.19.2 panics on some input, e.g. "steps: !t"
			d, err = Definition{}, &ValidationError{Problems: []FieldError{{Message: fmt.Sprintf("cannot decode definition: %v", r)}}}
		}
	}()
	if len(data) > MaxSize {
		return d, &ValidationError{Problems: []FieldError{{Message: fmt.Sprintf("definition is %d bytes, the limit is %d", len(data), MaxSize)}}}
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return d, &ValidationError{Problems: []FieldError{{Message: "definition is empty"}}}
	}
	file, err := parser.ParseBytes(data, 0)
	if err != nil {
		return d, &ValidationError{Problems: []FieldError{yamlProblem(err)}}
	}
	for _, doc := range file.Docs[min(1, len(file.Docs)):] {
		if doc != nil && doc.Body != nil {
			line, col := 0, 0
			if tk := doc.Body.GetToken(); tk != nil {
				line, col = tk.Position.Line, tk.Position.Column
			}
			return d, &ValidationError{Problems: []FieldError{{Line: line, Column: col, Message: "a file holds one workflow: remove the second YAML document (after ---) or put it in its own file"}}}
		}
	}
	body := docBody(file)
	if body == nil { // only comments or document markers: NodeToValue panics on a nil node
		return d, &ValidationError{Problems: []FieldError{{Message: "definition is empty"}}}
	}
	var tagged []FieldError
	if body = plainTags(body, &tagged); len(tagged) > 0 {
		return d, &ValidationError{Problems: tagged}
	}
	var lossy []FieldError
	lossyNumbers(body, reflect.TypeFor[Definition](), "", &lossy)
	if err := yaml.NodeToValue(body, &d, yaml.DisallowUnknownField()); err != nil {
		if len(lossy) > 0 { // the decoder's words for them are Go's (NaN, overflow)
			return d, &ValidationError{Problems: lossy}
		}
		fe := yamlProblem(err)
		if fe.Field != "" {
			if strings.HasPrefix(fe.Message, "unknown field ") {
				// Hinted from the fields of what holds it: a step's, or
				// the definition's (a switch case or a retry has others).
				fe.Message += spellingHint(fe.Field, slices.Collect(maps.Keys(fieldsAt(pathAt(body, "", fe.Line, fe.Column)))))
			}
			fe.Field = fieldPath(file, fe.Line, fe.Column, fe.Field)
		}
		var te *yaml.TypeError
		var ne *yaml.UnexpectedNodeTypeError
		switch {
		case errors.As(err, &te) && te.Token != nil:
			fe.Field = pathAt(body, "", te.Token.Position.Line, te.Token.Position.Column)
			fe.Message = fmt.Sprintf("must be %s, not %s", goKind(te.DstType), goKind(te.SrcType))
		case errors.As(err, &ne) && ne.Token != nil:
			fe.Field = pathAt(body, "", ne.Token.Position.Line, ne.Token.Position.Column)
			fe.Message = fmt.Sprintf("must be %s, not %s", nodeKind(ne.Expected), nodeKind(ne.Actual))
			if fe.Field == "" {
				fe.Message = "the definition " + fe.Message
			}
		}
		return d, &ValidationError{Problems: []FieldError{fe}}
	}
	if z := zeroVersion(body); z != nil {
		lossy = append(lossy, *z)
	}
	problems := d.validate()
	if len(problems)+len(lossy) == 0 {
		return d, nil
	}
	// A field whose number the decoder changed (-.inf, 2.5) is not
	// checked further: its value is the decoder's, not the user's.
	problems = slices.DeleteFunc(problems, func(p FieldError) bool {
		return slices.ContainsFunc(lossy, func(l FieldError) bool { return l.Field == p.Field })
	})
	for i := range problems {
		problems[i].Line, problems[i].Column = locate(file, data, problems[i].Field, problems[i].at)
		problems[i].at = 0
	}
	// Two problems of one string placed alike (where the field is, for
	// a quoted string) and worded alike say it once.
	seen := map[FieldError]bool{}
	problems = slices.DeleteFunc(problems, func(p FieldError) bool {
		dup := seen[p]
		seen[p] = true
		return dup
	})
	return d, &ValidationError{Problems: append(lossy, problems...)}
}

// Validate checks a definition that did not come from text (e.g. built in Go).
func (d Definition) Validate() error {
	if p := d.validate(); len(p) > 0 {
		return &ValidationError{Problems: p}
	}
	return nil
}

func docBody(f *ast.File) ast.Node {
	if len(f.Docs) == 0 || f.Docs[0] == nil || f.Docs[0].Body == nil {
		return nil
	}
	return f.Docs[0].Body
}

// locate finds the line and column of a field path such as "steps[2].kind".
// When the field itself is absent it falls back to its closest parent.
// at, when not 0, is 1 + where in the field's string a problem is (an
// expression's): the place in the file for a plain string or a literal
// block (|), else the field's.
func locate(f *ast.File, src []byte, field string, at int) (int, int) {
	for p := field; p != ""; {
		if path, err := yaml.PathString("$." + yamlPath(p)); err == nil {
			if n, err := path.FilterFile(f); err == nil && n != nil && n.GetToken() != nil {
				if at > 0 && p == field {
					if line, col, letter, ok := placeIn(n, at-1); ok && letterAt(src, line, col) == letter {
						return line, col
					}
				}
				return n.GetToken().Position.Line, n.GetToken().Position.Column
			}
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return 0, 0
}

// quotedMember is a member of a field path written ["k"] (a key that is
// no name: expression.Member).
var quotedMember = regexp.MustCompile(`\["((?:[^"\\]|\\.)*)"\]`)

// yamlPath is field path p as go-yaml's paths write it: a quoted member
// ["k"] as .'k' (its paths have no ["k"]).
func yamlPath(p string) string {
	return quotedMember.ReplaceAllStringFunc(p, func(m string) string {
		k, err := strconv.Unquote(m[1 : len(m)-1])
		if err != nil || strings.Contains(k, "'") {
			return m
		}
		return ".'" + k + "'"
	})
}

// placeIn is the line and column, in the file, of letter at of n's
// string, and that letter (its caller checks the file holds it there):
// n a plain string on one line (as written, no escapes), or a literal
// block (|), whose lines are the file's, less their indentation.
func placeIn(n ast.Node, at int) (line, col int, letter rune, ok bool) {
	switch n := n.(type) {
	case *ast.StringNode:
		tk := n.GetToken()
		value := []rune(n.Value)
		if tk.Type != token.StringType || strings.ContainsAny(strings.TrimSpace(tk.Origin), "\r\n") || at < 0 || at >= len(value) {
			return 0, 0, 0, false
		}
		return tk.Position.Line, tk.Position.Column + at, value[at], true
	case *ast.LiteralNode:
		if n.Start == nil || n.Start.Type != token.LiteralType || n.Value == nil || n.Value.Token == nil {
			return 0, 0, 0, false
		}
		value := []rune(n.Value.Value)
		if at < 0 || at >= len(value) {
			return 0, 0, 0, false
		}
		before := string(value[:at])
		lines := strings.Count(before, "\n")
		since := utf8.RuneCountInString(before[strings.LastIndex(before, "\n")+1:])
		origin := n.Value.Token.Origin
		indent := len(origin) - len(strings.TrimLeft(origin, " \r\n"))
		indent -= strings.LastIndex(origin[:indent], "\n") + 1 // the first written line's spaces
		// less those the value keeps (an indentation indicator, |2)
		v := strings.TrimLeft(n.Value.Value, "\r\n")
		indent -= len(v) - len(strings.TrimLeft(v, " "))
		return n.Start.Position.Line + 1 + lines, indent + since + 1, value[at], true
	}
	return 0, 0, 0, false
}

// letterAt is the letter of src at line and col (from 1), or -1.
func letterAt(src []byte, line, col int) rune {
	lines := bytes.Split(src, []byte("\n"))
	if line < 1 || line > len(lines) || col < 1 {
		return -1
	}
	letters := []rune(string(lines[line-1]))
	if col > len(letters) {
		return -1
	}
	return letters[col-1]
}

// yamlProblem turns a go-yaml error into a FieldError with a position.
func yamlProblem(err error) FieldError {
	var ye yaml.Error
	if errors.As(err, &ye) && ye.GetToken() != nil {
		tk := ye.GetToken()
		fe := FieldError{Line: tk.Position.Line, Column: tk.Position.Column, Message: ye.GetMessage() + syntaxHint(ye.GetMessage())}
		var ue *yaml.UnknownFieldError
		if errors.As(err, &ue) {
			fe.Field = tk.Value
			fe.Message = fmt.Sprintf("unknown field %q", tk.Value)
		}
		return fe
	}
	return FieldError{Message: err.Error()}
}

// spellingHint names the field or kind an unknown one was meant to be
// (spelling.Meant), when it differs only by '-' for '_' (on-parent-end,
// clear_lock) or is one slip of a known one's spelling away (mesage,
// timout, htpp): "" otherwise, or when two are as near.
func spellingHint(name string, known []string) string {
	if meant := spelling.Meant(name, known); meant != "" {
		return fmt.Sprintf(" (did you mean %q?)", meant)
	}
	return ""
}

// definitionFields and stepFields are the YAML names of a definition's
// and a step's fields.
var (
	definitionFields = sync.OnceValue(func() map[string]bool { return yamlFields(reflect.TypeFor[Definition]()) })
	stepFields       = sync.OnceValue(func() map[string]bool { return yamlFields(reflect.TypeFor[Step]()) })
)

func yamlFields(t reflect.Type) map[string]bool {
	out := map[string]bool{}
	for i := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); name != "" && name != "-" {
			out[name] = true
		}
	}
	return out
}

// stepAt matches the path of a step: an item of a list of steps.
var stepAt = regexp.MustCompile(`(^|\.)(steps|on-error|compensate|default)\[[0-9]+\]$`)

// fieldsAt returns the fields that the mapping holding the key at path
// (e.g. "steps[0].colour") may have: a step's, the definition's, or
// none known (a retry, a switch case, a branch).
func fieldsAt(path string) map[string]bool {
	i := strings.LastIndexByte(path, '.')
	switch {
	case path == "":
		return nil
	case i < 0:
		return definitionFields()
	case stepAt.MatchString(path[:i]):
		return stepFields()
	}
	return nil
}

// fieldPath names the key at line:col by its path, e.g. "steps[2].colour",
// by finding the step whose mapping holds it.
func fieldPath(f *ast.File, line, col int, key string) string {
	for i := 0; ; i++ {
		path, err := yaml.PathString(fmt.Sprintf("$.steps[%d]", i))
		if err != nil {
			return key
		}
		n, err := path.FilterFile(f)
		if err != nil || n == nil {
			return key
		}
		m, ok := n.(*ast.MappingNode)
		if !ok {
			continue
		}
		for _, kv := range m.Values {
			if tk := kv.Key.GetToken(); tk != nil && tk.Position.Line == line && tk.Position.Column == col {
				return fmt.Sprintf("steps[%d].%s", i, key)
			}
		}
	}
}

// pathAt returns the field path (e.g. "steps[0].timeout") of the value
// or key that starts at line:col under n, whose own path is path; "" if
// no value starts there.
func pathAt(n ast.Node, path string, line, col int) string {
	at := func(n ast.Node) bool {
		tk := n.GetToken()
		return tk != nil && tk.Position.Line == line && tk.Position.Column == col
	}
	switch n := scalar(n).(type) { // through tags and anchors: !!map, &top
	case *ast.MappingNode:
		for _, kv := range n.Values {
			if p := pathAt(kv, path, line, col); p != "" {
				return p
			}
		}
	case *ast.MappingValueNode:
		key := n.Key.GetToken().Value
		if path != "" {
			key = path + "." + key
		}
		if at(n.Key) || at(n.Value) {
			return key
		}
		return pathAt(n.Value, key, line, col)
	case *ast.SequenceNode:
		for i, v := range n.Values {
			elem := fmt.Sprintf("%s[%d]", path, i)
			if at(v) {
				return elem
			}
			if p := pathAt(v, elem, line, col); p != "" {
				return p
			}
		}
	}
	return ""
}

// goKind names what a Go type holds as people write it in YAML.
func goKind(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping (key: value lines)"
	case reflect.Pointer:
		return goKind(t.Elem())
	}
	return "a value"
}

// nodeKind names a YAML node type as people write it.
func nodeKind(t ast.NodeType) string {
	switch t {
	case ast.SequenceType:
		return "a list"
	case ast.MappingType, ast.MappingValueType:
		return "a mapping (key: value lines)"
	case ast.StringType, ast.LiteralType:
		return "a string"
	case ast.IntegerType, ast.FloatType, ast.InfinityType, ast.NanType:
		return "a number"
	case ast.BoolType:
		return "true or false"
	case ast.NullType:
		return "empty"
	}
	return "a value"
}

// syntaxHint adds what usually causes a YAML syntax error.
func syntaxHint(msg string) string {
	switch {
	case strings.Contains(msg, `'\t'`) || strings.Contains(msg, "\t"):
		return " (YAML indents with spaces, not tabs)"
	case strings.Contains(msg, "not allowed in this context"):
		return " (check the indentation of this line and the lines above it: the keys of one mapping must start in the same column)"
	}
	return ""
}

// Canonical returns the definition as canonical JSON (map keys sorted),
// the form stored and pinned by executions.
func (d Definition) Canonical() ([]byte, error) {
	return json.Marshal(d)
}

// Digest is a content hash of the canonical form; equal digests mean the
// same definition.
func (d Definition) Digest() (string, error) {
	b, err := d.Canonical()
	if err != nil {
		return "", err
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:]), nil
}

// StepRefs lists the steps' ids and kinds in order.
func (d Definition) StepRefs() []events.StepRef {
	refs := make([]events.StepRef, len(d.Steps))
	for i, s := range d.Steps {
		refs[i] = events.StepRef{ID: s.ID, Kind: s.Kind}
	}
	return refs
}

// Step returns the step with the given id.
func (d Definition) Step(id string) (Step, bool) {
	for _, s := range d.Steps {
		if s.ID == id {
			return s, true
		}
	}
	return Step{}, false
}

// HTTPMethod returns the HTTP method of an http step (GET by default).
func (s Step) HTTPMethod() string {
	if s.Method == "" {
		return http.MethodGet
	}
	return strings.ToUpper(s.Method)
}

// Retention is a retention rule as written in a definition (see package
// retention for the syntax). A YAML number is kept as its text, so
// retention: 5 and retention: "5" are the same.
type Retention string

// UnmarshalYAML keeps the text of any value; validation checks it.
func (r *Retention) UnmarshalYAML(unmarshal func(any) error) error {
	var v any
	if err := unmarshal(&v); err != nil {
		return err
	}
	switch x := v.(type) {
	case string:
		*r = Retention(x)
	case nil:
		*r = ""
	default: // a number; anything else is reported by validation, with its line
		*r = Retention(fmt.Sprint(x))
	}
	return nil
}
