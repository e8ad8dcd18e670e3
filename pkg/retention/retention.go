// Package retention parses and evaluates retention rules: how long, or how
// many of, the finished executions of a workflow are kept before the
// janitor deletes their history and read model.
//
// A rule is written as in Apache Brooklyn's workflow retention:
//
//	5                      keep the 5 most recent finished executions of the group
//	24h, 7d, 1d12h         keep those that finished less than this ago
//	forever                never expire
//	disabled               expire as soon as the execution finishes
//	context                the rule in force before (at a workflow's top: parent)
//	parent                 the parent's rule, or the system default
//	system                 the system default (the janitor's configuration)
//	min(a, b, ...)         keep only while every argument would keep
//	max(a, b, ...)         keep while any argument would keep
//	<rule> hash <key>      count the execution in group <key> (default: its workflow's name)
//	hash <key>             change the group, keep the rule (context)
//
// Arguments of min and max are any rule but disabled; the key of hash is
// the rest of the text and may hold ${...} expressions, which the caller
// renders. Parsing and evaluation are pure: no clock, no I/O.
package retention

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrInvalid is wrapped by every parse error.
var ErrInvalid = errors.New("retention: invalid rule")

// Op is the kind of a rule node.
type Op int

// Rule node kinds.
const (
	// OpCount keeps the Count most recent finished executions of the group.
	OpCount Op = iota + 1
	// OpDuration keeps executions that finished less than Duration ago.
	OpDuration
	// OpForever keeps every execution.
	OpForever
	// OpDisabled keeps none once finished.
	OpDisabled
	// OpContext is the rule in force before this one.
	OpContext
	// OpParent is the parent workflow's rule, or the system default.
	OpParent
	// OpSystem is the system default.
	OpSystem
	// OpMin keeps while all Args keep.
	OpMin
	// OpMax keeps while any of Args keeps.
	OpMax
)

// Limits of what a rule may hold.
const (
	// MaxText is the longest rule text accepted, in bytes.
	MaxText = 1024
	// MaxCount is the largest count accepted.
	MaxCount = 1_000_000_000
	// MaxDepth bounds how deep min and max nest.
	MaxDepth = 8
	// MaxKey is the longest group key (after rendering), in bytes.
	MaxKey = 256
)

// Rule is a parsed retention rule. The zero Rule is invalid; [Default]
// is what applies where nothing is set.
type Rule struct {
	Op       Op
	Count    int
	Duration time.Duration
	// Args are the arguments of min and max.
	Args []Rule
}

// Default is the rule of a workflow that sets none: its parent's, or the
// system default.
var Default = Rule{Op: OpParent}

// Spec is what a retention: field says: a rule, and optionally a group key.
type Spec struct {
	// Rule is the rule; context when the text gave only a hash.
	Rule Rule
	// Hash is the group key as written (it may hold ${...}); "" when the
	// text has no hash, so the group stays what it was.
	Hash string
}

var hashRe = regexp.MustCompile(`(^|\s)hash(\s|$)`)

// Parse parses the text of a retention: field.
func Parse(text string) (Spec, error) {
	text = strings.TrimSpace(text)
	switch {
	case text == "":
		return Spec{}, fmt.Errorf("%w: empty; give a count (5), a duration (24h, 7d), forever, context, parent, system, disabled, min(...), max(...), optionally followed by hash <key>", ErrInvalid)
	case len(text) > MaxText:
		return Spec{}, fmt.Errorf("%w: %d bytes, at most %d", ErrInvalid, len(text), MaxText)
	}
	var spec Spec
	ruleText := text
	if loc := hashRe.FindStringIndex(text); loc != nil {
		ruleText = strings.TrimSpace(text[:loc[0]])
		spec.Hash = strings.TrimSpace(text[loc[1]:])
		if spec.Hash == "" {
			return Spec{}, fmt.Errorf("%w: hash needs a key, e.g. hash start-stop or hash ${workflow.name} failed", ErrInvalid)
		}
		if len(spec.Hash) > MaxKey {
			return Spec{}, fmt.Errorf("%w: the hash key is %d bytes, at most %d", ErrInvalid, len(spec.Hash), MaxKey)
		}
	}
	if ruleText == "" {
		spec.Rule = Rule{Op: OpContext}
		return spec, nil
	}
	r, err := parseRule(ruleText)
	if err != nil {
		return Spec{}, err
	}
	spec.Rule = r
	return spec, nil
}

// ParseRule parses a rule without a hash (a system default, for example).
func ParseRule(text string) (Rule, error) {
	text = strings.TrimSpace(text)
	if len(text) > MaxText {
		return Rule{}, fmt.Errorf("%w: %d bytes, at most %d", ErrInvalid, len(text), MaxText)
	}
	if hashRe.MatchString(text) {
		return Rule{}, fmt.Errorf("%w: %q: hash is not allowed here", ErrInvalid, text)
	}
	if text == "" {
		return Rule{}, fmt.Errorf("%w: empty", ErrInvalid)
	}
	return parseRule(text)
}

