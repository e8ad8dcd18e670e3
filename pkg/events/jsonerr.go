package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"strconv"
	"strings"
)

// ExplainJSON turns an encoding/json error into the member at fault (a
// dotted path, "" for the whole document) and a message for people, free
// of Go type names.
func ExplainJSON(err error) (field, message string) {
	var ute *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &ute):
		if msg, ok := wholeNumber(ute); ok {
			return ute.Field, msg
		}
		want := kindName(ute.Type)
		if ute.Field == "" {
			return "", fmt.Sprintf("must be a JSON %s, not %s", want, ute.Value)
		}
		return ute.Field, fmt.Sprintf("must be %s, not %s", article(want), ute.Value)
	case errors.As(err, &se):
		return "", fmt.Sprintf("is not valid JSON at byte %d: %s", se.Offset, strings.TrimPrefix(se.Error(), "json: "))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return name, fmt.Sprintf("unknown member %q", name)
	case errors.Is(err, errTrailing):
		return "", "has data after the JSON value"
	}
	return "", strings.TrimPrefix(err.Error(), "json: ")
}

var errTrailing = errors.New("json: data after the top-level value")

// wholeNumber explains a number given where a whole number of a Go integer
// type goes: one with a fraction, or one out of the type's range
// (encoding/json says "number 2.5" for both).
func wholeNumber(ute *json.UnmarshalTypeError) (string, bool) {
	n, ok := strings.CutPrefix(ute.Value, "number ")
	if !ok || ute.Type == nil {
		return "", false
	}
	t := ute.Type
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if _, _, whole := WholeRange(t); !whole {
		return "", false
	}
	prefix := ""
	if ute.Field == "" {
		prefix = "JSON " // the document itself
	}
	f, err := strconv.ParseFloat(n, 64)
	switch {
	case err != nil || f != math.Trunc(f):
		return fmt.Sprintf("must be a %swhole number, not %s", prefix, n), true
	}
	if rng, out := OutOfRange(n, t); out {
		return fmt.Sprintf("must be a %swhole number %s, not %s", prefix, rng, n), true
	}
	// Whole and in range, written with a fraction or an exponent (2.0,
	// 1e3), which encoding/json does not read into a whole number.
	return fmt.Sprintf("must be a %swhole number written as one (%s), not %s", prefix, strconv.FormatFloat(f, 'f', -1, 64), n), true
}

// WholeRange returns the smallest and largest values of t, a Go integer
// type, and false for any other type.
func WholeRange(t reflect.Type) (lo, hi *big.Int, ok bool) {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		half := new(big.Int).Lsh(big.NewInt(1), uint(t.Bits()-1))
		return new(big.Int).Neg(half), half.Sub(half, big.NewInt(1)), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		top := new(big.Int).Lsh(big.NewInt(1), uint(t.Bits()))
		return new(big.Int), top.Sub(top, big.NewInt(1)), true
	}
	return nil, nil, false
}

// OutOfRange reports whether the number written text (a JSON or YAML
// number: 300, -1e30, 0x10) lies outside what t, a Go integer type,
// holds, compared exactly, and says what it holds ("from 0 to 255"). A
// text that is no number, or a t that is no integer type, is not out of
// range.
func OutOfRange(text string, t reflect.Type) (string, bool) {
	lo, hi, ok := WholeRange(t)
	if !ok {
		return "", false
	}
	v, _, err := big.ParseFloat(text, 0, 256, big.ToNearestEven)
	if err != nil {
		return "", false
	}
	if v.Cmp(new(big.Float).SetInt(lo)) >= 0 && v.Cmp(new(big.Float).SetInt(hi)) <= 0 {
		return "", false
	}
	return fmt.Sprintf("from %s to %s", lo, hi), true
}

// DecodeStrictJSON decodes data into v, refusing unknown members and
// anything after the value. Commands written by people are read with it,
// so that a misspelt member is an error instead of being ignored.
func DecodeStrictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errTrailing
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); err == nil {
		return errTrailing
	}
	return nil
}

// StrictData checks that ev's data holds only members its payload type
// knows. It returns nil for events without data.
func StrictData(ev Event) error {
	p := NewPayload(ev.Type)
	if p == nil {
		return fmt.Errorf("%w: %s", ErrUnknownType, ev.Type)
	}
	if len(bytes.TrimSpace(ev.Raw)) == 0 {
		return nil
	}
	return DecodeStrictJSON(ev.Raw, p)
}

func kindName(t reflect.Type) string {
	if t == nil {
		return "value"
	}
	if t == reflect.TypeFor[TargetVersion]() {
		return `version number (1, 2, ...) or "latest"`
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Float32, reflect.Float64:
		return "number"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 { // json.RawMessage
			return "value"
		}
		return "array"
	case reflect.Map, reflect.Struct:
		return "object"
	case reflect.Pointer:
		return kindName(t.Elem())
	}
	return "value"
}

func article(s string) string {
	if strings.IndexAny(s[:1], "aeiou") == 0 {
		return "an " + s
	}
	return "a " + s
}
