package workflow

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/expression"
	"jetflow.dev/pkg/retention"
)

var (
	// handlerSegRe matches the path segments of on-error steps.
	handlerSegRe = regexp.MustCompile(`^on-error[0-9]*$`)
	// compensateSegRe matches the path segments of compensate steps.
	compensateSegRe = regexp.MustCompile(`^compensate[0-9]*$`)
	varRe           = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)
	signalRe        = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)
)

// kindFields lists, per kind, the fields beyond the common ones (id, kind,
// description, condition, output) that the kind accepts.
var kindFields = map[string][]string{
	KindNoop:   {"queue", "local", "timeout", "retry"},
	KindLog:    {"queue", "local", "timeout", "retry", "message", "level"},
	KindExec:   {"queue", "timeout", "heartbeat", "retry", "command", "args", "env", "dir"},
	KindHTTP:   {"queue", "timeout", "retry", "method", "url", "headers", "body"},
	KindCall:   {"queue", "local", "timeout", "heartbeat", "retry", "operation", "input"},
	KindLet:    {"vars"},
	KindSleep:  {"duration", "until"},
	KindWait:   {"signal", "signals", "match", "timeout"},
	KindFail:   {"message"},
	KindReturn: {},
	KindGoto:   {"target"},
	KindRetry:  {"retry", "replay", "next"},
	// replayable: its replayable field is required.
	KindReplayable: {},
	KindClearLock:  {"lock", "reason"},
	KindContinue:   {"input", "version"},
	// Containers.
	KindWorkflow: {"steps", "workflow", "version", "input", "lock", "semaphore", "lock_timeout", "child", "on_parent_end"},
	KindForeach:  {"items", "concurrency", "steps"},
	KindParallel: {"branches", "mode"},
	KindSwitch:   {"cases", "default"},
}

// Article is "a" or "an" before a kind's name.
func Article(kind string) string { return article(kind) }

// article is "a" or "an" before a kind's name.
func article(kind string) string {
	if kind != "" && strings.ContainsRune("aeiou", rune(kind[0])) || strings.HasPrefix(kind, "http") {
		return "an"
	}
	return "a"
}

// appliesTo names, for a field that only some kinds take, those kinds.
func appliesTo(field string) string {
	var kinds []string
	for _, k := range Kinds {
		if slices.Contains(kindFields[k], field) {
			kinds = append(kinds, k)
		}
	}
	if len(kinds) == 0 || len(kinds) > 4 {
		return ""
	}
	return " (only to " + strings.Join(kinds, ", ") + ")"
}

// MinHeartbeat is the shortest heartbeat a step may ask for.
const MinHeartbeat = 100 * time.Millisecond

// MaxDepth bounds how deep containers nest.
const MaxDepth = 8

// Roots of expressions inside a foreach body: the current item and its index.
var foreachRoots = []string{"item", "index"}