// ParseDefault parses a system default: a rule that refers to no other
// (no context, parent or system) and has no hash.
func ParseDefault(text string) (Rule, error) {
	r, err := ParseRule(text)
	if err != nil {
		return Rule{}, err
	}
	if r.refers() {
		return Rule{}, fmt.Errorf("%w: %q: the system default cannot refer to context, parent or system", ErrInvalid, text)
	}
	return r, nil
}

func parseRule(text string) (Rule, error) {
	p := &parser{toks: tokenize(text)}
	r, err := p.rule(0)
	if err != nil {
		return Rule{}, err
	}
	if p.i < len(p.toks) {
		return Rule{}, fmt.Errorf("%w: unexpected %q after %s (combine values with min(...) or max(...))", ErrInvalid, p.toks[p.i], r)
	}
	return r, nil
}

func tokenize(text string) []string {
	var toks []string
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '(' || c == ')' || c == ',':
			toks = append(toks, string(c))
			i++
		default:
			j := i
			for j < len(text) && strings.IndexByte(" \t\n\r(),", text[j]) < 0 {
				j++
			}
			toks = append(toks, text[i:j])
			i = j
		}
	}
	return toks
}

type parser struct {
	toks []string
	i    int
}

func (p *parser) next() (string, bool) {
	if p.i >= len(p.toks) {
		return "", false
	}
	t := p.toks[p.i]
	p.i++
	return t, true
}

const valuesHint = "a count (5), a duration (24h, 7d), forever, context, parent, system, disabled, min(...) or max(...)"

