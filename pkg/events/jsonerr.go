package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	case errors.Is(err, errEmpty):
		return "", "is empty (no JSON value)"
	}
	return "", strings.TrimPrefix(err.Error(), "json: ")
}

var (
	errTrailing = errors.New("json: data after the top-level value")
	errEmpty    = errors.New("json: no value")
)

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
	w, ok := ReadWhole(n, t)
	switch {
	case !ok:
		return fmt.Sprintf("must be a %swhole number, not %s", prefix, ShortNumber(n)), true
	case !w.InRange:
		return fmt.Sprintf("must be a %swhole number %s, not %s", prefix, w.Range, ShortNumber(n)), true
	}
	// Whole and in range, written with a fraction or an exponent (2.0,
	// 1e3), which encoding/json does not read into a whole number.
	return fmt.Sprintf("must be a %swhole number written as one (%s), not %s", prefix, w.Value, ShortNumber(n)), true
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

// Whole is a whole number read by ReadWhole.
type Whole struct {
	// Value is the number, exactly; nil for one too large to write out
	// (1e999999999).
	Value *big.Int
	// InRange: the type holds it. Range says what the type holds
	// ("from 0 to 255").
	InRange bool
	Range   string
}

// maxExactNumber: a number's text up to this long is read exactly (512
// bits hold every whole number and fraction it can write); a longer one
// is read as a float64, close enough for a message (reading it exactly
// takes time that grows with the square of its length: a second for a
// megabyte).
const maxExactNumber = 100

// ReadWhole reads text, a decimal number as JSON or YAML write it (300,
// -2, 2.0, 1e3), as a value of t, a Go integer type. It is false for what
// is no whole number: a fraction (2.5, 1e-400), what is no decimal number,
// or a t that is no integer type.
func ReadWhole(text string, t reflect.Type) (Whole, bool) {
	lo, hi, ok := WholeRange(t)
	if !ok {
		return Whole{}, false
	}
	rng := fmt.Sprintf("from %s to %s", lo, hi)
	var v *big.Float
	if !strings.ContainsAny(text, "0123456789") {
		return Whole{}, false // Inf, NaN: no number JSON writes, no whole one
	}
	if len(text) <= maxExactNumber {
		f, _, err := big.ParseFloat(text, 10, 512, big.ToNearestEven)
		if err != nil {
			return Whole{}, false
		}
		mantissa, _, _ := strings.Cut(strings.ToLower(text), "e")
		if f.Sign() == 0 && strings.ContainsAny(mantissa, "123456789") {
			return Whole{}, false // 1e-999999999: a fraction too small for 512 bits
		}
		v = f
	} else if !strings.ContainsAny(text, "eE") {
		// 2.000…0001, 7.000…000, 000…0007: the fraction decides, then
		// the whole part.
		m, frac, _ := strings.Cut(text, ".")
		if !digits(frac) {
			return Whole{}, false
		}
		if strings.Trim(frac, "0") != "" {
			return Whole{}, false
		}
		sign, m := "", strings.TrimLeft(m, "+")
		if rest, neg := strings.CutPrefix(m, "-"); neg {
			sign, m = "-", rest
		}
		if m = strings.TrimLeft(m, "0"); m == "" {
			m = "0"
		}
		if !digits(m) {
			return Whole{}, false
		}
		if len(m) >= maxExactNumber {
			return Whole{Range: rng}, true
		}
		return ReadWhole(sign+m, t)
	} else {
		f, err := strconv.ParseFloat(text, 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return Whole{}, false
		}
		if math.IsNaN(f) || (!math.IsInf(f, 0) && f != math.Trunc(f)) {
			return Whole{}, false
		}
		v = big.NewFloat(f)
	}
	if v.IsInf() {
		return Whole{Range: rng}, true
	}
	if !v.IsInt() {
		return Whole{}, false
	}
	n, _ := v.Int(nil)
	return Whole{Value: n, InRange: n.Cmp(lo) >= 0 && n.Cmp(hi) <= 0, Range: rng}, true
}

// digits: s is decimal digits only.
func digits(s string) bool {
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// ShortNumber is a number's text for a message: cut, with its length,
// past 40 characters.
func ShortNumber(text string) string {
	if len(text) <= 40 {
		return text
	}
	return fmt.Sprintf("%s... (%d characters)", text[:32], len(text))
}

// DecodeStrictJSON decodes data into v, refusing unknown members and
// anything after the value. Commands written by people are read with it,
// so that a misspelt member is an error instead of being ignored.
func DecodeStrictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			return err
		}
		// The decoder says only "EOF" or "unexpected EOF": nothing at
		// all, or a value cut short, which json.Unmarshal places.
		if len(bytes.TrimSpace(data)) == 0 {
			return errEmpty
		}
		var raw json.RawMessage
		if serr := json.Unmarshal(data, &raw); serr != nil {
			return serr
		}
		return err
	}
	// Only white space may follow (dec.More is false before a stray ']'
	// or '}', and a second Decode fails on one).
	if len(bytes.TrimLeft(data[dec.InputOffset():], " \t\r\n")) > 0 {
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
