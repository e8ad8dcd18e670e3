// Package apiv1test checks, in tests, that a type outside package apiv1
// stays in step with its wire type there: a server-side type that holds
// more than the wire (an api key as stored, with its hash) and is
// converted into the wire type, or a client's type that is more
// convenient to fill in than the wire type. A member added on one side
// only, renamed, or of another JSON kind makes the check fail.
package apiv1test

import (
	"bytes"
	"cmp"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"
)

var (
	rawType         = reflect.TypeFor[json.RawMessage]()
	timeType        = reflect.TypeFor[time.Time]()
	marshalerType   = reflect.TypeFor[json.Marshaler]()
	textMarshalType = reflect.TypeFor[encoding.TextMarshaler]()
)

// Members returns the JSON members that encoding/json gives a value of
// v's type (a struct or a pointer to one), by name, each described by its
// JSON kind and its tag's options: "string omitempty", "number", "time",
// "[]string", "map[string]{note:string omitempty; seq:number}". Raw JSON
// and interfaces are "any". The fields of an embedded struct are members
// unless a field of the outer struct has their name.
func Members(v any) (map[string]string, error) {
	ms, err := membersOf(v)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(ms))
	for name, m := range ms {
		out[name] = m.String()
	}
	return out, nil
}

// member is a JSON member's kind and its tag's options ("omitempty").
type member struct{ kind, opts string }

func (m member) String() string {
	if m.opts == "" {
		return m.kind
	}
	return m.kind + " " + m.opts
}

func membersOf(v any) (map[string]member, error) {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil, fmt.Errorf("apiv1test: %T is not a struct", v)
	}
	return members(t, map[reflect.Type]bool{t: true}), nil
}

func members(t reflect.Type, seen map[reflect.Type]bool) map[string]member {
	out := map[string]member{}
	var embedded []reflect.Type
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			embedded = append(embedded, ft)
			continue
		}
		if !f.IsExported() {
			continue
		}
		out[cmp.Or(name, f.Name)] = member{kind: kind(f.Type, seen), opts: strings.ReplaceAll(opts, ",", " ")}
	}
	for _, et := range embedded {
		for name, m := range members(et, seen) {
			if _, ok := out[name]; !ok {
				out[name] = m
			}
		}
	}
	return out
}

// kind describes the JSON that encoding/json makes of a value of type t.
func kind(t reflect.Type, seen map[reflect.Type]bool) string {
	switch {
	case t == rawType:
		return "any"
	case t == timeType:
		return "time"
	case t.Kind() == reflect.Pointer:
		return kind(t.Elem(), seen)
	case t.Implements(marshalerType) || reflect.PointerTo(t).Implements(marshalerType),
		t.Implements(textMarshalType) || reflect.PointerTo(t).Implements(textMarshalType):
		return "marshaler:" + t.String()
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "bool"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Interface:
		return "any"
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			return "string" // base64
		}
		return "[]" + kind(t.Elem(), seen)
	case reflect.Array:
		return "[]" + kind(t.Elem(), seen)
	case reflect.Map:
		return "map[" + kind(t.Key(), seen) + "]" + kind(t.Elem(), seen)
	case reflect.Struct:
		if seen[t] {
			return t.String() // a cycle
		}
		seen[t] = true
		defer delete(seen, t)
		ms := members(t, seen)
		parts := make([]string, 0, len(ms))
		for _, name := range slices.Sorted(maps.Keys(ms)) {
			parts = append(parts, name+":"+ms[name].String())
		}
		return "{" + strings.Join(parts, "; ") + "}"
	}
	return "unsupported:" + t.String()
}

