// Package expression evaluates the ${...} expressions of workflow
// definitions with the expr-lang/expr library. A template is any string
// holding ${...}; a string that is exactly one ${...} takes the value and
// type of its expression, others interpolate the results as text.
// Expressions see the roots input, vars, steps and workflow (and, where a
// step says so, a few more such as signal); ${secret.NAME} references a
// secret, which only the agent resolves (see [SecretRoot]). They are
// deterministic: the clock is not available (now() is disabled), so
// evaluating the same expression over the same recorded state always gives
// the same value.
package expression

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/builtin"
	"github.com/expr-lang/expr/conf"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/vm"

	"jetflow.dev/pkg/spelling"
)

// Roots are the names every expression may start from.
var Roots = []string{"input", "vars", "steps", "workflow"}

// Error is an expression that failed to compile or to run.
type Error struct {
	// Expr is the expression's text.
	Expr string
	Err  error
	// hint is what an unknown name was likely meant to be, or why it is
	// not there ("" when nothing stands out).
	hint string
	// at is where Expr begins in the string it came from (in letters),
	// if located.
	at      int
	located bool
}

// Offset is where in the string the expression came from (in letters,
// from 0) the problem is: the place the library names, else the
// expression's beginning; false when it is not known.
func (e *Error) Offset() (int, bool) {
	if !e.located {
		return 0, false
	}
	if _, from, ok := e.library(); ok && from >= 0 {
		return e.at + from, true
	}
	return e.at, true
}

// library is the library's own error (not one wrapping it, whose words
// would be lost), and where in Expr it is (in letters, from 0; -1 when
// it names no place in Expr).
func (e *Error) library() (fe *file.Error, from int, ok bool) {
	fe, ok = e.Err.(*file.Error) //nolint:errorlint // see above
	if !ok || fe.Snippet == "" {
		return nil, -1, false
	}
	if fe.From < 0 || fe.From > utf8.RuneCountInString(e.Expr) {
		return fe, -1, true
	}
	return fe, fe.From, true
}

// Error is the message on one line, as an API's answer, a log line and a
// failed step's event carry it: the expression (its line breaks and tabs
// spaces, so that a character counts in it as in the expression), the
// cause, the character of the expression where it is (not a column of
// the file it came from), and a hint for an unknown name. The library's
// diagram of the expression with a caret under the place is left out: on
// one line, its caret points at nothing.
func (e *Error) Error() string {
	msg := e.Err.Error()
	hint := e.hint
	if fe, from, ok := e.library(); ok {
		var null bool
		msg, null = plainWords(fe.Message)
		if member, ok := fetchFromNull(fe.Message); ok {
			hint = fmt.Sprintf("what it is fetched from is missing or null: %s gives null instead, and ?? a default", safeFetch(member))
		} else if null {
			hint = "a value it uses is missing or null: ?? gives a default"
		}
		if from >= 0 {
			msg += fmt.Sprintf(" at character %d", from+1)
		}
	}
	msg = strings.Join(strings.Fields(msg), " ")
	if hint != "" {
		msg += " (" + hint + ")"
	}
	return fmt.Sprintf("expression ${%s}: %s", oneLine(e.Expr), msg)
}

// fetchFromNull is the member the library's "cannot fetch X from <nil>"
// (X of a missing or null value: Go's words) names.
func fetchFromNull(msg string) (member string, ok bool) {
	rest, ok := strings.CutPrefix(msg, "cannot fetch ")
	if !ok {
		return "", false
	}
	member, ok = strings.CutSuffix(rest, " from <nil>")
	return member, ok && member != ""
}

// safeFetch is how to write the fetch of member that gives null from a
// missing or null value: ?.name for a name, ?.[...] for an index or a
// key that is no name.
func safeFetch(member string) string {
	if !isName(member) {
		return "?.[...]"
	}
	return "?." + member
}

// isName reports whether s can follow a dot: letters, '_' and digits,
// not first.
func isName(s string) bool {
	for i, r := range s {
		if r != '_' && !unicode.IsLetter(r) && (i == 0 || !unicode.IsDigit(r)) {
			return false
		}
	}
	return s != ""
}

// oneLine is s with each line break and tab a space: its letters stay
// where they were.
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r == '\t' {
			return ' '
		}
		return r
	}, s)
}