func (d Definition) validate() []FieldError {
	var ps []FieldError
	add := func(field, format string, args ...any) {
		ps = append(ps, FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
	}
	var addErr func(field string, err error)
	addErr = func(field string, err error) {
		var ee *expression.Error
		var at *expression.PathError
		if errors.As(err, &at) {
			field += at.Path // the member of the field's value: steps[2].vars.total
			err = at.Err
		}
		if ps := eachProblem(err); len(ps) > 1 { // a string's expressions' problems, each its own
			for _, e := range ps {
				addErr(field, e)
			}
			return
		}
		switch {
		case errors.As(err, &ee):
			// On one line already, its expression's spacing kept: the
			// character it gives counts in the expression shown.
			fe := FieldError{Field: field, Message: err.Error()}
			if at, ok := ee.Offset(); ok {
				fe.at = at + 1
			}
			ps = append(ps, fe)
		case err != nil:
			add(field, "%s", strings.Join(strings.Fields(err.Error()), " "))
		}
	}
	switch {
	case d.Name == "":
		add("name", "is required")
	case !events.ValidWorkflowName(d.Name):
		add("name", "%q: %s", d.Name, events.WorkflowNameRule)
	}
	if len(d.Steps) == 0 {
		add("steps", "at least one step is required")
	}
	switch {
	case d.Version < 0:
		add("version", "must be a positive version number (or absent, to let the registry number versions), not %d", d.Version)
	case d.Version > MaxVersion:
		add("version", "must be at most %d (the largest whole number every JSON reader keeps exact), not %d", MaxVersion, d.Version)
	}
	if d.Input != nil {
		if _, err := compileSchema(d.Input); err != nil {
			field, msg := schemaProblem(err)
			add(field, "%s", msg)
		}
	}
	addErr("output", expression.Compile(d.Output, nil))
	if _, err := jsonable(d.Output); err != nil {
		addErr("output", err)
	}
	checkDuration(add, "timeout", d.Timeout)
	checkRetry(add, "retry", d.Retry)
	checkRetention(add, "retention", d.Retention, expression.Roots)
	if d.Lock != "" && d.Retention.disabled() {
		add("retention", "disabled cannot go with lock: a holder deleted when it ends leaves nothing to resume, replay or explain the lock by; keep it a while (e.g. 1h)")
	}
	checkLock(add, addErr, func(n string) string { return n }, d.Lock, d.Semaphore, expression.Roots)

	checkWorkflowReplay(add, "", d.Idempotent, d.Replayable)
	validateSteps(add, addErr, "steps", d.Steps, 0, nil)
	validateHandler(add, addErr, "on-error", d.OnError, d.Steps, 0, nil, false)
	for i, w := range d.CompensateOn {
		if w != CompensateOnFailure && w != CompensateOnCancel {
			add(fmt.Sprintf("compensate_on[%d]", i), "%q is not failure or cancel (when the compensate steps run; an operator's compensate action runs them anyway)", w)
		}
	}
	checkSearchAttributes(add, d)
	return ps
}

// validateHandler checks on-error steps: they see the root error, their
// gotos move within the list of the step that failed (outer), and retry
// steps are allowed where a step failed (not in the workflow's handler).
func validateHandler(add func(string, string, ...any), addErr func(string, error), prefix string, steps, outer []Step, depth int, extra []string, retryOK bool) {
	if len(steps) == 0 {
		return
	}
	validateStepList(add, addErr, prefix, steps, depth+1, append(append([]string{}, extra...), "error"), outer, retryOK)
}

// validateSteps checks a list of steps (the workflow's, or a container's)
// whose field paths start with prefix; extra are expression roots beyond
// the usual ones (item and index in a foreach body).
func validateSteps(add func(string, string, ...any), addErr func(string, error), prefix string, steps []Step, depth int, extra []string) {
	validateStepList(add, addErr, prefix, steps, depth, extra, steps, false)
}

// validateStepList checks steps whose gotos target gotoList and where retry
// steps are allowed only if retryOK (an on-error list of a step).
func validateStepList(add func(string, string, ...any), addErr func(string, error), prefix string, steps []Step, depth int, extra []string, gotoList []Step, retryOK bool) {
	roots := append(append([]string{}, expression.Roots...), extra...)
	seen := map[string]int{}
	for i, s := range steps {
		f := func(name string) string { return fmt.Sprintf("%s[%d].%s", prefix, i, name) }
		switch {
		case s.ID == "":
			add(f("id"), "is required")
		case !events.ValidStepID(s.ID):
			add(f("id"), "%q: %s", s.ID, events.StepIDRule)
		case handlerSegRe.MatchString(s.ID):
			add(f("id"), "%q is reserved (on-error steps' paths use it); choose another id", s.ID)
		case compensateSegRe.MatchString(s.ID):
			add(f("id"), "%q is reserved (compensate steps' paths use it); choose another id", s.ID)
		default:
			if j, dup := seen[s.ID]; dup {
				add(f("id"), "%q is already the id of %s[%d]; step ids must be unique within a list", s.ID, prefix, j)
			}
			seen[s.ID] = i
		}
		accepted, known := kindFields[s.Kind]
		switch {
		case s.Kind == "":
			add(f("kind"), "is required (one of %s)", strings.Join(Kinds, ", "))
			continue
		case !known:
			add(f("kind"), "unknown step kind %q%s (known kinds: %s)", s.Kind, spellingHint(s.Kind, Kinds), strings.Join(Kinds, ", "))
			continue
		}
		for _, u := range s.usedFields() {
			if !contains(accepted, u) {
				add(f(u), "does not apply to %s %s step%s", article(s.Kind), s.Kind, appliesTo(u))
			}
		}
		if s.SecretRefs != nil {
			add(f("secret_refs"), "is written by the dispatcher into the step it sends to an agent, never in a definition")
		}
		if s.Condition != "" {
			addErr(f("condition"), expression.CompileCondition(s.Condition, roots))
		}
		outRoots := append(append([]string{}, roots...), "result")
		if s.Kind == KindReturn {
			outRoots = roots
		}
		if s.Output != nil && contains([]string{KindLet, KindSleep, KindFail, KindGoto, KindRetry, KindContinue}, s.Kind) {
			add(f("output"), "does not apply to %s %s step (it has no result to map)", article(s.Kind), s.Kind)
		}
		addErr(f("output"), expression.Compile(s.Output, outRoots))
		if _, err := jsonable(s.Output); err != nil {
			addErr(f("output"), err)
		}
		if s.Queue != "" && !events.ValidQueueName(s.Queue) {
			add(f("queue"), "%q: %s", s.Queue, events.QueueNameRule)
		}
		checkDuration(add, f("timeout"), s.Timeout)
		checkDuration(add, f("heartbeat"), s.Heartbeat)
		if hb, err := time.ParseDuration(s.Heartbeat); err == nil && hb > 0 && hb < MinHeartbeat {
			add(f("heartbeat"), "%q is shorter than %s, the shortest heartbeat allowed", s.Heartbeat, MinHeartbeat)
		}
		checkRetry(add, f("retry"), s.Retry)
		checkRetention(add, f("retention"), s.Retention, roots)
		if s.Kind == KindWorkflow && s.Lock != "" && s.Retention.disabled() {
			add(f("retention"), "disabled cannot go with lock: a holder deleted when it ends leaves nothing to resume, replay or explain the lock by; keep it a while (e.g. 1h)")
		}
		s.validateKind(add, addErr, f, roots)
		s.validateLocal(add, f)
		switch s.Kind {
		case KindWorkflow:
			checkLock(add, addErr, f, s.Lock, s.Semaphore, roots)
			checkDuration(add, f("lock_timeout"), s.LockTimeout)
			if s.LockTimeout != "" && s.Lock == "" && s.Workflow == "" {
				add(f("lock_timeout"), "bounds the wait for a lock: give lock too")
			}
		case KindClearLock:
			if s.Lock == "" {
				add(f("lock"), "is required for a clear-lock step: the name of the lock whose holders it clears")
			}
			checkLock(add, addErr, f, s.Lock, 0, roots)
			addErr(f("reason"), expression.Compile(s.Reason, roots))
		}
		if s.Kind == KindGoto {
			switch {
			case s.Target == "":
				add(f("target"), "is required: the id of a step of this list, or end")
			case s.Target != GotoEnd && !hasStep(gotoList, s.Target):
				add(f("target"), "%q is not the id of a step of this list (a goto moves within its list, or within the failed step's list from on-error; or use end)", s.Target)
			}
		}
		if s.Kind == KindGoto && gotoList != nil && !retryOK && prefix == "on-error" {
			add(f("kind"), "a goto in the workflow's on-error steps has no list to move in; put on-error on the step that fails")
		}
		if s.Kind == KindRetry {
			switch {
			case !retryOK && !(s.Replay && contains(extra, "error")):
				add(f("kind"), "a retry step belongs in the on-error steps of a step (it runs that step again); with replay: true, in any on-error steps")
			case s.Retry == nil:
				add(f("retry"), "is required: the limit of attempts in all (and a backoff), e.g. {limit: 3}")
			}
		}
		s.checkReplay(add, f, gotoList)
		validateHandler(add, addErr, f("on-error"), s.OnError, steps, depth, extra, true)
		if len(s.Compensate) > 0 {
			switch s.Kind {
			case KindGoto, KindRetry, KindReturn, KindFail, KindContinue, KindReplayable:
				add(f("compensate"), "does not apply to %s %s step: it does nothing to undo", article(s.Kind), s.Kind)
			}
			for j, c := range s.Compensate {
				if c.Kind == KindReturn || c.Kind == KindContinue {
					add(fmt.Sprintf("%s[%d].kind", f("compensate"), j), "a compensation cannot end the execution (%s): it undoes one step", c.Kind)
				}
			}
			validateStepList(add, addErr, f("compensate"), s.Compensate, depth+1, append(append([]string{}, extra...), "compensating"), s.Compensate, false)
		}
		if IsContainer(s.Kind) {
			if depth+1 >= MaxDepth {
				add(f("kind"), "containers nest at most %d deep", MaxDepth)
				continue
			}
			s.validateContainer(add, addErr, f, depth, extra, roots)
		}
	}
}

// childField is the child execution field a workflow step sets: child,
// or on_parent_end without it.
func childField(s Step) string {
	if s.Child {
		return "child"
	}
	return "on_parent_end"
}

// validateContainer checks the nested steps of a container.
func (s Step) validateContainer(add func(string, string, ...any), addErr func(string, error), f func(string) string, depth int, extra, roots []string) {
	switch s.Kind {
	case KindWorkflow:
		switch {
		case len(s.Steps) > 0 && s.Workflow != "":
			add(f("workflow"), "give steps (a block) or workflow (another workflow's name), not both")
		case len(s.Steps) > 0:
			if s.Input != nil || s.Version != 0 {
				add(f("input"), "input and version apply to a workflow called by name, not to a block of steps")
			}
			if s.Child || s.OnParentEnd != "" {
				add(f(childField(s)), "a block of steps runs inline: %s applies to a workflow called by name (workflow: <name>)", childField(s))
			}
			validateSteps(add, addErr, f("steps"), s.Steps, depth+1, extra)
		case s.Workflow != "":
			if !events.ValidWorkflowName(s.Workflow) {
				add(f("workflow"), "%q is not a workflow name", s.Workflow)
			}
			if s.Version < 0 {
				add(f("version"), "must be 0 (the latest when the step runs) or a version number")
			}
			addErr(f("input"), expression.Compile(s.Input, roots))
			switch {
			case s.OnParentEnd != "" && !s.Child:
				add(f("on_parent_end"), "applies to a child execution: give child: true too")
			case s.OnParentEnd != "" && s.OnParentEnd != OnParentEndCancel && s.OnParentEnd != OnParentEndAbandon:
				add(f("on_parent_end"), "%q is not a policy: use cancel (the default) or abandon", s.OnParentEnd)
			case s.Child && s.Retention != "":
				add(f("retention"), "a child execution keeps the retention of the workflow it runs: set retention in that workflow")
			}
		case s.Retention != "":
			// Only a change of retention (the seed's "workflow retention <value>").
			if s.Input != nil || s.Version != 0 {
				add(f("input"), "input and version apply to a workflow called by name")
			}
			if s.Child || s.OnParentEnd != "" {
				add(f(childField(s)), "applies to a workflow called by name (workflow: <name>)")
			}
		case s.Child || s.OnParentEnd != "":
			add(f("workflow"), "is required with %s: the name of the workflow to run as a child execution", childField(s))
		default:
			add(f("steps"), "a workflow step needs steps (a block), workflow (another workflow's name) or retention")
		}
	case KindForeach:
		if s.Items == nil {
			add(f("items"), "is required: a list, or an expression giving one")
		}
		addErr(f("items"), expression.CompileList(s.Items, roots))
		if s.Concurrency < 0 {
			add(f("concurrency"), "must be at least 1 (0 or absent means 1: one item at a time)")
		}
		if len(s.Steps) == 0 {
			add(f("steps"), "a foreach step needs steps to run for each item")
		}
		validateSteps(add, addErr, f("steps"), s.Steps, depth+1, append(append([]string{}, extra...), foreachRoots...))
	case KindParallel:
		if len(s.Branches) == 0 {
			add(f("branches"), "a parallel step needs at least one branch")
		}
		if s.Mode != "" && s.Mode != ModeAll && s.Mode != ModeFirst {
			add(f("mode"), "%q is not all or first", s.Mode)
		}
		seen := map[string]bool{}
		for i, b := range s.Branches {
			bf := fmt.Sprintf("%s[%d]", f("branches"), i)
			switch {
			case !events.ValidStepID(b.ID):
				add(bf+".id", "%q: %s", b.ID, events.StepIDRule)
			case handlerSegRe.MatchString(b.ID):
				add(bf+".id", "%q is reserved (on-error steps' paths use it); choose another id", b.ID)
			case compensateSegRe.MatchString(b.ID):
				add(bf+".id", "%q is reserved (compensate steps' paths use it); choose another id", b.ID)
			case seen[b.ID]:
				add(bf+".id", "%q is already the id of another branch", b.ID)
			}
			seen[b.ID] = true
			if len(b.Steps) == 0 {
				add(bf+".steps", "a branch needs steps")
			}
			validateSteps(add, addErr, bf+".steps", b.Steps, depth+1, extra)
		}
	case KindSwitch:
		if len(s.Cases) == 0 {
			add(f("cases"), "a switch step needs at least one case")
		}
		for i, c := range s.Cases {
			cf := fmt.Sprintf("%s[%d]", f("cases"), i)
			if c.When == "" {
				add(cf+".when", "is required: the condition of this case")
			} else {
				addErr(cf+".when", expression.CompileCondition(c.When, roots))
			}
			if len(c.Steps) == 0 {
				add(cf+".steps", "a case needs steps")
			}
			validateSteps(add, addErr, cf+".steps", c.Steps, depth+1, extra)
		}
		validateSteps(add, addErr, f("default"), s.Default, depth+1, extra)
	}
}

func (s Step) validateKind(add func(string, string, ...any), addErr func(string, error), f func(string) string, roots []string) {
	template := func(field string, v any) { addErr(f(field), expression.Compile(v, roots)) }
	// The fields an agent receives may reference secrets, which it resolves.
	secretRoots := append(append([]string{}, roots...), expression.SecretRoot)
	agentTemplate := func(field string, v any) { addErr(f(field), expression.Compile(v, secretRoots)) }
	switch s.Kind {
	case KindLog:
		if s.Message == "" {
			add(f("message"), "is required for a log step")
		}
		template("message", s.Message)
		if !levels[s.Level] {
			add(f("level"), "%q is not one of debug, info, warn, error", s.Level)
		}
	case KindExec:
		if s.Command == "" {
			add(f("command"), "is required for an exec step")
		}
		template("command", s.Command)
		agentTemplate("dir", s.Dir)
		for i, a := range s.Args {
			agentTemplate(fmt.Sprintf("args[%d]", i), a)
		}
		for k, v := range s.Env {
			agentTemplate("env"+expression.Member(k), v)
		}
	case KindHTTP:
		if s.Method != "" && !expression.IsTemplate(s.Method) && !tokenRe.MatchString(s.Method) {
			add(f("method"), "%q is not an HTTP method", s.Method)
		}
		template("method", s.Method)
		switch {
		case s.URL == "":
			add(f("url"), "is required for an http step")
		case expression.IsTemplate(s.URL):
			agentTemplate("url", s.URL)
		default:
			if u, err := url.Parse(s.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				add(f("url"), "%q must be an absolute http or https URL", s.URL)
			}
		}
		for k, v := range s.Headers {
			if !tokenRe.MatchString(k) {
				add(f("headers"), "%q is not a valid header name", k)
			}
			agentTemplate("headers"+expression.Member(k), v)
		}
		if _, err := jsonable(s.Body); err != nil { // e.g. .nan or .inf, which Canonical cannot encode
			add(f("body"), "cannot be encoded as JSON: %v", err)
		}
		agentTemplate("body", s.Body)
	case KindCall:
		if s.Operation == "" {
			add(f("operation"), "is required for a call step: the name of a custom operation an agent of the queue handles")
		} else if !events.ValidQueueName(s.Operation) { // the rule of queue names
			add(f("operation"), "%q: %s", s.Operation, events.QueueNameRule)
		}
		if _, err := jsonable(s.Input); err != nil {
			add(f("input"), "cannot be encoded as JSON: %v", err)
		}
		if s.Local { // a dispatcher holds no secrets
			err, secret := without(expression.Compile(s.Input, roots), expression.ErrSecretNotAllowed)
			if secret {
				add(f("input"), "references a secret: a local step runs in the dispatcher, which holds none (drop local to run it on an agent)")
			}
			addErr(f("input"), err) // its other problems
		} else {
			agentTemplate("input", s.Input)
		}
	case KindLet:
		if len(s.Vars) == 0 {
			add(f("vars"), "is required for a let step: the variables to set")
		}
		for k, v := range s.Vars {
			if !varRe.MatchString(k) {
				add(f("vars"), "%q is not a variable name (letters, digits and '_', not starting with a digit)", k)
			}
			template("vars"+expression.Member(k), v)
		}
		if _, err := jsonable(s.Vars); err != nil {
			add(f("vars"), "cannot be encoded as JSON: %v", err)
		}
	case KindSleep:
		switch {
		case (s.Duration == "") == (s.Until == ""):
			add(f("duration"), "a sleep step needs either duration (e.g. 10s) or until (an RFC 3339 time)")
		case s.Duration != "" && expression.IsTemplate(s.Duration):
			template("duration", s.Duration)
		case s.Duration != "":
			checkDuration(add, f("duration"), s.Duration)
		case expression.IsTemplate(s.Until):
			template("until", s.Until)
		default:
			if _, err := time.Parse(time.RFC3339Nano, s.Until); err != nil {
				add(f("until"), "%q is not an RFC 3339 time (e.g. 2026-12-24T18:00:00Z)", s.Until)
			}
		}
	case KindWait:
		names := s.WaitSignals()
		switch {
		case s.Signal != "" && len(s.Signals) > 0:
			add(f("signals"), "give signal or signals, not both")
		case len(names) == 0:
			add(f("signal"), "is required for a wait step: the name of the signal to wait for")
		}
		field := f("signal")
		if s.Signal == "" {
			field = f("signals")
		}
		for _, n := range names {
			if !signalRe.MatchString(n) {
				add(field, "%q is not a signal name (letters, digits, '-' and '_')", n)
			}
		}
		if s.Match != "" {
			addErr(f("match"), expression.CompileCondition(s.Match, append(append([]string{}, roots...), "signal")))
		}
	case KindFail:
		template("message", s.Message)
	case KindContinue:
		template("input", s.Input)
		if s.Version < 0 {
			add(f("version"), "must be 0 (the latest when the step runs) or a version number")
		}
	}
}

// validateLocal checks a local step (docs/adr/0014): it runs in the
// dispatcher, at least once.
func (s Step) validateLocal(add func(string, string, ...any), f func(string) string) {
	if !s.Local {
		return
	}
	if s.Queue != "" {
		add(f("queue"), "does not go with local: a local step runs in the dispatcher, on no agent queue")
	}
	if s.Heartbeat != "" {
		add(f("heartbeat"), "does not go with local: a local step's handler runs in the dispatcher, bounded by its timeout")
	}
	switch normalIdempotent(s.Idempotent) {
	case IdempotentNo:
		add(f("idempotent"), "no does not go with local: a local step runs again when its dispatcher stops before its result is recorded")
	case IdempotentYes:
	default:
		if s.Kind == KindCall {
			add(f("idempotent"), "must be yes on a local call step: it runs again when its dispatcher stops before its result is recorded, so its handler must be safe to run twice")
		}
	}
}

// OperationKind is the handler an agent runs the step with: the operation
// name of a call step, the kind otherwise.
func (s Step) OperationKind() string {
	if s.Kind == KindCall {
		return s.Operation
	}
	return s.Kind
}

// WaitSignals returns the signal names a wait step waits for.
func (s Step) WaitSignals() []string {
	if s.Signal != "" {
		return []string{s.Signal}
	}
	return s.Signals
}

func (s Step) usedFields() []string {
	var u []string
	for _, c := range []struct {
		name string
		set  bool
	}{
		{"queue", s.Queue != ""}, {"local", s.Local}, {"timeout", s.Timeout != ""}, {"heartbeat", s.Heartbeat != ""}, {"retry", s.Retry != nil},
		{"message", s.Message != ""}, {"level", s.Level != ""},
		{"command", s.Command != ""}, {"args", len(s.Args) > 0}, {"env", len(s.Env) > 0}, {"dir", s.Dir != ""},
		{"method", s.Method != ""}, {"url", s.URL != ""}, {"headers", len(s.Headers) > 0}, {"body", s.Body != nil},
		{"operation", s.Operation != ""}, {"input", s.Input != nil}, {"vars", len(s.Vars) > 0},
		{"duration", s.Duration != ""}, {"until", s.Until != ""},
		{"signal", s.Signal != ""}, {"signals", len(s.Signals) > 0}, {"match", s.Match != ""},
		{"target", s.Target != ""}, {"steps", len(s.Steps) > 0}, {"workflow", s.Workflow != ""}, {"version", s.Version != 0},
		{"items", s.Items != nil}, {"concurrency", s.Concurrency != 0}, {"branches", len(s.Branches) > 0},
		{"mode", s.Mode != ""}, {"cases", len(s.Cases) > 0}, {"default", len(s.Default) > 0},
		{"replay", s.Replay}, {"next", s.Next != ""},
		{"lock", s.Lock != ""}, {"semaphore", s.Semaphore != 0}, {"lock_timeout", s.LockTimeout != ""}, {"reason", s.Reason != ""},
		{"child", s.Child}, {"on_parent_end", s.OnParentEnd != ""},
	} {
		if c.set {
			u = append(u, c.name)
		}
	}
	return u
}

func checkDuration(add func(string, string, ...any), field, v string) {
	if v == "" {
		return
	}
	if expression.IsTemplate(v) {
		add(field, "%q: give a literal duration here (e.g. 30s); expressions are allowed only in a sleep's duration and until", v)
		return
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		add(field, "%q is not a positive duration (e.g. 30s, 5m, 2h)", v)
	}
}

// checkRetention parses a retention rule; the key of its hash may hold
// expressions over roots.
// disabled reports whether the rule is (or starts with) disabled.
func (r Retention) disabled() bool {
	spec, err := retention.Parse(string(r))
	return err == nil && spec.Rule.Op == retention.OpDisabled
}

func checkRetention(add func(string, string, ...any), field string, r Retention, roots []string) {
	if r == "" {
		return
	}
	spec, err := retention.Parse(string(r))
	if err != nil {
		add(field, "%q is not a retention rule: %s", string(r), strings.TrimPrefix(err.Error(), retention.ErrInvalid.Error()+": "))
		return
	}
	if spec.Hash != "" {
		for _, err := range eachProblem(expression.Compile(spec.Hash, roots)) {
			add(field, "hash %s", oneLine(err))
		}
	}
}

// eachProblem is err's problems: each of a join (a string's
// expressions'), or err alone; none for nil.
func eachProblem(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok { //nolint:errorlint // a join's own members
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// without is err without its problems that are target (inside a
// member's PathError too), and whether it had one.
func without(err, target error) (rest error, had bool) {
	var pe *expression.PathError
	if errors.As(err, &pe) {
		rest, had := without(pe.Err, target)
		if rest == nil {
			return nil, had
		}
		return &expression.PathError{Path: pe.Path, Err: rest}, had
	}
	var keep []error
	for _, e := range eachProblem(err) {
		if errors.Is(e, target) {
			had = true
			continue
		}
		keep = append(keep, e)
	}
	if len(keep) == 1 {
		return keep[0], had
	}
	return errors.Join(keep...), had
}

func checkRetry(add func(string, string, ...any), field string, r *Retry) {
	if r == nil {
		return
	}
	if r.Limit < 1 || r.Limit > 1000 {
		add(field+".limit", "must be between 1 and 1000 (attempts in all, the first included)")
	}
	if r.Jitter < 0 || r.Jitter > 1 {
		add(field+".jitter", "must be between 0 and 1")
	}
	for _, on := range r.On {
		if strings.TrimSpace(on) == "" {
			add(field+".on", "holds an empty text")
		}
	}
	if b := r.Backoff; b != nil {
		checkDuration(add, field+".backoff.initial", b.Initial)
		checkDuration(add, field+".backoff.max", b.Max)
		if b.Factor != 0 && b.Factor < 1 {
			add(field+".backoff.factor", "must be at least 1")
		}
	}
}

// Delay is the backoff before attempt n+1 (n >= 1), without jitter.
func (r *Retry) Delay(n int) time.Duration {
	initial, max, factor := time.Second, time.Minute, 2.0
	if r != nil && r.Backoff != nil {
		if d, err := time.ParseDuration(r.Backoff.Initial); err == nil {
			initial = d
		}
		if d, err := time.ParseDuration(r.Backoff.Max); err == nil {
			max = d
		}
		if r.Backoff.Factor >= 1 {
			factor = r.Backoff.Factor
		}
	}
	d := float64(initial)
	for i := 1; i < n && d < float64(max); i++ {
		d *= factor
	}
	return min(time.Duration(d), max)
}

// Retries reports whether error msg may be retried by r.
func (r *Retry) Retries(msg string) bool {
	if r == nil {
		return false
	}
	if len(r.On) == 0 {
		return true
	}
	for _, on := range r.On {
		if strings.Contains(msg, on) {
			return true
		}
	}
	return false
}

// RetryOf returns the retry policy of step s.
func (d Definition) RetryOf(s Step) *Retry {
	if !IsOperation(s.Kind) {
		return nil
	}
	if s.Retry != nil {
		return s.Retry
	}
	return d.Retry
}

func hasStep(steps []Step, id string) bool {
	for _, s := range steps {
		if s.ID == id {
			return true
		}
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func jsonable(v any) ([]byte, error) { return json.Marshal(v) }

func oneLine(err error) string { return strings.Join(strings.Fields(err.Error()), " ") }

var schemas sync.Map // digest of the schema's JSON -> *jsonschema.Schema

// schemaURL names an input schema while it is compiled: not a file, so
// that nothing about the machine shows in errors.
const (
	schemaBase = "https://jetflow.invalid/"
	schemaURL  = schemaBase + "input.schema.json"
)

// noLoader refuses every document a schema refers to: an input schema is
// self-contained (a $ref to a file or URL would let whoever registers a
// workflow read the api's files or call out).
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	if rest, ok := strings.CutPrefix(url, schemaBase); ok {
		url = "/" + rest // as written: a path resolved against the schema's own name
	}
	return nil, fmt.Errorf("an input schema may use the standard JSON Schema drafts and refer only to itself (a $ref such as #/$defs/x), not to %s", url)
}

// schemaProblem explains why an input schema does not compile: the field
// at fault under input and what is wrong with it, in one line.
func schemaProblem(err error) (field, msg string) {
	var sve *jsonschema.SchemaValidationError
	if errors.As(err, &sve) {
		if verr := (*jsonschema.ValidationError)(nil); errors.As(sve.Err, &verr) {
			leaf := verr
			for len(leaf.Causes) > 0 { // the first way it could have been valid
				leaf = leaf.Causes[0]
			}
			return "input" + dotted(leaf.InstanceLocation), "is not a valid JSON Schema: " + leaf.ErrorKind.LocalizedString(printer)
		}
	}
	var lue *jsonschema.LoadURLError
	if errors.As(err, &lue) {
		return "input", "is not a valid JSON Schema: " + oneLine(lue.Err)
	}
	return "input", "is not a valid JSON Schema: " + strings.ReplaceAll(oneLine(err), schemaURL, "")
}

func compileSchema(schema map[string]any) (*jsonschema.Schema, error) {
	b, err := json.Marshal(schema)
	if err != nil {
		return nil, err
	}
	if s, ok := schemas.Load(string(b)); ok {
		return s.(*jsonschema.Schema), nil
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	// A schema is the user's: a $ref or $schema naming a file or URL must
	// not make the api or a dispatcher read its disk or call out.
	c.UseLoader(noLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, err
	}
	s, err := c.Compile(schemaURL)
	if err != nil {
		return nil, err
	}
	schemas.Store(string(b), s)
	return s, nil
}

// CheckInput validates an execution's input against the definition's
// input schema. Each problem names the field of the input at fault; they
// come sorted by field, then message, so that the same input always gives
// the same first problem (the schema library's order varies).
func (d Definition) CheckInput(input json.RawMessage) []FieldError {
	if d.Input == nil {
		return nil
	}
	sch, err := compileSchema(d.Input)
	if err != nil {
		field, msg := schemaProblem(err) // field is in the schema, not in the input
		return []FieldError{{Field: "input", Message: "the workflow's input schema is invalid: " + field + " " + msg}}
	}
	if len(bytes.TrimSpace(input)) == 0 || string(bytes.TrimSpace(input)) == "null" {
		input = json.RawMessage(`{}`)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(input))
	if err != nil {
		return []FieldError{{Field: "input", Message: "is not valid JSON: " + oneLine(err)}}
	}
	var verr *jsonschema.ValidationError
	if !errors.As(sch.Validate(inst), &verr) || verr == nil {
		return nil
	}
	out := schemaProblems(verr, nil, false)
	out = slices.Compact(slices.SortedFunc(slices.Values(out), compareFieldErrors))
	if len(out) == 0 {
		out = []FieldError{{Field: "input", Message: oneLine(verr)}}
	}
	return out
}

func compareFieldErrors(a, b FieldError) int {
	return cmp.Or(strings.Compare(a.Field, b.Field), strings.Compare(a.Message, b.Message))
}

// printer words the schema library's messages.
var printer = message.NewPrinter(language.English)

// schemaProblems appends to out what is wrong with the input, and where,
// from the schema library's tree of errors. The nodes that only gather
// their causes, each of which must be fixed (the schema itself, a $ref,
// an allOf, a group), are gone through to what they gather: the
// library's basic output keeps a $ref's "validation failed" instead of
// the problems under it. Any other node with causes (an anyOf, a oneOf:
// alternatives; a contains, a propertyNames: why) is one problem, its
// own message followed by its causes', named from where it stands; a
// node such as that within the causes (inside is true) gives its own
// message only, and a message is cut at maxSchemaMessage: nested
// alternatives spelt out whole grow with the product of their branches.
func schemaProblems(e *jsonschema.ValidationError, out []FieldError, inside bool) []FieldError {
	switch e.ErrorKind.(type) {
	case *kind.Schema, *kind.Reference, *kind.AllOf, *kind.Group:
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				out = schemaProblems(c, out, inside)
			}
			return out
		}
	}
	field := "input" + dotted(e.InstanceLocation)
	if req, ok := e.ErrorKind.(*kind.Required); ok {
		// The member that is missing, not the object it is missing from.
		for _, name := range req.Missing {
			out = append(out, FieldError{Field: field + "." + name, Message: "is required"})
		}
		return out
	}
	msg := e.ErrorKind.LocalizedString(printer)
	if len(e.Causes) > 0 && !inside {
		sep := "; "
		switch e.ErrorKind.(type) {
		case *kind.AnyOf, *kind.OneOf:
			sep = "; or "
		}
		var causes []string
		for _, c := range e.Causes {
			var said []string
			// Sorted: the library finds a branch's problems in the order
			// of a map's keys, which differs from run to run.
			for _, p := range slices.SortedFunc(slices.Values(schemaProblems(c, nil, true)), compareFieldErrors) {
				// Named from where the node stands.
				rel := strings.TrimPrefix(strings.TrimPrefix(p.Field, field), ".")
				switch {
				case rel != "" && p.Message == "is required":
					said = append(said, rel+" "+p.Message)
				case rel != "":
					said = append(said, rel+": "+p.Message)
				default:
					said = append(said, p.Message)
				}
			}
			causes = append(causes, strings.Join(said, " and "))
		}
		msg += ": " + strings.Join(causes, sep)
	}
	if len(msg) > maxSchemaMessage {
		msg = strings.ToValidUTF8(msg[:maxSchemaMessage], "") + " …"
	}
	return append(out, FieldError{Field: field, Message: msg})
}

// maxSchemaMessage bounds one problem's message (bytes): it is answered
// to the caller and may be recorded in an event.
const maxSchemaMessage = 1024

// dotted turns the tokens of a place in the input into the dotted path
// problems name fields by (.hosts.1, .a/b): member names as written.
func dotted(tokens []string) string {
	var b strings.Builder
	for _, t := range tokens {
		b.WriteString(".")
		b.WriteString(t)
	}
	return b.String()
}
