package workflow

import (
	"slices"
	"strings"
)

// AnyMember is the path element of [Definition.WriteOnlyPaths] that stands
// for any member of an object or any item of a list.
const AnyMember = "*"

// WriteOnlyPaths lists the parts of the input that the input schema marks
// `writeOnly: true` (the JSON Schema keyword for values a client sends but
// never reads back, such as passwords): read models and api answers show
// them redacted. Each path is a list of member names from the input's
// root, [AnyMember] standing for any member or list item; the empty path
// is the whole input. The schema is followed through properties,
// patternProperties, additionalProperties, items, prefixItems,
// allOf/anyOf/oneOf, if/then/else, dependentSchemas and local $refs
// (#/$defs/..., #/definitions/...).
func (d Definition) WriteOnlyPaths() [][]string {
	if d.Input == nil {
		return nil
	}
	w := writeOnlyWalk{root: d.Input}
	w.walk(d.Input, nil, 0)
	return w.paths
}

type writeOnlyWalk struct {
	root  map[string]any
	paths [][]string
}

// maxSchemaDepth bounds the walk (a $ref may point at its own schema).
const maxSchemaDepth = 32

func (w *writeOnlyWalk) add(path []string) {
	if !slices.ContainsFunc(w.paths, func(p []string) bool { return slices.Equal(p, path) }) {
		w.paths = append(w.paths, append([]string{}, path...))
	}
}

func (w *writeOnlyWalk) walk(v any, path []string, depth int) {
	s, ok := v.(map[string]any)
	if !ok || depth > maxSchemaDepth {
		return
	}
	if b, _ := s["writeOnly"].(bool); b {
		w.add(path)
		return // everything under it is hidden with it
	}
	at := func(elem string) []string { return append(slices.Clone(path), elem) }
	if props, ok := s["properties"].(map[string]any); ok {
		for _, name := range sortedKeys(props) {
			w.walk(props[name], at(name), depth+1)
		}
	}
	for _, key := range []string{"patternProperties", "dependentSchemas"} {
		if m, ok := s[key].(map[string]any); ok {
			for _, k := range sortedKeys(m) {
				if key == "dependentSchemas" {
					w.walk(m[k], path, depth+1)
				} else {
					w.walk(m[k], at(AnyMember), depth+1)
				}
			}
		}
	}
	w.walk(s["additionalProperties"], at(AnyMember), depth+1)
	w.walk(s["items"], at(AnyMember), depth+1)
	if list, ok := s["prefixItems"].([]any); ok {
		for _, e := range list {
			w.walk(e, at(AnyMember), depth+1)
		}
	}
	for _, key := range []string{"allOf", "anyOf", "oneOf"} {
		if list, ok := s[key].([]any); ok {
			for _, e := range list {
				w.walk(e, path, depth+1)
			}
		}
	}
	for _, key := range []string{"then", "else"} {
		w.walk(s[key], path, depth+1)
	}
	if ref, ok := s["$ref"].(string); ok {
		w.walk(w.resolve(ref), path, depth+1)
	}
}

// resolve follows a local reference (#/a/b); others (which input schemas
// may not hold) give nil.
func (w *writeOnlyWalk) resolve(ref string) any {
	if ref == "#" {
		return w.root
	}
	if !strings.HasPrefix(ref, "#/") {
		return nil
	}
	var cur any = w.root
	for _, tok := range strings.Split(ref[2:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[tok]
	}
	return cur
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