// SameMembers returns an error unless a and b (structs, or pointers to
// them) have the same JSON members, each of the same kind with the same
// omitempty and omitzero options, but for onlyA, members that a must
// have and b must not, and onlyB, the other way round. Raw JSON
// (json.RawMessage) or an interface on one side matches any kind on the
// other.
func SameMembers(a, b any, onlyA, onlyB []string) error {
	ma, err := membersOf(a)
	if err != nil {
		return err
	}
	mb, err := membersOf(b)
	if err != nil {
		return err
	}
	var errs []error
	for _, only := range []struct {
		names      []string
		has, lacks map[string]member
		hasT, lack any
	}{{onlyA, ma, mb, a, b}, {onlyB, mb, ma, b, a}} {
		for _, name := range only.names {
			if _, ok := only.has[name]; !ok {
				errs = append(errs, fmt.Errorf("%T has no member %q, which is said to be its own", only.hasT, name))
			}
			if _, ok := only.lacks[name]; ok {
				errs = append(errs, fmt.Errorf("%T has the member %q too, which is said to be %T's own", only.lack, name, only.hasT))
			}
			delete(only.has, name)
			delete(only.lacks, name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(ma)) {
		da := ma[name]
		db, inB := mb[name]
		switch {
		case !inB:
			errs = append(errs, fmt.Errorf("%T has the member %q (%s), %T does not", a, name, da, b))
		case !sameKind(da, db):
			errs = append(errs, fmt.Errorf("member %q is %s in %T, %s in %T", name, da, a, db, b))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(mb)) {
		if _, ok := ma[name]; !ok {
			errs = append(errs, fmt.Errorf("%T has the member %q (%s), %T does not", b, name, mb[name], a))
		}
	}
	return errors.Join(errs...)
}

// sameKind compares two members: the options must be equal, the kinds
// too unless one is raw JSON.
func sameKind(a, b member) bool {
	return a.opts == b.opts && (a.kind == b.kind || a.kind == "any" || b.kind == "any")
}

// SameJSON returns an error unless a and b encode to JSON objects with
// the same members and values, leaving out the members named in
// ignore. A conversion from a server-side type to its wire type that
// drops or changes a value fails it (fill the value with [Fill] first).
func SameJSON(a, b any, ignore ...string) error {
	oa, err := object(a)
	if err != nil {
		return err
	}
	ob, err := object(b)
	if err != nil {
		return err
	}
	for _, name := range ignore {
		delete(oa, name)
		delete(ob, name)
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(oa)) {
		vb, ok := ob[name]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%T has %q: %s, %T does not", a, name, oa[name], b))
		case !bytes.Equal(oa[name], vb):
			errs = append(errs, fmt.Errorf("%q is %s in %T, %s in %T", name, oa[name], a, vb, b))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(ob)) {
		if _, ok := oa[name]; !ok {
			errs = append(errs, fmt.Errorf("%T has %q: %s, %T does not", b, name, ob[name], a))
		}
	}
	return errors.Join(errs...)
}

// object encodes v and splits the JSON object into its members, each
// compacted.
func object(v any) (map[string]json.RawMessage, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("apiv1test: encode %T: %w", v, err)
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil, fmt.Errorf("apiv1test: %T is no JSON object: %w", v, err)
	}
	for name, raw := range obj {
		var buf bytes.Buffer
		if err := json.Compact(&buf, raw); err != nil {
			return nil, err
		}
		obj[name] = buf.Bytes()
	}
	return obj, nil
}

// Fill sets every exported field of the struct v points to, that is a
// string, number, bool, time, raw JSON, or a slice or map of those, to a
// value that is not zero and differs from the other fields' (a string
// holds the field's name), so that a conversion that drops a field or
// mixes two up shows in [SameJSON]. Other fields (structs, pointers,
// interfaces) are left as they are.
func Fill(v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("apiv1test: Fill needs a pointer to a struct, not %T", v)
	}
	s := rv.Elem()
	for i := range s.NumField() {
		f := s.Type().Field(i)
		if !f.IsExported() {
			continue
		}
		fill(s.Field(i), f.Name, i+1)
	}
	return nil
}

// fill sets v to a value made of name and n when its type is one Fill
// fills.
func fill(v reflect.Value, name string, n int) bool {
	t := v.Type()
	switch {
	case t == rawType:
		v.SetBytes([]byte(fmt.Sprintf(`{"%s":%d}`, name, n)))
		return true
	case t == timeType:
		v.Set(reflect.ValueOf(time.Date(2026, 1, 1, 0, 0, n, 0, time.UTC)))
		return true
	}
	switch t.Kind() {
	case reflect.String:
		v.SetString(name)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(n))
	case reflect.Float32, reflect.Float64:
		v.SetFloat(float64(n) + 0.5)
	case reflect.Slice:
		elem := reflect.New(t.Elem()).Elem()
		if !fill(elem, name, n) {
			return false
		}
		v.Set(reflect.Append(reflect.MakeSlice(t, 0, 1), elem))
	case reflect.Map:
		key, elem := reflect.New(t.Key()).Elem(), reflect.New(t.Elem()).Elem()
		if !fill(key, name, n) || !fill(elem, name, n) {
			return false
		}
		v.Set(reflect.MakeMap(t))
		v.SetMapIndex(key, elem)
	default:
		return false
	}
	return true
}
