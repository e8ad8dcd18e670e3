package workflow

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/goccy/go-yaml"
)

// WorkflowFieldOrder is the order YAML writes a definition's fields in:
// the order of the workflow fields table of docs/workflow-language.md (a
// test holds them together). A field missing here is written after these.
var WorkflowFieldOrder = []string{"name", "version", "description", "input", "output", "timeout", "retry", "on-error",
	"compensate_on", "replayable", "idempotent", "retention", "steps", "lock", "semaphore", "search_attributes"}

// Where a step's fields go: stepHead first, then the kind's own fields (in
// the order Step declares them, stepBlocks last), then stepTail, the other fields every
// kind may have, in the order of the step fields table of
// docs/workflow-language.md.
var (
	stepHead = []string{"id", "kind", "description", "condition"}
	// stepBlocks are the kind's own fields that hold steps: after its
	// others (a foreach's items before its steps).
	stepBlocks = []string{"steps", "branches", "cases", "default"}
	stepTail   = []string{"output", "on-error", "compensate", "retention", "queue", "timeout", "heartbeat", "retry", "idempotent", "replayable"}
)

// YAML writes the definition as YAML, as a person would write it: its
// fields in the workflow language's order (WorkflowFieldOrder; a step's
// id, kind, description and condition first, then the kind's own fields,
// then the others), the maps it holds (an input schema, variables, an
// environment) sorted by key. Parse reads it back into the same
// definition. Comments and the layout of the file it was applied from
// are not kept: the api stores the definition, not its text.
func (d Definition) YAML() ([]byte, error) {
	raw, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("workflow: encode %s: %w", d.Name, err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	v, err := orderedValue(dec)
	if err != nil {
		return nil, fmt.Errorf("workflow: encode %s: %w", d.Name, err)
	}
	top, ok := v.(yaml.MapSlice)
	if !ok {
		return nil, fmt.Errorf("workflow: encode %s: not an object", d.Name)
	}
	top = orderKeys(top, func(k string) int { return rank(WorkflowFieldOrder, k, 0, len(WorkflowFieldOrder)) })
	for i := range top {
		if k := top[i].Key; k == "steps" || k == "on-error" {
			top[i].Value = orderSteps(top[i].Value)
		}
	}
	var b bytes.Buffer
	emitMapping(&b, top, 0)
	return b.Bytes(), nil
}

// The YAML is written here rather than by the YAML library's encoder,
// which writes some strings plain that read back as something else ("? q"
// as a value, most texts as a key): in block style, a mapping's values
// and a sequence's items indented by two, each string plain when it
// reads back as itself, else a literal block (|) for text over lines, else
// double-quoted.

// emitMapping writes m's items at indent.
func emitMapping(b *bytes.Buffer, m yaml.MapSlice, indent int) {
	for _, it := range m {
		k, _ := it.Key.(string)
		b.WriteString(strings.Repeat(" ", indent))
		b.WriteString(quoteKey(k))
		b.WriteString(":")
		emitNested(b, it.Value, indent)
	}
}

// emitSequence writes l's items at indent; an item that is a mapping
// or a sequence starts on its dash's line (- id: a).
func emitSequence(b *bytes.Buffer, l []any, indent int) {
	for _, v := range l {
		var inner bytes.Buffer
		switch x := v.(type) {
		case yaml.MapSlice:
			if len(x) > 0 {
				emitMapping(&inner, x, indent+2)
			}
		case []any:
			if len(x) > 0 {
				emitSequence(&inner, x, indent+2)
			}
		}
		if inner.Len() > 0 { // starts with indent+2 spaces: the dash takes the last two
			b.WriteString(strings.Repeat(" ", indent))
			b.WriteString("- ")
			b.Write(inner.Bytes()[indent+2:])
			continue
		}
		b.WriteString(strings.Repeat(" ", indent))
		b.WriteString("-")
		emitNested(b, v, indent)
	}
}

// emitNested writes v after a key's colon or an item's dash at indent
// (that line's): a scalar on the line, a collection below it, indented.
func emitNested(b *bytes.Buffer, v any, indent int) {
	switch x := v.(type) {
	case yaml.MapSlice:
		if len(x) == 0 {
			b.WriteString(" {}\n")
			return
		}
		b.WriteString("\n")
		emitMapping(b, x, indent+2)
	case []any:
		if len(x) == 0 {
			b.WriteString(" []\n")
			return
		}
		b.WriteString("\n")
		emitSequence(b, x, indent+2)
	case string:
		if literal(x) {
			header := " |-\n"
			if strings.HasSuffix(x, "\n") {
				header, x = " |\n", strings.TrimSuffix(x, "\n")
			}
			b.WriteString(header)
			for _, line := range strings.Split(x, "\n") {
				if line != "" {
					b.WriteString(strings.Repeat(" ", indent+2))
					b.WriteString(line)
				}
				b.WriteString("\n")
			}
			return
		}
		b.WriteString(" " + quote(x) + "\n")
	case nil:
		b.WriteString(" null\n")
	case bool:
		b.WriteString(" " + strconv.FormatBool(x) + "\n")
	case int64:
		b.WriteString(" " + strconv.FormatInt(x, 10) + "\n")
	case float64:
		f := strconv.FormatFloat(x, 'g', -1, 64)
		if !strings.ContainsAny(f, ".eEn") { // a whole float64 too large for an int64: keep it a float
			f += ".0"
		}
		b.WriteString(" " + f + "\n")
	default: // orderedValue gives nothing else
		b.WriteString(" " + quote(fmt.Sprint(x)) + "\n")
	}
}

// quote writes s plain when it reads back as itself, else double-quoted.
func quote(s string) string {
	if plainReadsBack(s) {
		return s
	}
	return doubleQuoted(s)
}

// quoteKey writes k plain when it reads back as itself as a key, else
// double-quoted.
func quoteKey(k string) string {
	var m map[string]any
	if plainReadsBack(k) && yaml.Unmarshal([]byte(k+": 0"), &m) == nil && len(m) == 1 {
		if _, ok := m[k]; ok {
			return k
		}
	}
	return doubleQuoted(k)
}

// doubleQuoted is s as a YAML double-quoted scalar: its JSON string (a
// JSON string is one), with what JSON leaves as it is but YAML reads as a
// line break (NEL) or drops (a byte order mark) escaped.
func doubleQuoted(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return yamlEscapes.Replace(strings.TrimSuffix(b.String(), "\n"))
}

var yamlEscapes = strings.NewReplacer("\u0085", `\N`, "\ufeff", `\uFEFF`)

// special reports whether s holds a character that a YAML reader does
// not take as it is in a plain or literal scalar: a control character
// (but a line break), a line break of another kind, a byte order mark.
func special(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool {
		return (r < 0x20 && r != '\n') || (r >= 0x7f && r <= 0x9f) || r == '\u2028' || r == '\u2029' || r == '\ufeff'
	})
}

