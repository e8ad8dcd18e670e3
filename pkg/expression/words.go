package expression

import (
	"fmt"
	"strconv"
	"strings"
)

// kinds are the Go type names the library's runtime messages give for
// an expression's values (its %T), and the words a workflow's author
// knows them by: the JSON values the expressions see.
var kinds = map[string]string{
	"<nil>":                   "null",
	"nil":                     "null",
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
		if fn, ok := strings.CutPrefix(strings.TrimSpace(fn), "to call "); ok {
			return fmt.Sprintf("%s() takes %s, not %s", fn, article(kw), article(kg)), kg == "null"
		}
		return fmt.Sprintf("got %s where %s was expected", article(kg), article(kw)), kg == "null"
	}
	if rest, ok := strings.CutPrefix(msg, "interface conversion: interface {} is "); ok {
		got, want, _ := strings.Cut(rest, ", not ")
		kg, okG := kinds[got]
		kw, okW := kinds[want]
		if okG && okW {
			return fmt.Sprintf("got %s where %s was expected", article(kg), article(kw)), kg == "null"
		}
		return msg, false
	}
	if strings.HasPrefix(msg, "reflect: call of reflect.Value.") && strings.HasSuffix(msg, " on zero Value") {
		return "got null where a value was expected", true
	}
	if rest, ok := strings.CutPrefix(msg, `operator "in" not defined on `); ok {
		if k, ok := kinds[rest]; ok {
			return `operator "in" not defined on ` + article(k), k == "null"
		}
		return msg, false
	}
	if rest, ok := strings.CutPrefix(msg, "cannot fetch "); ok {
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
	for _, fn := range []string{"int", "int64", "float", "bool"} {
		t, ok := strings.CutPrefix(rest, fn+"(")
		if !ok || !strings.HasSuffix(t, ")") {
			continue
		}
		if k, ok := kinds[strings.TrimSuffix(t, ")")]; ok {
			return fmt.Sprintf("invalid operation: %s() of %s", fn, article(k)), k == "null"
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
	if isName(member) {
		return member
	}
	if _, err := strconv.Atoi(member); err == nil {
		return member
	}
	return strconv.Quote(member)
}
