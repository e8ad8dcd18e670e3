package workflow

import (
	"math/big"
	"slices"
	"strings"

	"github.com/goccy/go-yaml/ast"
)

// The YAML decoder mishandles the core schema's tags: version: !!int 5
// is refused ("cannot unmarshal int into ... of type int"), name: !!int
// t decodes as "0", and a definition tagged !!map is "not a mapping".
// plainTags takes !!int, !!float, !!bool, !!null, !!map and !!seq off the
// values they describe, which then decode as if untagged, and reports a
// tag on a value it does not describe (!!int t) as the problem it is.
// Other tags (!!str, !!binary, custom ones) are the decoder's.

// coreTags maps a core schema tag to the node types it describes
// and what it says the value is.
var coreTags = map[string]struct {
	types []ast.NodeType
	kind  string
}{
	"!!int":   {[]ast.NodeType{ast.IntegerType}, "a whole number"},
	"!!float": {[]ast.NodeType{ast.FloatType, ast.IntegerType, ast.InfinityType, ast.NanType}, "a number"},
	"!!bool":  {[]ast.NodeType{ast.BoolType}, "true or false"},
	"!!null":  {[]ast.NodeType{ast.NullType}, "empty"},
	"!!map":   {[]ast.NodeType{ast.MappingType, ast.MappingValueType}, "a mapping (key: value lines)"},
	"!!seq":   {[]ast.NodeType{ast.SequenceType}, "a list"},
}

// plainTags takes the core tags off body (the document's) and the values
// under it, in place, returns what stands for body then, and appends to
// out a problem for each tag on a value it does not describe.
func plainTags(body ast.Node, out *[]FieldError) ast.Node {
	var walk func(n ast.Node) ast.Node
	walk = func(n ast.Node) ast.Node {
		switch v := n.(type) {
		case *ast.TagNode:
			if v.Start == nil {
				return n
			}
			c, core := coreTags[v.Start.Value]
			if !core {
				v.Value = walk(v.Value)
				return n
			}
			target := scalar(v.Value) // !!int &n 5 describes 5
			if target == nil || !tagDescribes(v.Start.Value, c.types, target) {
				at := v.GetToken()
				if target != nil && target.GetToken() != nil {
					at = target.GetToken()
				}
				what := "an empty value"
				if target != nil && strings.TrimSpace(target.String()) != "" {
					what = target.String()
				}
				*out = append(*out, FieldError{Field: pathAt(body, "", v.GetToken().Position.Line, v.GetToken().Position.Column),
					Line: at.Position.Line, Column: at.Position.Column,
					Message: v.Start.Value + " says " + c.kind + ", and " + what + " is not: remove the tag or change the value"})
				return n
			}
			return walk(v.Value)
		case *ast.AnchorNode:
			v.Value = walk(v.Value)
		case *ast.MappingNode:
			for _, kv := range v.Values {
				walk(kv)
			}
		case *ast.MappingValueNode:
			v.Value = walk(v.Value)
		case *ast.SequenceNode:
			for i := range v.Values {
				v.Values[i] = walk(v.Values[i])
			}
		}
		return n
	}
	return walk(body)
}

// tagDescribes reports whether core tag tag describes the value n: one
// of its node types, or, for !!int and !!float, a plain number the parser
// did not type as one (an integer too large for its integers), which the
// number checks then judge (lossyNumbers). A quoted value is a string,
// whatever it holds ("5", "true"): no core tag but !!str describes it.
func tagDescribes(tag string, types []ast.NodeType, n ast.Node) bool {
	if slices.Contains(types, n.Type()) {
		return true
	}
	text, number := numberOf(n)
	if !number || strings.HasPrefix(text, `"`) { // numberOf quotes what was quoted
		return false
	}
	switch tag {
	case "!!float":
		return true
	case "!!int":
		_, whole := new(big.Int).SetString(text, 0)
		return whole && !strings.Contains(text, "_") // YAML 1.2 has no 1_000
	}
	return false
}