// disabledBuiltins are the library's functions an expression may not
// call, and why: each would make the same expression give another value
// when it is evaluated again.
var disabledBuiltins = map[string]string{
	"now":    "the clock is not available, so that an expression evaluated again gives the same value: use workflow.started_at, or pass the time in the input",
	"keys":   "keys() is off: its order would change from one evaluation to the next",
	"values": "values() is off: its order would change from one evaluation to the next",
}

// nameHint is the hint for code's compile error naming an unknown name:
// the function it is one slip of when it is called, else the root; or
// why a disabled function is.
func nameHint(code string, err error, roots []string) string {
	var fe *file.Error
	if !errors.As(err, &fe) {
		return ""
	}
	name, ok := strings.CutPrefix(fe.Message, "unknown name ")
	if !ok {
		return ""
	}
	name, _, _ = strings.Cut(name, " ")
	if why, ok := disabledBuiltins[name]; ok {
		return why
	}
	known := roots
	if called(code, fe.From, name) {
		known = slices.Concat(callableBuiltins(), slices.Sorted(maps.Keys(disabledBuiltins)))
	}
	meant := spelling.Meant(name, known)
	if meant == "" {
		return ""
	}
	if why, off := disabledBuiltins[meant]; off {
		return fmt.Sprintf("did you mean %q? %s", meant, why)
	}
	return fmt.Sprintf("did you mean %q?", meant)
}

// called reports whether the name at rune offset from of code is called
// (an opening parenthesis follows it).
func called(code string, from int, name string) bool {
	r := []rune(code)
	end := from + len([]rune(name))
	if from < 0 || end > len(r) || string(r[from:end]) != name {
		return false
	}
	return strings.HasPrefix(strings.TrimSpace(string(r[end:])), "(")
}

// callableBuiltins are the library's functions an expression may call.
var callableBuiltins = sync.OnceValue(func() []string {
	return slices.DeleteFunc(slices.Clone(builtin.Names), func(n string) bool {
		_, off := disabledBuiltins[n]
		return off || strings.HasPrefix(n, "$")
	})
})

func (e *Error) Unwrap() error { return e.Err }

// ErrUnclosed is a ${ without its closing }.
var ErrUnclosed = errors.New("expression: ${ without a closing }")

// Compile checks that every expression in v (a string, or maps and lists
// holding strings, as decoded from YAML or JSON) compiles with the given
// roots (Roots when nil). It returns the problems of the first string
// that has any (joined, one per expression: errors.Join). Secret references
// (${secret.NAME}, see [SecretRoot]) are accepted only when roots hold
// SecretRoot, and only alone in their ${...}.
//
// A problem inside maps or lists is a *PathError naming where it is.
func Compile(v any, roots []string) error {
	roots, secrets := withoutSecret(rootsOr(roots))
	return walkStrings(v, func(s string) error { return compileString(s, roots, secrets) })
}

// PathError is a problem Compile found in a member of the value it
// checked.
type PathError struct {
	// Path is where the member is in the value: .name of a map, [i] of a
	// list (.vars.total, [1], .headers["Content-Type"]).
	Path string
	Err  error
}

func (e *PathError) Error() string { return e.Err.Error() }
func (e *PathError) Unwrap() error { return e.Err }

// compileString checks the expressions of s, a string of a value.
func compileString(s string, roots []string, secrets bool) error {
	parts, err := split(s)
	if err != nil {
		return err
	}
	var errs []error // each expression's: a user fixes them all at once
	for _, p := range parts {
		if !p.expr {
			continue
		}
		if err := compilePart(p, roots, secrets); err != nil {
			var ee *Error
			if errors.As(err, &ee) && strings.HasPrefix(s[p.at:], ee.Expr) {
				ee.at, ee.located = utf8.RuneCountInString(s[:p.at]), true
			}
			errs = append(errs, err)
		}
	}
	if len(errs) == 1 {
		return errs[0] // as it is, not in a join of one
	}
	return errors.Join(errs...)
}

// compilePart checks p, an expression of a string.
func compilePart(p part, roots []string, secrets bool) error {
	if _, ok, err := secretRef(p.text); ok {
		if err != nil {
			return err
		}
		if !secrets {
			return &Error{Expr: p.text, Err: ErrSecretNotAllowed}
		}
		return nil
	}
	if _, err := program(p.text, roots); err != nil {
		why := ErrSecretNotAllowed
		if secrets {
			why = ErrSecretInExpression
		}
		return checkSecretUse(p.text, roots, err, why)
	}
	return nil
}

