package events_test

import (
	"errors"
	"math/big"
	"reflect"
	"strconv"
	"testing"

	"jetflow.dev/pkg/events"
)

// FuzzReadWhole holds ReadWhole to strconv: a text ParseInt reads as an
// int64 is whole, in range, and that number; one it finds out of range
// but decimal is whole and out of range; a number ParseFloat reads with
// a fraction is no whole number. And it never panics.
func FuzzReadWhole(f *testing.F) {
	for _, s := range []string{"0", "-0", "7", "2.5", "1e3", "1e-3", "9223372036854775807", "9223372036854775808",
		"-9223372036854775809", "2.000000000000000000001", "1e999999999", "1e-999999999", "inf", "NaN", "0x10", ".5", "+3", "5."} {
		f.Add(s)
	}
	t64 := reflect.TypeFor[int64]()
	f.Fuzz(func(t *testing.T, s string) {
		w, whole := events.ReadWhole(s, t64)
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			if !whole || !w.InRange || w.Value.Cmp(big.NewInt(n)) != 0 {
				t.Fatalf("%q: ParseInt reads %d; ReadWhole %+v %v", s, n, w, whole)
			}
		} else if errors.Is(err, strconv.ErrRange) && decimal(s) {
			// (ParseInt says out of range before it reads a bad digit: 1e20A.)
			if !whole || w.InRange {
				t.Fatalf("%q: ParseInt finds it out of range; ReadWhole %+v %v", s, w, whole)
			}
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil && f != float64(int64(f)) && f > -1e18 && f < 1e18 && whole {
			t.Fatalf("%q: ParseFloat reads %v, with a fraction; ReadWhole calls it whole: %+v", s, f, w)
		}
	})
}

// decimal: s is an optional sign and decimal digits.
func decimal(s string) bool {
	if s != "" && (s[0] == '-' || s[0] == '+') {
		s = s[1:]
	}
	if s == "" {
		return false
	}
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
