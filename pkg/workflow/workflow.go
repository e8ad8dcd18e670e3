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
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"

	"jetflow.dev/pkg/events"
)

// Step kinds understood by this version.
const (
	KindNoop = "noop"
	KindLog  = "log"
	KindExec = "exec"
	KindHTTP = "http"
)

// Kinds lists the step kinds, in documentation order.
var Kinds = []string{KindNoop, KindLog, KindExec, KindHTTP}

// DefaultQueue is the agent queue of steps that name none.
const DefaultQueue = "default"

// MaxSize is the largest definition accepted, in bytes.
const MaxSize = 256 << 10

// Definition is a workflow: a named list of steps run in order.
type Definition struct {
	Name        string `yaml:"name" json:"name"`
	Description string `yaml:"description,omitempty" json:"description,omitempty"`
	Steps       []Step `yaml:"steps" json:"steps"`
}

// Step is one step. Which fields apply depends on Kind.
type Step struct {
	ID          string `yaml:"id" json:"id"`
	Kind        string `yaml:"kind" json:"kind"`
	Description string `yaml:"description,omitempty" json:"description,omitempty"`
	// Queue is the agent queue that runs the operation (default "default").
	Queue string `yaml:"queue,omitempty" json:"queue,omitempty"`

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
}

// QueueName returns the step's agent queue.
func (s Step) QueueName() string {
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
	stepIDRe = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,63}$`)
	queueRe  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)
	tokenRe  = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
	levels   = map[string]bool{"": true, "debug": true, "info": true, "warn": true, "error": true}
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
	if err := yaml.NodeToValue(body, &d, yaml.DisallowUnknownField()); err != nil {
		fe := yamlProblem(err)
		if fe.Field != "" {
			fe.Field = fieldPath(file, fe.Line, fe.Column, fe.Field)
		}
		return d, &ValidationError{Problems: []FieldError{fe}}
	}
	problems := d.validate()
	if len(problems) == 0 {
		return d, nil
	}
	for i := range problems {
		problems[i].Line, problems[i].Column = locate(file, problems[i].Field)
	}
	return d, &ValidationError{Problems: problems}
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

func (d Definition) validate() []FieldError {
	var ps []FieldError
	add := func(field, format string, args ...any) {
		ps = append(ps, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	switch {
	case d.Name == "":
		add("name", "is required")
	case !events.ValidWorkflowName(d.Name):
		add("name", "%q must start with a letter and hold only letters, digits, '-' and '_' (at most 64)", d.Name)
	}
	if len(d.Steps) == 0 {
		add("steps", "at least one step is required")
	}
	seen := map[string]int{}
	for i, s := range d.Steps {
		f := func(name string) string { return fmt.Sprintf("steps[%d].%s", i, name) }
		switch {
		case s.ID == "":
			add(f("id"), "is required")
		case !stepIDRe.MatchString(s.ID):
			add(f("id"), "%q must start with a letter and hold only letters, digits, '-' and '_' (at most 64)", s.ID)
		default:
			if j, dup := seen[s.ID]; dup {
				add(f("id"), "%q is already the id of steps[%d]; step ids must be unique", s.ID, j)
			}
			seen[s.ID] = i
		}
		if s.Queue != "" && !queueRe.MatchString(s.Queue) {
			add(f("queue"), "%q must hold only letters, digits, '-' and '_'", s.Queue)
		}
		used := s.usedFields()
		allowed := map[string]bool{}
		switch s.Kind {
		case "":
			add(f("kind"), "is required (one of %s)", strings.Join(Kinds, ", "))
			continue
		case KindNoop:
		case KindLog:
			allowed = map[string]bool{"message": true, "level": true}
			if s.Message == "" {
				add(f("message"), "is required for a log step")
			}
			if !levels[s.Level] {
				add(f("level"), "%q is not one of debug, info, warn, error", s.Level)
			}
		case KindExec:
			allowed = map[string]bool{"command": true, "args": true, "env": true, "dir": true}
			if s.Command == "" {
				add(f("command"), "is required for an exec step")
			}
		case KindHTTP:
			allowed = map[string]bool{"method": true, "url": true, "headers": true, "body": true}
			if s.Method != "" && !tokenRe.MatchString(s.Method) {
				add(f("method"), "%q is not an HTTP method", s.Method)
			}
			if s.URL == "" {
				add(f("url"), "is required for an http step")
			} else if u, err := url.Parse(s.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				add(f("url"), "%q must be an absolute http or https URL", s.URL)
			}
			for k := range s.Headers {
				if !tokenRe.MatchString(k) {
					add(f("headers"), "%q is not a valid header name", k)
				}
			}
			if _, err := json.Marshal(s.Body); err != nil { // e.g. .nan or .inf, which Canonical cannot encode
				add(f("body"), "cannot be encoded as JSON: %v", err)
			}
		default:
			add(f("kind"), "unknown step kind %q (known kinds: %s)", s.Kind, strings.Join(Kinds, ", "))
			continue
		}
		for _, u := range used {
			if !allowed[u] {
				add(f(u), "does not apply to a %s step", s.Kind)
			}
		}
	}
	return ps
}

func (s Step) usedFields() []string {
	var u []string
	for _, c := range []struct {
		name string
		set  bool
	}{
		{"message", s.Message != ""}, {"level", s.Level != ""},
		{"command", s.Command != ""}, {"args", len(s.Args) > 0}, {"env", len(s.Env) > 0}, {"dir", s.Dir != ""},
		{"method", s.Method != ""}, {"url", s.URL != ""}, {"headers", len(s.Headers) > 0}, {"body", s.Body != nil},
	} {
		if c.set {
			u = append(u, c.name)
		}
	}
	return u
}

// locate finds the line and column of a field path such as "steps[2].kind".
// When the field itself is absent it falls back to its closest parent.
func locate(f *ast.File, field string) (int, int) {
	for p := field; p != ""; {
		if path, err := yaml.PathString("$." + p); err == nil {
			if n, err := path.FilterFile(f); err == nil && n != nil && n.GetToken() != nil {
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
