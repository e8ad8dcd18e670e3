package workflow

import (
	"slices"
	"strings"
)

// Values of a step's idempotent field (and "all" on a workflow or block).
const (
	IdempotentYes     = "yes"
	IdempotentNo      = "no"
	IdempotentDefault = "default"
	IdempotentAll     = "all"
)

// Values of a step's replayable field.
const (
	ReplayFromHere     = "from here"
	ReplayFromHereOnly = "from here only"
	ReplayReset        = "reset"
	// On a workflow (or a workflow block):
	ReplayEnabled       = "enabled"
	ReplayDisabled      = "disabled"
	ReplayFromStart     = "from start"
	ReplayAutomatically = "automatically"
)

// ReplayPolicy is a workflow's replayable field, parsed.
type ReplayPolicy struct {
	// Disabled: operators (and jetflow itself) may not replay it.
	Disabled bool
	// FromStart: the start of the workflow is a replay point.
	FromStart bool
	// Automatically: an execution interrupted by a crash is replayed
	// (resuming) without an operator.
	Automatically bool
}

// ReplayPolicy returns the workflow's replayable setting.
func (d Definition) ReplayPolicy() ReplayPolicy {
	p, _ := parseWorkflowReplay(d.Replayable)
	return p
}

// parseWorkflowReplay parses "enabled", "disabled", "from start",
// "automatically" or "automatically from start" (in either order).
func parseWorkflowReplay(v string) (ReplayPolicy, bool) {
	var p ReplayPolicy
	rest := strings.Join(strings.Fields(strings.ToLower(v)), " ")
	switch rest {
	case "", ReplayEnabled:
		return p, true
	case ReplayDisabled:
		return ReplayPolicy{Disabled: true}, true
	}
	for rest != "" {
		switch {
		case strings.HasPrefix(rest, ReplayFromStart) && !p.FromStart:
			p.FromStart, rest = true, strings.TrimSpace(strings.TrimPrefix(rest, ReplayFromStart))
		case strings.HasPrefix(rest, ReplayAutomatically) && !p.Automatically:
			p.Automatically, rest = true, strings.TrimSpace(strings.TrimPrefix(rest, ReplayAutomatically))
		default:
			return p, false
		}
	}
	return p, true
}

// normalIdempotent maps the accepted spellings to yes, no or default.
func normalIdempotent(v string) string {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", IdempotentDefault:
		return IdempotentDefault
	case IdempotentYes, "true":
		return IdempotentYes
	case IdempotentNo, "false":
		return IdempotentNo
	case IdempotentAll:
		return IdempotentAll
	}
	return "?"
}

// ReplayMark returns the step's replay point setting: from here, from
// here only, reset, or "" (none). A workflow block replayable from start
// is a replay point itself.
func (s Step) ReplayMark() string {
	v := strings.Join(strings.Fields(strings.ToLower(s.Replayable)), " ")
	switch v {
	case ReplayFromHere, ReplayFromHereOnly, ReplayReset:
		return v
	case ReplayFromStart:
		if s.Kind == KindWorkflow {
			return ReplayFromHere
		}
	}
	return ""
}

// ReplayDisabled reports whether a workflow block hides the steps inside
// it from replays (replayable: disabled).
func (s Step) ReplayDisabled() bool {
	return s.Kind == KindWorkflow && strings.EqualFold(strings.TrimSpace(s.Replayable), ReplayDisabled)
}

// Idempotent reports whether a replay may resume at step s: all is the
// setting of the workflow (or block) around it. External steps (exec,
// http, custom operations) are not idempotent unless they, or all, say
// so; noop and log are; a fail step never is (resuming would only fail
// again); the dispatcher's own steps are.
func (s Step) IsIdempotent(all bool) bool {
	switch normalIdempotent(s.Idempotent) {
	case IdempotentYes:
		return true
	case IdempotentNo:
		return false
	}
	switch s.Kind {
	case KindExec, KindHTTP, KindCall:
		return all
	case KindFail:
		return false
	}
	return true
}

// IdempotentAll reports whether a workflow makes its external steps
// idempotent by default.
func (d Definition) IdempotentAll() bool { return normalIdempotent(d.Idempotent) == IdempotentAll }

// IdempotentAll reports whether a workflow block makes the external steps
// in it idempotent by default.
func (s Step) IdempotentAll() bool {
	return s.Kind == KindWorkflow && normalIdempotent(s.Idempotent) == IdempotentAll
}

// checkWorkflowReplay checks a workflow's idempotent and replayable fields.
func checkWorkflowReplay(add func(string, string, ...any), prefix, idempotent, replayable string) {
	if v := normalIdempotent(idempotent); v != IdempotentAll && v != IdempotentDefault {
		add(prefix+"idempotent", "%q: a workflow says all (its external steps are idempotent unless they say no) or nothing", idempotent)
	}
	if _, ok := parseWorkflowReplay(replayable); !ok {
		add(prefix+"replayable", "%q is not one of enabled, disabled, from start, automatically, automatically from start", replayable)
	}
}

// checkReplay checks a step's idempotent and replayable fields and a
// retry step's replay and next; list is the list a retry's next names a
// step of.
func (s Step) checkReplay(add func(string, string, ...any), f func(string) string, list []Step) {
	switch v := normalIdempotent(s.Idempotent); {
	case v == "?":
		add(f("idempotent"), "%q is not one of yes, no, default (or all, on a workflow block)", s.Idempotent)
	case v == IdempotentAll && s.Kind != KindWorkflow:
		add(f("idempotent"), "all applies to a workflow block (the steps in it); a step says yes, no or default")
	}
	if s.Replayable != "" && s.ReplayMark() == "" && !s.ReplayDisabled() {
		want := "from here, from here only, reset"
		if s.Kind == KindWorkflow {
			want += ", from start, disabled"
		}
		add(f("replayable"), "%q is not one of %s", s.Replayable, want)
	}
	if s.Kind == KindReplayable && s.Replayable == "" {
		add(f("replayable"), "is required for a replayable step: from here, from here only or reset")
	}
	if s.Next != "" && s.Next != "last" && s.Next != GotoEnd && !slices.ContainsFunc(list, func(x Step) bool { return x.ID == s.Next }) {
		add(f("next"), "%q is not last, end or the id of a step of the failed step's list", s.Next)
	}
	if s.Next != "" && !s.Replay && (s.Next == "last" || s.Next == GotoEnd) {
		add(f("next"), "%s applies to a replay: add replay: true", s.Next)
	}
}
