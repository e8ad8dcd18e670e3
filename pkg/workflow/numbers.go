package workflow

import (
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"strconv"
	"strings"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/token"

	"jetflow.dev/pkg/events"
)

// The YAML decoder puts a number with a fraction into a whole-number field
// by dropping the fraction (version: 20.5 stored version 20, a retry
// limit of 2.5 allowed 2; "20.5" quoted too), and takes version: 0 as no
// version at all. (Not looked into: aliases and merge keys.)
// Before a decoded definition is checked, lossyNumbers walks the document
// beside the Go type it was decoded into and reports both as problems.

// lossyNumbers appends to out a problem for every number with a fraction
// (or not finite) in n, the document or a part of it at path, where t, the
// type it decodes into, holds a whole number.
func lossyNumbers(n ast.Node, t reflect.Type, path string, out *[]FieldError) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch n := n.(type) {
	case *ast.TagNode:
		lossyNumbers(n.Value, t, path, out)
	case *ast.AnchorNode:
		lossyNumbers(n.Value, t, path, out)
	case *ast.MappingNode:
		for _, kv := range n.Values {
			lossyNumbers(kv, t, path, out)
		}
	case *ast.MappingValueNode:
		if t.Kind() != reflect.Struct || n.Key == nil || n.Key.GetToken() == nil {
			return
		}
		key := n.Key.GetToken().Value
		f, ok := yamlField(t, key)
		if !ok {
			return // unknown: the decoder said so already
		}
		if path != "" {
			key = path + "." + key
		}
		lossyNumbers(n.Value, f.Type, key, out)
	case *ast.SequenceNode:
		if t.Kind() != reflect.Slice && t.Kind() != reflect.Array {
			return
		}
		for i, v := range n.Values {
			lossyNumbers(v, t.Elem(), fmt.Sprintf("%s[%d]", path, i), out)
		}
	case *ast.NanNode, *ast.InfinityNode:
		if wholeKind(t.Kind()) { // the decoder refuses .nan and .inf, with Go's words, and takes -.inf
			tk := n.GetToken()
			*out = append(*out, FieldError{Field: path, Line: tk.Position.Line, Column: tk.Position.Column,
				Message: fmt.Sprintf("must be a whole number, not %s", tk.Value)})
		}
	case *ast.IntegerNode, *ast.FloatNode, *ast.StringNode:
		// A string too: the decoder reads "20.5" into a whole number as 20.
		if !wholeKind(t.Kind()) {
			return
		}
		text, ok := numberOf(n)
		if !ok {
			return // no number: the decoder says what it is
		}
		tk := n.GetToken()
		problem := func(format string, args ...any) {
			*out = append(*out, FieldError{Field: path, Line: tk.Position.Line, Column: tk.Position.Column, Message: fmt.Sprintf(format, args...)})
		}
		w, whole := readWhole(n, t)
		switch {
		case !whole:
			problem("must be a whole number, not %s", events.ShortNumber(text))
		case !w.InRange && path == "version":
			// The versions' own rule (validate), which a number out of the
			// type's range breaks too.
			if strings.HasPrefix(strings.TrimLeft(text, `"' `), "-") {
				problem("must be a positive version number (or absent, to let the registry number versions), not %s", events.ShortNumber(text))
			} else {
				problem("must be at most %d (the largest whole number every JSON reader keeps exact), not %s", MaxVersion, events.ShortNumber(text))
			}
		case !w.InRange:
			// The decoder says "cannot unmarshal ... ( overflow )".
			problem("must be a whole number %s, not %s", w.Range, events.ShortNumber(text))
		case w.Value.BitLen() > 53 && floatSyntax(n):
			// The decoder reads 9223372036854775807.0 through a float64:
			// another number, or an overflow.
			problem("must be a whole number written as one (%s), not %s", w.Value, events.ShortNumber(text))
		}
	}
}

// readWhole reads the number a scalar node holds as a whole number of t
// (events.ReadWhole): an integer as the parser decoded it (0x10, 0o17,
// 017), any other number as written.
func readWhole(n ast.Node, t reflect.Type) (events.Whole, bool) {
	switch n := scalar(n).(type) {
	case *ast.IntegerNode:
		return events.ReadWhole(fmt.Sprint(n.Value), t)
	case *ast.FloatNode:
		return events.ReadWhole(n.GetToken().Value, t)
	case *ast.StringNode:
		s := strings.TrimSpace(n.Value)
		if i, ok := new(big.Int).SetString(s, 0); ok { // 0xFFFFFFFFFFFFFFFFFF: an integer too large for the parser
			s = i.String()
		}
		return events.ReadWhole(s, t)
	}
	return events.Whole{}, false
}

// floatSyntax: the node writes its number with a fraction or an exponent.
func floatSyntax(n ast.Node) bool {
	switch n := scalar(n).(type) {
	case *ast.FloatNode:
		return true
	case *ast.StringNode:
		s := strings.ToLower(strings.TrimSpace(n.Value))
		return !strings.HasPrefix(s, "0x") && strings.ContainsAny(s, ".e")
	}
	return false
}

// numberOf returns the text of the number a scalar node holds (a
// string's too, when it reads as one), as the user wrote it.
func numberOf(n ast.Node) (string, bool) {
	switch n := scalar(n).(type) {
	case *ast.IntegerNode, *ast.FloatNode:
		return n.GetToken().Value, true
	case *ast.StringNode:
		s := strings.TrimSpace(n.Value)
		_, err := strconv.ParseFloat(s, 64)
		_, whole := new(big.Int).SetString(s, 0)
		if err != nil && !errors.Is(err, strconv.ErrRange) && !whole {
			return "", false
		}
		if tk := n.GetToken(); tk == nil || tk.Type == token.SingleQuoteType || tk.Type == token.DoubleQuoteType {
			return strconv.Quote(n.Value), true // as the user quoted it ("20.5"); a bare 1e30 is a string to the parser too
		}
		return n.Value, true
	}
	return "", false
}

// scalar returns the node n stands for, through the tags and anchors
// written on it (!!int 5, &n 5).
func scalar(n ast.Node) ast.Node {
	for {
		switch v := n.(type) {
		case *ast.TagNode:
			n = v.Value
		case *ast.AnchorNode:
			n = v.Value
		default:
			return n
		}
	}
}

func wholeKind(k reflect.Kind) bool {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// yamlField returns the field of struct type t that the YAML key name
// decodes into, looking into inlined structs.
func yamlField(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "-" {
			continue
		}
		if strings.Contains(opts, "inline") {
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				if g, ok := yamlField(ft, name); ok {
					return g, true
				}
			}
			continue
		}
		if tag == "" {
			tag = strings.ToLower(f.Name)
		}
		if tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// zeroVersion reports a top-level version of 0 in the document body
// (0, 0.0, "0"...: it decodes as no version, which the registry would
// number).
func zeroVersion(body ast.Node) *FieldError {
	m, ok := scalar(body).(*ast.MappingNode)
	if !ok {
		return nil
	}
	for _, kv := range m.Values {
		if kv.Key == nil || kv.Key.GetToken() == nil || kv.Key.GetToken().Value != "version" {
			continue
		}
		text, ok := numberOf(kv.Value)
		if w, whole := readWhole(kv.Value, reflect.TypeFor[int]()); ok && whole && w.Value != nil && w.Value.Sign() == 0 {
			tk := kv.Value.GetToken()
			return &FieldError{Field: "version", Line: tk.Position.Line, Column: tk.Position.Column,
				Message: "must be a positive version number (or absent, to let the registry number versions), not " + text}
		}
	}
	return nil
}
