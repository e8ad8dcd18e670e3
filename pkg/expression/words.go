package expression

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
)

// kinds are the Go type names the library's runtime messages give for
// an expression's values (its %T), and the words a workflow's author
// knows them by: the JSON values the expressions see.
var kinds = map[string]string{
	"<nil>":                   "null",
	"bool":                    "boolean",
	"string":                  "string",
	"int":                     "number",
	"int64":                   "number",
	"float64":                 "number",
	"map[string]interface {}": "object",
	"[]interface {}":          "list",
}

// operators are those the library names in "invalid operation: A op B".
var operators = []string{"<=", ">=", "<", ">", "+", "-", "*", "/", "%"}

// plainWords is the library's runtime message msg in the words of the
// values an expression sees (null, number, string, boolean, object,
// list), in place of Go's (<nil>, float64, map[string]interface {}, an
// interface conversion, a reflect.Value), and whether one of the values
// it names is null. A message it does not know, or whose types are not
// those of an expression's values, is returned as it is.
func plainWords(msg string) (plain string, null bool) {
	if rest, ok := strings.CutPrefix(msg, "invalid operation: "); ok {
		return plainOperation(msg, rest)
	}
	if rest, ok := strings.CutPrefix(msg, "invalid argument for "); ok {
		rest = strings.ReplaceAll(rest, "%!s(<nil>)", "<nil>") // join's %s of a nil
		if fn, t, ok := strings.Cut(rest, " (type "); ok {
			if k, ok := kinds[strings.TrimSuffix(t, ")")]; ok && strings.HasSuffix(t, ")") {
				return fmt.Sprintf("invalid argument for %s: %s", fn, article(k)), k == "null"
			}
		}
		return msg, false
	}
	if rest, ok := strings.CutPrefix(msg, "cannot use "); ok {
		// "cannot use A as argument (type B) to call F", or without
		// " to call F" from a builtin's own check.
		got, rest, ok := strings.Cut(rest, " as argument (type ")
		want, fn, _ := strings.Cut(rest, ")")
		kg, okG := kinds[got]
		kw, okW := kinds[want]
		if !ok || !okG || !okW {
			return msg, false
		}
		wanted := article(kw)
		if want == "int" && kg == "number" { // a JSON number is a float64, even when whole
			wanted = "a whole number: int(x) makes one"
		}
		if fn, ok := strings.CutPrefix(strings.TrimSpace(fn), "to call "); ok {
			if kg == kw {
				return fmt.Sprintf("%s() takes %s", fn, wanted), false
			}
			return fmt.Sprintf("%s() takes %s, not %s", fn, wanted, article(kg)), kg == "null"
		}
		if kg == kw {
			return "expected " + wanted, false
		}
		return fmt.Sprintf("got %s where %s was expected", article(kg), wanted), kg == "null"
	}
	if rest, ok := strings.CutPrefix(msg, "interface conversion: interface {} is "); ok {
		got, want, _ := strings.Cut(rest, ", not ")
		kg, okG := kinds[got]
		if got == "nil" { // Go's words for a nil interface here
			kg, okG = "null", true
		}
		kw, okW := kinds[want]
		if okG && okW {
			return fmt.Sprintf("got %s where %s was expected", article(kg), article(kw)), kg == "null"
		}
		return msg, false
	}
	if rest, ok := strings.CutPrefix(msg, "reflect.Value.MapIndex: value of type "); ok {
		// A key of an object that is no string ("x in obj", obj[1]).
		if t, ok := strings.CutSuffix(rest, " is not assignable to type string"); ok {
			if k, ok := kinds[t]; ok {
				return fmt.Sprintf("an object's keys are strings, not %s", article(k)), k == "null"
			}
		}
		return msg, false
	}
	if rest, ok := strings.CutPrefix(msg, "reflect: call of reflect.Value."); ok {
		// A builtin given what it cannot go through: "Len on float64
		// Value", "Index on map Value", "Type on zero Value" (null).
		method, kind, _ := strings.Cut(strings.TrimSuffix(rest, " Value"), " on ")
		k, ok := reflectKinds[kind]
		if !ok || !strings.HasSuffix(rest, " Value") {
			return msg, false
		}
		if method == "Len" || method == "Index" {
			return fmt.Sprintf("got %s where a list was expected", article(k)), k == "null"
		}
		return fmt.Sprintf("got %s where another value was expected", article(k)), k == "null"
	}
	// A builtin's "cannot reverse invalid" (null), "cannot flatten
	// float64", "cannot take from map" (a reflect kind when it runs, a
	// type when checked).
	for _, verb := range []string{"reverse", "uniq", "concat", "flatten", "take from"} {
		if t, ok := strings.CutPrefix(msg, "cannot "+verb+" "); ok {
			if k, ok := kindNamed(t); ok {
				return fmt.Sprintf("cannot %s %s", verb, article(k)), k == "null"
			}
			return msg, false
		}
	}
	if t, ok := strings.CutPrefix(msg, "cannot take "); ok && strings.HasSuffix(t, " elements") {
		if k, ok := kindNamed(strings.TrimSuffix(t, " elements")); ok && k == "number" {
			return "take() takes a whole number of elements: int(x) makes one", false
		}
		return msg, false
	}
	if strings.Contains(msg, "() takes ") && strings.HasSuffix(msg, ", not null") { // this package's conversions
		return msg, true
	}
	if rest, ok := strings.CutPrefix(msg, `operator "in" not defined on `); ok {
		if k, ok := kinds[rest]; ok {
			return `operator "in" not defined on ` + article(k), k == "null"
		}
		return msg, false
	}
	if rest, ok := strings.CutPrefix(msg, "json: cannot unmarshal number "); ok {
		n, _, _ := strings.Cut(rest, " into ")
		return "fromJSON() was given a number too large to hold: " + n, false
	}
	if strings.HasPrefix(msg, "invalid character ") || msg == "unexpected end of JSON input" {
		// fromJSON's, the one place an expression decodes JSON: the
		// decoder's words say what, not where.
		return "fromJSON() was given no JSON: " + msg, false
	}
	if rest, ok := strings.CutPrefix(msg, "index out of range: "); ok {
		return "index out of range: " + strings.Replace(rest, "(array length is ", "(its length is ", 1), false // a list's or a string's
	}
	if rest, ok := strings.CutPrefix(msg, "cannot fetch "); ok {
		// A name no root has, where the checker does not look (a
		// slice's bounds): fetched from the roots' Go struct.
		if name, env, ok := strings.Cut(rest, " from struct {"); ok && strings.Contains(env, `expr:\"`) {
			return "unknown name " + name, false
		}
		// The member may hold " from ": the last names the value.
		if i := strings.LastIndex(rest, " from "); i > 0 {
			if k, ok := kinds[rest[i+len(" from "):]]; ok {
				return fmt.Sprintf("cannot fetch %s from %s", key(rest[:i]), article(k)), k == "null"
			}
		}
	}
	return msg, false
}