// CompileCondition checks a condition: an expression, with or without ${ }.
// A condition never sees secrets.
func CompileCondition(s string, roots []string) error {
	roots, _ = withoutSecret(rootsOr(roots))
	code := conditionCode(s)
	if _, ok, _ := secretRef(code); ok {
		return &Error{Expr: code, Err: ErrSecretNotAllowed}
	}
	p, err := program(code, roots)
	if err != nil {
		return checkSecretUse(code, roots, err, ErrSecretNotAllowed)
	}
	// A type known before it runs (a literal's, a comparison's) that is
	// no boolean fails every evaluation: say so now.
	if k := typeKind(p.Node().Type()); k != "" && k != "boolean" {
		return &Error{Expr: code, Err: fmt.Errorf("gives %s, a condition must give true or false", article(k))}
	}
	return nil
}

// CompileList checks a value that must give a list (a foreach's items)
// as Compile does, and refuses one that gives no list whatever it is
// run with: a value neither a list nor a string, a string that is not
// one ${...} (it renders to text), or one ${...} whose type, known
// before it runs, is not a list (${"a"}, ${len(input.hosts)}). A list
// whose type is known only when it runs is accepted. nil is left to the
// caller (a required value).
func CompileList(v any, roots []string) error {
	if err := Compile(v, roots); err != nil {
		return err
	}
	if v == nil {
		return nil
	}
	s, isString := v.(string)
	if !isString {
		// Any list but bytes (YAML's !!binary), which JSON holds as text.
		if t := reflect.TypeOf(v); (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && t.Elem().Kind() != reflect.Uint8 {
			return nil
		}
		return fmt.Errorf("%s is not a list: give a list, or an expression that gives one (${input.hosts})", describe(normalize(v)))
	}
	parts, err := split(s)
	if err != nil {
		return err
	}
	if len(parts) != 1 || !parts[0].expr {
		return fmt.Errorf("%s gives text, not a list: give a list, or one ${...} alone that gives one (${input.hosts})", describe(v))
	}
	roots, _ = withoutSecret(rootsOr(roots))
	p, err := program(parts[0].text, roots)
	if err != nil {
		return nil // a secret's reference, refused or not by Compile
	}
	if k := typeKind(p.Node().Type()); k != "" && k != "list" {
		return &Error{Expr: parts[0].text, Err: fmt.Errorf("gives %s, not a list", article(k))}
	}
	return nil
}

// typeKind is the kind of the values of a type the checker knows, if it
// is one an expression gives; "" for a type known only when it runs.
func typeKind(t reflect.Type) string {
	if t == nil {
		return ""
	}
	switch t.Kind() {
	case reflect.Bool:
		return "boolean"
	case reflect.String:
		return "string"
	case reflect.Int, reflect.Int64, reflect.Float64:
		return "number"
	case reflect.Map:
		return "object"
	case reflect.Slice:
		return "list"
	}
	return ""
}

// Render returns a copy of v with every template evaluated in env. Maps
// and lists are rendered recursively; other values are returned as they are.
func Render(v any, env map[string]any) (any, error) {
	switch t := v.(type) {
	case string:
		return renderString(t, env)
	case map[string]any:
		out := make(map[string]any, len(t))
		for _, k := range slices.Sorted(maps.Keys(t)) { // the first error is the same every time
			r, err := Render(t[k], env)
			if err != nil {
				return nil, err
			}
			out[k] = r
		}
		return out, nil
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			r, err := Render(e, env)
			if err != nil {
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	}
	return v, nil
}

// RenderString renders a template that must give a string.
func RenderString(s string, env map[string]any) (string, error) {
	v, err := renderString(s, env)
	if err != nil {
		return "", err
	}
	if str, ok := v.(string); ok {
		return str, nil
	}
	return text(v), nil
}

// Condition evaluates a condition to a boolean; anything but a boolean is
// an error.
func Condition(s string, env map[string]any) (bool, error) {
	code := conditionCode(s)
	p, err := program(code, keys(env))
	if err != nil {
		return false, err
	}
	out, err := expr.Run(p, envValue(env))
	if err != nil {
		return false, &Error{Expr: code, Err: err}
	}
	b, ok := out.(bool)
	switch {
	case ok:
		return b, nil
	case out == nil:
		return false, &Error{Expr: code, Err: errors.New("gives null, a condition must give true or false"),
			hint: "a value it uses is missing or null: ?? false gives a default"}
	case out == "true" || out == "false":
		return false, &Error{Expr: code, Err: fmt.Errorf("gives %s, a condition must give true or false", describe(out)),
			hint: fmt.Sprintf("a string is not a boolean: compare it, == %q", out)}
	}
	return false, &Error{Expr: code, Err: fmt.Errorf("gives %s, a condition must give true or false", describe(out))}
}

// HasTemplate reports whether any string in v holds an expression.
func HasTemplate(v any) bool {
	found := false
	_ = walkStrings(v, func(s string) error {
		if IsTemplate(s) {
			found = true
		}
		return nil
	})
	return found
}

// IsTemplate reports whether s holds an expression.
func IsTemplate(s string) bool { return strings.Contains(s, "${") }

func conditionCode(s string) string {
	t := strings.TrimSpace(s)
	if parts, err := split(t); err == nil && len(parts) == 1 && parts[0].expr {
		return parts[0].text
	}
	return t
}

func renderString(s string, env map[string]any) (any, error) {
	parts, err := split(s)
	if err != nil {
		return nil, err
	}
	if len(parts) == 1 && parts[0].expr { // the whole string is one expression: keep its type
		v, err := eval(parts[0].text, env)
		if err == nil && notJSON(v) {
			return nil, &Error{Expr: parts[0].text, Err: errors.New("gives an infinite number or NaN, which JSON cannot hold"),
				hint: "a division by zero? check the divisor first"}
		}
		return v, err
	}
	var b strings.Builder
	for _, p := range parts {
		if !p.expr {
			b.WriteString(p.text)
			continue
		}
		v, err := eval(p.text, env)
		if err != nil {
			return nil, err
		}
		b.WriteString(text(v))
	}
	return b.String(), nil
}

func eval(code string, env map[string]any) (any, error) {
	p, err := program(code, keys(env))
	if err != nil {
		return nil, err
	}
	out, err := expr.Run(p, envValue(env))
	if err != nil {
		return nil, &Error{Expr: code, Err: err}
	}
	return normalize(out), nil
}

// notJSON reports whether v, an expression's value (normalized), holds
// a number JSON cannot hold: an infinity (a division by zero) or NaN.
// As a value (not written in a text, where it reads +Inf) it failed
// later, as "json: unsupported value: +Inf" with no expression named.
func notJSON(v any) bool {
	switch t := v.(type) {
	case nil, string, bool:
		return false
	case float64:
		return math.IsInf(t, 0) || math.IsNaN(t)
	case []any:
		return slices.ContainsFunc(t, notJSON)
	case map[string]any:
		for _, e := range t {
			if notJSON(e) {
				return true
			}
		}
		return false
	}
	// A shape normalize could not make JSON's (toPairs' pairs holding
	// an infinity): ask the encoder.
	_, err := json.Marshal(v)
	var unsupported *json.UnsupportedValueError
	return errors.As(err, &unsupported)
}

// text renders a value inside a string: strings as they are, null as
// nothing, everything else as JSON.
func text(v any) string {
	switch t := v.(type) {
	case nil:
		return ""
	case string:
		return t
	}
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

// normalize makes results JSON-shaped (ints as float64 are kept as
// numbers; typed slices and maps become []any and map[string]any).
func normalize(v any) any {
	switch v.(type) {
	case nil, string, bool, float64, map[string]any, []any:
		return v
	}
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	if json.Unmarshal(b, &out) != nil {
		return v
	}
	return out
}

func describe(v any) string {
	if v == nil {
		return "null"
	}
	if s, ok := v.(string); ok {
		return fmt.Sprintf("%s %q", kindOf(v), s)
	}
	return fmt.Sprintf("%s %s", kindOf(v), text(v))
}

func kindOf(v any) string { return "the " + kindOfValue(v) }

// part is a literal or an expression of a template.
type part struct {
	text string
	expr bool
	at   int // an expression's: where text begins in the string, in bytes
}

// split cuts a template into literals and ${...} expressions. It tracks
// nested braces and string literals inside an expression so that map
// literals and strings holding } work; $${ is a literal ${.
func split(s string) ([]part, error) {
	var parts []part
	var lit strings.Builder
	for i := 0; i < len(s); {
		if strings.HasPrefix(s[i:], "$${") {
			lit.WriteString("${")
			i += 3
			continue
		}
		if !strings.HasPrefix(s[i:], "${") {
			lit.WriteByte(s[i])
			i++
			continue
		}
		end, err := closing(s, i+2)
		if err != nil {
			return nil, err
		}
		if lit.Len() > 0 {
			parts = append(parts, part{text: lit.String()})
			lit.Reset()
		}
		inner := s[i+2 : end]
		at := i + 2 + len(inner) - len(strings.TrimLeftFunc(inner, unicode.IsSpace))
		parts = append(parts, part{text: strings.TrimSpace(inner), expr: true, at: at})
		i = end + 1
	}
	if lit.Len() > 0 || len(parts) == 0 {
		parts = append(parts, part{text: lit.String()})
	}
	return parts, nil
}

// closing returns the index of the } closing an expression that starts at i.
func closing(s string, i int) (int, error) {
	depth := 0
	for ; i < len(s); i++ {
		switch c := s[i]; c {
		case '"', '\'', '`':
			j := i + 1
			for ; j < len(s) && s[j] != c; j++ {
				if s[j] == '\\' && c != '`' {
					j++
				}
			}
			if j >= len(s) {
				return 0, ErrUnclosed
			}
			i = j
		case '{':
			depth++
		case '}':
			if depth == 0 {
				return i, nil
			}
			depth--
		}
	}
	return 0, ErrUnclosed
}

// walkStrings calls fn for every string in v, and stops at the first
// error: for a string inside maps or lists a *PathError naming where the
// string is (the path is written only for an error).
func walkStrings(v any, fn func(string) error) error {
	switch t := v.(type) {
	case string:
		return fn(t)
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(t)) {
			if err := walkStrings(t[k], fn); err != nil {
				return under(Member(k), err)
			}
		}
	case []any:
		for i, e := range t {
			if err := walkStrings(e, fn); err != nil {
				return under("["+strconv.Itoa(i)+"]", err)
			}
		}
	}
	return nil
}

// under is err, of the member at path of a value: its PathError, with
// path before the path it has.
func under(path string, err error) error {
	var pe *PathError
	if errors.As(err, &pe) {
		pe.Path = path + pe.Path
		return pe
	}
	return &PathError{Path: path, Err: err}
}

// Member is the path of a map's member k, as PathError.Path writes it:
// .k for a name, else ["k"].
func Member(k string) string {
	if isName(k) {
		return "." + k
	}
	return "[" + strconv.Quote(k) + "]"
}

func rootsOr(r []string) []string {
	if r == nil {
		return Roots
	}
	return r
}

func keys(env map[string]any) []string {
	return slices.Sorted(maps.Keys(env))
}

var (
	cacheMu sync.Mutex
	cache   = map[string]*vm.Program{}
	types   = map[string]reflect.Type{}
)

// envType is a struct type with one field of type any per root, named by
// an expr tag. Every root is declared (an unknown name is an error at
// compile time) without a type: a root may hold any JSON value, checked
// when the expression runs.
func envType(roots []string) reflect.Type {
	key := strings.Join(roots, ",")
	cacheMu.Lock()
	defer cacheMu.Unlock()
	if t, ok := types[key]; ok {
		return t
	}
	fields := make([]reflect.StructField, len(roots))
	for i, r := range roots {
		fields[i] = reflect.StructField{Name: fmt.Sprintf("R%d", i), Type: reflect.TypeFor[any](), Tag: reflect.StructTag(`expr:"` + r + `"`)}
	}
	t := reflect.StructOf(fields)
	types[key] = t
	return t
}

// envValue turns an environment map into a value of its envType.
func envValue(env map[string]any) any {
	roots := keys(env)
	v := reflect.New(envType(roots)).Elem()
	for i, r := range roots {
		if x := env[r]; x != nil {
			v.Field(i).Set(reflect.ValueOf(x))
		}
	}
	return v.Interface()
}

// program compiles code for an environment with the given roots (each of
// them any), caching the result: the same definitions are evaluated over
// and over.
func program(code string, roots []string) (*vm.Program, error) {
	key := strings.Join(roots, ",") + "\x00" + code
	cacheMu.Lock()
	p, ok := cache[key]
	cacheMu.Unlock()
	if ok {
		return p, nil
	}
	if strings.TrimSpace(code) == "" {
		return nil, &Error{Expr: code, Err: errors.New("is empty")}
	}
	env := reflect.New(envType(roots)).Elem().Interface()
	// now, keys and values are off: the clock, and Go's random map order,
	// would make the same expression give other values on re-evaluation.
	p, err := expr.Compile(code, expr.Env(env), expr.DisableBuiltin("now"), expr.DisableBuiltin("keys"),
		expr.DisableBuiltin("values"), expr.MaxNodes(2000),
		// % on anything but two ints: numbers from JSON are float64. The
		// ints' overload keeps an int's type checked as it was. The
		// function's name is no name a user writes (a let may be "mod").
		expr.Function(modFunction, mod, new(func(int, int) int), new(func(any, any) any)), expr.Operator("%", modFunction),
		conversions)
	if err != nil {
		return nil, &Error{Expr: code, Err: err, hint: nameHint(code, err, roots)}
	}
	cacheMu.Lock()
	if len(cache) > 10000 {
		clear(cache)
	}
	cache[key] = p
	cacheMu.Unlock()
	return p, nil
}

// conversions are the library's int() and float(), checked as the
// library checks them and giving the same values, but for their errors:
// the library's name a string it cannot read by its text ("int(bool)"
// for the string "bool"), which reads as a Go type, and Go's types for
// the other values.
func conversions(c *conf.Config) {
	for _, b := range builtin.Builtins {
		if b.Name != "int" && b.Name != "float" {
			continue
		}
		fn, lib, check := *b, b.Fast, b.Validate
		fn.Fast = nil
		fn.Func = func(params ...any) (any, error) { return convert(fn.Name, lib, params[0]) }
		fn.Validate = func(args []reflect.Type) (reflect.Type, error) {
			t, err := check(args)
			if err != nil && len(args) == 1 { // as when it runs
				if k := typeKind(args[0]); k != "" || args[0] == nil {
					k = cmp.Or(k, "null")
					return t, fmt.Errorf("%s() takes a number or a string, not %s", fn.Name, article(k))
				}
			}
			return t, err
		}
		c.Functions[fn.Name] = &fn
	}
}

// convert is int(x) or float(x) (name), whose library function is lib.
func convert(name string, lib func(any) any, x any) (any, error) {
	switch v := x.(type) {
	case string:
		var err error
		what := "number"
		if name == "int" {
			_, err = strconv.Atoi(v)
			what = "whole number"
		} else {
			_, err = strconv.ParseFloat(v, 64)
		}
		if err != nil {
			return nil, fmt.Errorf("%s() cannot read the string %q as a %s", name, v, what)
		}
	case int, int64, float64:
	default:
		if rv := reflect.ValueOf(x); !rv.IsValid() || !rv.CanConvert(reflect.TypeFor[float64]()) || rv.Kind() == reflect.String {
			return nil, fmt.Errorf("%s() takes a number or a string, not %s", name, article(kindOfValue(x)))
		}
	}
	return lib(x), nil
}

// modFunction names mod in expressions: the % operator calls it.
const modFunction = "_jetflow_mod"

// mod is the % operator: the remainder of two whole numbers. expr's own
// % takes Go ints only, and numbers from JSON (an input, an output, a
// foreach's items) are float64 even when whole: ${item % 2} was
// accepted with the definition and failed at run time. A number that is
// not whole (or beyond ±2^63), or not a number, is an error that says
// so.
func mod(params ...any) (any, error) {
	a, aok := wholeNumber(params[0])
	b, bok := wholeNumber(params[1])
	switch {
	case !aok || !bok:
		return nil, fmt.Errorf("%% takes whole numbers (within ±2^63), not %s and %s", describe(params[0]), describe(params[1]))
	case b == 0:
		return nil, errors.New("% by zero")
	case b == -1:
		return 0, nil // and no overflow of math.MinInt64 % -1
	}
	// An int, as expr's checker takes the ints' overload's result to be
	// whenever an operand's type is known only when it runs (int is 64
	// bits wherever jetflow builds).
	return int(a % b), nil
}

// wholeNumber returns v as an int64 when it is a whole number: an int
// (expr's integers) or an int64, or a float64 (JSON's numbers, expr's
// other numbers) without a fraction below 2^63 in magnitude (every
// float64 of 2^53 or more is whole, and exact as an int64 below 2^63).
func wholeNumber(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int64:
		return n, true
	case float64:
		if n == math.Trunc(n) && math.Abs(n) < 1<<63 {
			return int64(n), true
		}
	}
	return 0, false
}
