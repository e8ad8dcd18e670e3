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

	"go.yaml.in/yaml/v3"
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
//
// The encoder of go.yaml.in/yaml/v3 writes it, from a tree of nodes that
// holds that order; str, key and number steer it where this package's
// reader would read its choice back as something else.
func (d Definition) YAML() ([]byte, error) {
	raw, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("workflow: encode %s: %w", d.Name, err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	top, err := orderedNode(dec)
	if err != nil {
		return nil, fmt.Errorf("workflow: encode %s: %w", d.Name, err)
	}
	if top.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("workflow: encode %s: not an object", d.Name)
	}
	orderKeys(top, func(k string) int { return rank(WorkflowFieldOrder, k, 0, len(WorkflowFieldOrder)) })
	for k, v := range pairs(top) {
		if k.Value == "steps" || k.Value == "on-error" {
			orderSteps(v)
		}
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(top); err != nil {
		return nil, fmt.Errorf("workflow: encode %s: %w", d.Name, err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("workflow: encode %s: %w", d.Name, err)
	}
	return b.Bytes(), nil
}

// otherReaders matches what a YAML 1.1 reader takes for a boolean, a
// number or a time (yes, on, 0x1F, 1e3, 2026-01-02), though this
// package's reader takes them for strings: those are quoted, so that the
// YAML means the same to any reader.
var otherReaders = regexp.MustCompile(`^(?i:y|n|yes|no|on|off|true|false|null|~)$|` +
	`^[-+]?(\.?[0-9][0-9_:.]*([eE][-+]?[0-9]+)?|0[xX][0-9a-fA-F_]+|0[oObB][0-7_]+|\.(?i:inf|nan))$|^[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}`)

// str is s as a string scalar, in the style the encoder chooses: plain
// where it reads back as itself, a literal block (|) for text over lines,
// else quoted. Double quotes are forced where this package's reader
// (github.com/goccy/go-yaml) would read the encoder's choice as something
// else, and where another reader would take it for another type
// (otherReaders):
//   - U+2028 and U+2029 are line breaks to the encoder (YAML 1.1), which
//     writes them as such, but text to the reader (YAML 1.2); in double
//     quotes the encoder escapes them (\L, \P);
//   - text over lines that starts with a space, a tab or a line break: the
//     encoder writes it as a block with an indentation indicator (|2, |2+),
//     which the reader misreads in places, or (a tab) as a block the reader
//     misreads.
func str(s string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
	if otherReaders.MatchString(s) || strings.ContainsAny(s, "\u2028\u2029") ||
		strings.Contains(s, "\n") && strings.ContainsAny(s[:1], " \t\n") {
		n.Style = yaml.DoubleQuotedStyle
	}
	return n
}

// number is a JSON number as a scalar, as written, but that the reader
// takes a number for a float only with a point (without one, for an
// integer, and for a string where it is too large for one or has an
// exponent): a float's gets one (1e+21 is written 1.0e+21).
func number(t json.Number) *yaml.Node {
	s := t.String()
	if _, err := strconv.ParseInt(s, 10, 64); err == nil {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: s}
	}
	if _, err := strconv.ParseUint(s, 10, 64); err == nil {
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: s}
	}
	if !strings.Contains(s, ".") {
		i := strings.IndexAny(s, "eE")
		if i < 0 {
			i = len(s)
		}
		s = s[:i] + ".0" + s[i:]
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: s}
}

// key is k as a mapping's key: as str, but double-quoted where it ends
// in "<<", which the reader takes, plain, for a merge key ("a<<: 1" is
// read as "a" followed by a merge key).
func key(k string) *yaml.Node {
	n := str(k)
	if strings.HasSuffix(k, "<<") {
		n.Style = yaml.DoubleQuotedStyle
	}
	return n
}

// pairs yields a mapping node's keys and values.
func pairs(m *yaml.Node) func(yield func(k, v *yaml.Node) bool) {
	return func(yield func(k, v *yaml.Node) bool) {
		for i := 0; i+1 < len(m.Content); i += 2 {
			if !yield(m.Content[i], m.Content[i+1]) {
				return
			}
		}
	}
}

// orderSteps orders the fields of each step of a list, and of the steps
// nested in them.
func orderSteps(list *yaml.Node) {
	if list.Kind != yaml.SequenceNode {
		return
	}
	for _, step := range list.Content {
		if step.Kind != yaml.MappingNode {
			continue
		}
		deleteKey(step, "secret_refs") // set for agents, not a field
		orderKeys(step, func(k string) int {
			if r := rank(stepHead, k, 0, -1); r >= 0 {
				return r
			}
			if slices.Contains(stepBlocks, k) {
				return len(stepHead) + 1
			}
			return rank(stepTail, k, len(stepHead)+2, len(stepHead))
		})
		for k, v := range pairs(step) {
			switch k.Value {
			case "steps", "on-error", "compensate", "default":
				orderSteps(v)
			case "branches", "cases": // {id, steps} and {when, steps}
				if v.Kind != yaml.SequenceNode {
					continue
				}
				for _, it := range v.Content {
					if it.Kind != yaml.MappingNode {
						continue
					}
					for k, v := range pairs(it) {
						if k.Value == "steps" {
							orderSteps(v)
						}
					}
				}
			}
		}
	}
}

// deleteKey removes key and its value from a mapping node.
func deleteKey(m *yaml.Node, key string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content = slices.Delete(m.Content, i, i+2)
			return
		}
	}
}

// rank is k's place in order, counted from base; missing if it is not
// in it.
func rank(order []string, k string, base, missing int) int {
	if i := slices.Index(order, k); i >= 0 {
		return base + i
	}
	return missing
}

// orderKeys sorts a mapping node's pairs by their keys' ranks, keeping
// the order they came in among equals.
func orderKeys(m *yaml.Node, rankOf func(string) int) {
	type pair struct{ k, v *yaml.Node }
	ps := make([]pair, 0, len(m.Content)/2)
	for k, v := range pairs(m) {
		ps = append(ps, pair{k, v})
	}
	slices.SortStableFunc(ps, func(a, b pair) int { return rankOf(a.k.Value) - rankOf(b.k.Value) })
	m.Content = m.Content[:0]
	for _, p := range ps {
		m.Content = append(m.Content, p.k, p.v)
	}
}

// orderedNode reads the next JSON value of dec as a YAML node, its
// objects' members in the order they came (a struct's fields in the order
// it declares them, a map's keys sorted), its numbers as written.
func orderedNode(dec *json.Decoder) (*yaml.Node, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				v, err := orderedNode(dec)
				if err != nil {
					return nil, err
				}
				m.Content = append(m.Content, key(k), v)
			}
			_, err := dec.Token() // }
			return m, err
		case '[':
			l := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
			for dec.More() {
				v, err := orderedNode(dec)
				if err != nil {
					return nil, err
				}
				l.Content = append(l.Content, v)
			}
			_, err := dec.Token() // ]
			return l, err
		}
		return nil, errors.New("unexpected " + t.String())
	case json.Number:
		return number(t), nil
	case bool:
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(t)}, nil
	case string:
		return str(t), nil
	default: // null
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"}, nil
	}
}