// plainOperation is plainWords for the library's "invalid operation: "
// messages, rest what follows that.
func plainOperation(msg, rest string) (plain string, null bool) {
	if rest == "cannot call nil" {
		return "invalid operation: cannot call null", true
	}
	if t, ok := strings.CutPrefix(rest, "cannot call non-function of type "); ok {
		if k, ok := kinds[t]; ok {
			return "invalid operation: cannot call " + article(k), k == "null"
		}
		return msg, false
	}
	if t, ok := strings.CutPrefix(rest, "- "); ok {
		if k, ok := kinds[t]; ok {
			return "invalid operation: - " + article(k), k == "null"
		}
	}
	// The library's own conversions of a value it needs as a number (a
	// list's index, a count), which name its Go type: int() and float()
	// of an expression are this package's (conversions).
	for _, fn := range []string{"int", "int64", "float"} {
		t, ok := strings.CutPrefix(rest, fn+"(")
		if !ok || !strings.HasSuffix(t, ")") {
			continue
		}
		if k, ok := kinds[strings.TrimSuffix(t, ")")]; ok {
			return fmt.Sprintf("got %s where a number (a list's index, a count) was expected", article(k)), k == "null"
		}
	}
	// The checker's, of literals: "OP (mismatched types A and B)",
	// "OP (mismatched type A)".
	if op, t, ok := strings.Cut(rest, " (mismatched types "); ok && strings.HasSuffix(t, ")") {
		a, b, _ := strings.Cut(strings.TrimSuffix(t, ")"), " and ")
		ka, okA := kinds[a]
		kb, okB := kinds[b]
		if okA && okB {
			return fmt.Sprintf("invalid operation: %s %s %s", article(ka), op, article(kb)), ka == "null" || kb == "null"
		}
		return msg, false
	}
	if op, t, ok := strings.Cut(rest, " (mismatched type "); ok && strings.HasSuffix(t, ")") {
		if k, ok := kinds[strings.TrimSuffix(t, ")")]; ok {
			return fmt.Sprintf("invalid operation: %s %s", op, article(k)), k == "null"
		}
		return msg, false
	}
	for _, op := range operators {
		a, b, ok := strings.Cut(rest, " "+op+" ")
		ka, okA := kinds[a]
		kb, okB := kinds[b]
		if ok && okA && okB {
			return fmt.Sprintf("invalid operation: %s %s %s", article(ka), op, article(kb)), ka == "null" || kb == "null"
		}
	}
	return msg, false
}

// reflectKinds are the reflect kinds the library's messages name for an
// expression's values, and their kinds.
var reflectKinds = map[string]string{
	"zero":    "null",
	"invalid": "null",
	"bool":    "boolean",
	"string":  "string",
	"int":     "number",
	"int64":   "number",
	"float64": "number",
	"map":     "object",
	"slice":   "list",
}

// kindNamed is the kind of a Go type's or a reflect kind's name, as the
// library's messages give them.
func kindNamed(name string) (string, bool) {
	if k, ok := kinds[name]; ok {
		return k, true
	}
	k, ok := reflectKinds[name]
	return k, ok
}

// kindOfValue is the kind of an expression's value v.
func kindOfValue(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case int, int64, float64:
		return "number"
	case map[string]any:
		return "object"
	case []any:
		return "list"
	}
	switch reflect.ValueOf(v).Kind() { // a range's []int, fromPairs' map
	case reflect.Slice, reflect.Array:
		return "list"
	case reflect.Map:
		return "object"
	}
	return "value"
}

// article is a kind as a value of it is named: null alone, others with
// a or an.
func article(kind string) string {
	switch kind {
	case "null":
		return "null"
	case "object":
		return "an object"
	}
	return "a " + kind
}

// key is a member the library names as it is written after a dot: a
// name or an index as it is, another key quoted.
func key(member string) string {
	if member == "<nil>" { // a null key, as Go prints it
		return "null"
	}
	if isName(member) {
		return member
	}
	if _, err := strconv.ParseFloat(member, 64); err == nil {
		return member
	}
	return strconv.Quote(member)
}
