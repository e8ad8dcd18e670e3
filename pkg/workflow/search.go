package workflow

import (
	"fmt"
	"regexp"
	"slices"
)

// Where a search attribute's value is read from: a top-level member of the
// execution's input, or a workflow variable (as let steps set it).
const (
	SearchFromInput = "input"
	SearchFromVars  = "vars"
)

// MaxSearchAttributes bounds the search attributes of a workflow: each is
// a row of the visibility index per execution.
const MaxSearchAttributes = 16

// SearchAttribute is an entry of [Definition.SearchAttributes]: the
// attribute is called by the member's or variable's name, and its value
// is that member's or variable's current value, as the execution's read
// model shows it.
//
// Only top-level members and variables are named, not paths into them:
// what is searched is one value per attribute and execution, and the
// read model (which the index is fed from) holds the input and the
// variables as they are.
type SearchAttribute struct {
	Name string
	// From is SearchFromInput or SearchFromVars.
	From string
}

var searchAttrRe = regexp.MustCompile(`^(input|vars)\.([A-Za-z_][A-Za-z0-9_]{0,63})$`)

// ParseSearchAttribute reads an entry of search_attributes
// ("input.customer", "vars.tier").
func ParseSearchAttribute(s string) (SearchAttribute, bool) {
	m := searchAttrRe.FindStringSubmatch(s)
	if m == nil {
		return SearchAttribute{}, false
	}
	return SearchAttribute{Name: m[2], From: m[1]}, true
}

// SearchAttributeList returns the definition's search attributes, parsed.
// An entry Validate refuses is left out (a stored definition has none).
func (d Definition) SearchAttributeList() []SearchAttribute {
	var out []SearchAttribute
	for _, s := range d.SearchAttributes {
		if a, ok := ParseSearchAttribute(s); ok && !slices.ContainsFunc(out, func(b SearchAttribute) bool { return b.Name == a.Name }) {
			out = append(out, a)
		}
	}
	return out
}

// checkSearchAttributes checks search_attributes: each names a top-level
// input member or variable, once; an input member is one the input schema
// allows and does not mark writeOnly (its value never leaves the history,
// so there is nothing to search). Variables cannot be checked against the
// let steps: a workflow called by name sets the same variables.
func checkSearchAttributes(add func(string, string, ...any), d Definition) {
	if len(d.SearchAttributes) > MaxSearchAttributes {
		add("search_attributes", "at most %d search attributes, not %d: each is indexed for every execution", MaxSearchAttributes, len(d.SearchAttributes))
	}
	seen := map[string]int{}
	writeOnly := d.WriteOnlyPaths()
	props, closed := inputMembers(d.Input)
	for i, s := range d.SearchAttributes {
		field := fmt.Sprintf("search_attributes[%d]", i)
		a, ok := ParseSearchAttribute(s)
		if !ok {
			add(field, "%q names no input member or variable: write input.<member> or vars.<variable> (a top-level one: a letter or _, then letters, digits or _, at most 64)", s)
			continue
		}
		if j, dup := seen[a.Name]; dup {
			add(field, "attribute %s is named twice (search_attributes[%d] too): an attribute is called by its member's or variable's name, which must be unique", a.Name, j)
			continue
		}
		seen[a.Name] = i
		if a.From != SearchFromInput {
			continue
		}
		if slices.ContainsFunc(writeOnly, func(p []string) bool {
			return len(p) == 0 || p[0] == a.Name || p[0] == AnyMember
		}) {
			add(field, "input.%s is writeOnly in the input schema: read models show it redacted, so there is no value to search by", a.Name)
			continue
		}
		if closed && !slices.Contains(props, a.Name) {
			add(field, "input.%s is not a member the input schema allows (it lists %v and no others)", a.Name, props)
		}
	}
}

// inputMembers returns the members an input schema's properties list and
// whether it allows no others (additionalProperties: false, no
// patternProperties).
func inputMembers(schema map[string]any) ([]string, bool) {
	if schema == nil {
		return nil, false
	}
	props, _ := schema["properties"].(map[string]any)
	names := sortedKeys(props)
	_, patterns := schema["patternProperties"]
	closed := schema["additionalProperties"] == false && !patterns
	return names, closed
}
