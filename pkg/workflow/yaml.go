package workflow

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/goccy/go-yaml"
)

// WorkflowFieldOrder is the order YAML writes a definition's fields in:
// the order of the workflow fields table of docs/workflow-language.md (a
// test holds them together). A field missing here is written after these.
var WorkflowFieldOrder = []string{"name", "version", "description", "input", "output", "timeout", "retry", "on-error",
	"compensate_on", "replayable", "idempotent", "retention", "steps", "lock", "semaphore", "search_attributes"}

// Where a step's fields go: stepHead first, then the kind's own fields (in
// the order Step declares them), then stepTail, the other fields every
// kind may have, in the order of the step fields table of
// docs/workflow-language.md.
var (
	stepHead = []string{"id", "kind", "description", "condition"}
	stepTail = []string{"output", "on-error", "compensate", "retention", "queue", "timeout", "heartbeat", "retry", "idempotent", "replayable"}
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
	return yaml.MarshalWithOptions(top, yaml.Indent(2), yaml.IndentSequence(true), yaml.UseLiteralStyleIfMultiline(true),
		yaml.CustomMarshaler[scalar](scalar.yaml))
}

// scalar is a string written plain when it reads back as itself, else
// in double quotes: the YAML library's own choice leaves some strings
// plain that read back as something else ("? q").
type scalar string

func (s scalar) yaml() ([]byte, error) {
	if plainReadsBack(string(s)) {
		return []byte(s), nil
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b) // a JSON string is a YAML double-quoted one
	enc.SetEscapeHTML(false)
	if err := enc.Encode(string(s)); err != nil {
		return nil, err
	}
	// What JSON leaves as it is but YAML reads as a line break (NEL) or
	// drops (a byte order mark), escaped.
	return []byte(yamlEscapes.Replace(string(bytes.TrimRight(b.Bytes(), "\n")))), nil
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
	// The encoder reads the scalar on its own too (a leading "..." or
	// "---" would end or start a document there).
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
			return rank(stepTail, k, len(stepHead)+1, len(stepHead))
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
	case string:
		if literal(t) {
			return t, nil
		}
		return scalar(t), nil
	default: // bool
		return t, nil
	}
}