func (p *parser) rule(depth int) (Rule, error) {
	t, ok := p.next()
	if !ok {
		return Rule{}, fmt.Errorf("%w: a value is missing; use %s", ErrInvalid, valuesHint)
	}
	switch t {
	case "forever":
		return Rule{Op: OpForever}, nil
	case "context":
		return Rule{Op: OpContext}, nil
	case "parent":
		return Rule{Op: OpParent}, nil
	case "system":
		return Rule{Op: OpSystem}, nil
	case "disabled":
		if depth > 0 {
			return Rule{}, fmt.Errorf("%w: disabled cannot be an argument of min or max", ErrInvalid)
		}
		return Rule{Op: OpDisabled}, nil
	case "min", "max":
		op := OpMin
		if t == "max" {
			op = OpMax
		}
		if depth >= MaxDepth {
			return Rule{}, fmt.Errorf("%w: min and max nest at most %d deep", ErrInvalid, MaxDepth)
		}
		if open, _ := p.next(); open != "(" {
			return Rule{}, fmt.Errorf("%w: %s needs its arguments in parentheses, e.g. %s(5, 24h)", ErrInvalid, t, t)
		}
		r := Rule{Op: op}
		for {
			arg, err := p.rule(depth + 1)
			if err != nil {
				return Rule{}, err
			}
			r.Args = append(r.Args, arg)
			sep, ok := p.next()
			switch {
			case !ok:
				return Rule{}, fmt.Errorf("%w: %s( is missing its closing parenthesis", ErrInvalid, t)
			case sep == ")":
				return r, nil
			case sep != ",":
				return Rule{}, fmt.Errorf("%w: unexpected %q in %s(...): separate arguments with commas", ErrInvalid, sep, t)
			}
		}
	case "(", ")", ",":
		return Rule{}, fmt.Errorf("%w: unexpected %q; use %s", ErrInvalid, t, valuesHint)
	}
	if isDigits(t) {
		n, err := strconv.Atoi(t)
		if err != nil || n > MaxCount {
			return Rule{}, fmt.Errorf("%w: count %s is larger than %d", ErrInvalid, t, MaxCount)
		}
		return Rule{Op: OpCount, Count: n}, nil
	}
	if strings.HasPrefix(t, "-") {
		return Rule{}, fmt.Errorf("%w: %q is negative; counts and durations must be positive", ErrInvalid, t)
	}
	if d, err := parseDuration(t); err == nil {
		if d <= 0 {
			return Rule{}, fmt.Errorf("%w: duration %s must be positive (to keep nothing, use 0 or disabled)", ErrInvalid, t)
		}
		return Rule{Op: OpDuration, Duration: d}, nil
	}
	return Rule{}, fmt.Errorf("%w: unknown value %q; use %s, optionally followed by hash <key>", ErrInvalid, t, valuesHint)
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

var daysRe = regexp.MustCompile(`^([0-9]+)d(.*)$`)

// parseDuration accepts Go durations (90s, 1h30m) with days in front (7d, 1d12h).
func parseDuration(s string) (time.Duration, error) {
	var days time.Duration
	if m := daysRe.FindStringSubmatch(s); m != nil {
		n, err := strconv.Atoi(m[1])
		if err != nil || n > 100_000 {
			return 0, fmt.Errorf("%q: too many days", s)
		}
		days, s = time.Duration(n)*24*time.Hour, m[2]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, err
	}
	return days + d, nil
}

// String writes r in the syntax Parse reads; parsing it gives r again.
func (r Rule) String() string {
	switch r.Op {
	case OpCount:
		return strconv.Itoa(r.Count)
	case OpDuration:
		return formatDuration(r.Duration)
	case OpForever:
		return "forever"
	case OpDisabled:
		return "disabled"
	case OpContext:
		return "context"
	case OpParent:
		return "parent"
	case OpSystem:
		return "system"
	case OpMin, OpMax:
		args := make([]string, len(r.Args))
		for i, a := range r.Args {
			args[i] = a.String()
		}
		name := "min"
		if r.Op == OpMax {
			name = "max"
		}
		return name + "(" + strings.Join(args, ", ") + ")"
	}
	return "invalid"
}

// formatDuration writes whole days as days (7d) from two days on, and
// anything else in hours and smaller units (24h, 36h, 1h30m).
func formatDuration(d time.Duration) string {
	const day = 24 * time.Hour
	if d >= 2*day && d%day == 0 {
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	var b strings.Builder
	for _, u := range []struct {
		name string
		size time.Duration
	}{{"h", time.Hour}, {"m", time.Minute}, {"s", time.Second}, {"ms", time.Millisecond}, {"us", time.Microsecond}, {"ns", 1}} {
		if n := d / u.size; n > 0 {
			b.WriteString(strconv.FormatInt(int64(n), 10) + u.name)
			d -= n * u.size
		}
	}
	if b.Len() == 0 {
		return "0s"
	}
	return b.String()
}

// refers reports whether r mentions context, parent or system.
func (r Rule) refers() bool {
	switch r.Op {
	case OpContext, OpParent, OpSystem:
		return true
	case OpMin, OpMax:
		return slices.ContainsFunc(r.Args, Rule.refers)
	}
	return false
}

// replace returns r with every node for which with returns true replaced.
func (r Rule) replace(with func(Rule) (Rule, bool)) Rule {
	if n, ok := with(r); ok {
		return n
	}
	if r.Op != OpMin && r.Op != OpMax {
		return r
	}
	out := Rule{Op: r.Op, Args: make([]Rule, len(r.Args))}
	for i, a := range r.Args {
		out.Args[i] = a.replace(with)
	}
	return out.simplify()
}

// InContext returns r with context replaced by prev, the rule in force
// before r (at a workflow's top, [Default]). The result is simplified, so
// applying max(context, 1h) again and again does not grow it.
func (r Rule) InContext(prev Rule) Rule {
	return r.replace(func(n Rule) (Rule, bool) { return prev, n.Op == OpContext })
}

// WithParent returns r with parent replaced by p: the rule of the parent
// execution of a child execution.
func (r Rule) WithParent(p Rule) Rule {
	return r.replace(func(n Rule) (Rule, bool) { return p, n.Op == OpParent })
}

// Resolve returns r with parent, system and any context left replaced by
// the system default. A child execution's parent was replaced by its
// parent's rule when it started (WithParent); any other execution has no
// parent execution (nested workflows are steps of the same execution), so
// parent is the system default too.
func (r Rule) Resolve(system Rule) Rule {
	return r.replace(func(n Rule) (Rule, bool) {
		return system, n.Op == OpParent || n.Op == OpSystem || n.Op == OpContext
	})
}

// simplify flattens min(min(a, b), c) into min(a, b, c), drops repeated
// arguments and unwraps a min or max of one argument.
func (r Rule) simplify() Rule {
	if r.Op != OpMin && r.Op != OpMax {
		return r
	}
	var args []Rule
	seen := map[string]bool{}
	for _, a := range r.Args {
		flat := []Rule{a}
		if a.Op == r.Op {
			flat = a.Args
		}
		for _, f := range flat {
			if k := f.String(); !seen[k] {
				seen[k] = true
				args = append(args, f)
			}
		}
	}
	if len(args) == 1 {
		return args[0]
	}
	return Rule{Op: r.Op, Args: args}
}

// Keep reports whether a finished execution is kept under r: rank is its
// place among the finished executions of its group, most recent first (0
// for the most recent), and age how long ago it finished. A reference
// left unresolved (see [Rule.Resolve]) keeps, so that nothing is deleted
// on a rule that was not understood.
func (r Rule) Keep(rank int, age time.Duration) bool {
	switch r.Op {
	case OpCount:
		return rank < r.Count
	case OpDuration:
		return age < r.Duration
	case OpDisabled:
		return false
	case OpMin:
		for _, a := range r.Args {
			if !a.Keep(rank, age) {
				return false
			}
		}
		return len(r.Args) > 0
	case OpMax:
		for _, a := range r.Args {
			if a.Keep(rank, age) {
				return true
			}
		}
		return len(r.Args) == 0
	}
	return true // forever, and references left unresolved
}