// otherReaders matches what a YAML 1.1 reader takes for a boolean, a
// number or a time (yes, on, 0x1F, 1e3, 2026-01-02), though this
// package's reader takes them for strings: those are quoted, so that the
// YAML means the same to any reader.
var otherReaders = regexp.MustCompile(`^(?i:y|n|yes|no|on|off|true|false|null|~)$|` +
	`^[-+]?(\.?[0-9][0-9_:.]*([eE][-+]?[0-9]+)?|0[xX][0-9a-fA-F_]+|0[oObB][0-7_]+|\.(?i:inf|nan))$|^[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}`)

// plainReadsBack reports whether s, written plain as a mapping's value
// (and alone), is read back as the same string.
func plainReadsBack(s string) bool {
	if s == "" || s != strings.TrimSpace(s) || strings.Contains(s, "\n") || special(s) || otherReaders.MatchString(s) {
		return false
	}
	var m map[string]any
	if err := yaml.Unmarshal([]byte("v: "+s), &m); err != nil || len(m) != 1 {
		return false
	}
	if got, ok := m["v"].(string); !ok || got != s {
		return false
	}
	// And on its own: a leading "..." or "---" is a document marker there.
	var alone any
	if err := yaml.Unmarshal([]byte(s), &alone); err != nil {
		return false
	}
	got, ok := alone.(string)
	return ok && got == s
}

// literal reports whether s, over several lines, can be written as a
// literal block (|) that reads back as itself; else it is a scalar.
func literal(s string) bool {
	if !strings.Contains(s, "\n") || special(s) || strings.HasPrefix(s, " ") || strings.HasPrefix(s, "\n") || strings.HasSuffix(s, "\n\n") {
		return false
	}
	for _, line := range strings.Split(s, "\n") {
		if line != strings.TrimRight(line, " ") {
			return false
		}
	}
	return true
}

// orderSteps orders the fields of each step of a list, and of the steps
// nested in them.
func orderSteps(v any) any {
	list, ok := v.([]any)
	if !ok {
		return v
	}
	for i, s := range list {
		step, ok := s.(yaml.MapSlice)
		if !ok {
			continue
		}
		step = slices.DeleteFunc(step, func(it yaml.MapItem) bool { return it.Key == "secret_refs" }) // set for agents, not a field
		step = orderKeys(step, func(k string) int {
			if r := rank(stepHead, k, 0, -1); r >= 0 {
				return r
			}
			if slices.Contains(stepBlocks, k) {
				return len(stepHead) + 1
			}
			return rank(stepTail, k, len(stepHead)+2, len(stepHead))
		})
		for j := range step {
			switch step[j].Key {
			case "steps", "on-error", "compensate", "default":
				step[j].Value = orderSteps(step[j].Value)
			case "branches", "cases": // {id, steps} and {when, steps}
				if items, ok := step[j].Value.([]any); ok {
					for _, it := range items {
						if m, ok := it.(yaml.MapSlice); ok {
							for n := range m {
								if m[n].Key == "steps" {
									m[n].Value = orderSteps(m[n].Value)
								}
							}
						}
					}
				}
			}
		}
		list[i] = step
	}
	return list
}

// rank is k's place in order, counted from base; missing if it is not
// in it.
func rank(order []string, k string, base, missing int) int {
	if i := slices.Index(order, k); i >= 0 {
		return base + i
	}
	return missing
}

// orderKeys sorts m's items by their keys' ranks, keeping the order they
// came in among equals.
func orderKeys(m yaml.MapSlice, rankOf func(string) int) yaml.MapSlice {
	slices.SortStableFunc(m, func(a, b yaml.MapItem) int {
		ka, _ := a.Key.(string)
		kb, _ := b.Key.(string)
		return rankOf(ka) - rankOf(kb)
	})
	return m
}

// orderedValue reads the next JSON value of dec, its objects as
// yaml.MapSlice in the order of their members (a struct's fields in the
// order it declares them), its numbers as int64 or float64.
func orderedValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			m := yaml.MapSlice{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				v, err := orderedValue(dec)
				if err != nil {
					return nil, err
				}
				m = append(m, yaml.MapItem{Key: k, Value: v})
			}
			_, err := dec.Token() // }
			return m, err
		case '[':
			list := []any{}
			for dec.More() {
				v, err := orderedValue(dec)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := dec.Token() // ]
			return list, err
		}
		return nil, errors.New("unexpected " + t.String())
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return i, nil
		}
		return t.Float64()
	case nil:
		return nil, nil
	default: // string, bool
		return t, nil
	}
}
