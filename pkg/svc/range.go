package svc

import (
	"fmt"
	"strings"
	"time"
)

// Number is the type of a numeric setting: a count, a size or a
// [time.Duration].
type Number interface{ ~int | ~int64 }

// Range is the values a numeric setting may take, both ends included.
// The services' Config packages declare theirs once; their Validate
// methods and the programs' flags ([Flags.IntIn], [Flags.DurationIn])
// check against the same values.
type Range[T Number] struct{ Min, Max T }

// Contains reports whether v lies in r.
func (r Range[T]) Contains(v T) bool { return v >= r.Min && v <= r.Max }

// String is "<min> to <max>", durations written short (1h, not 1h0m0s).
func (r Range[T]) String() string { return format(r.Min) + " to " + format(r.Max) }

// Check returns nil when v lies in r, otherwise a [*RangeError] naming
// setting (a Config field such as "agent: AckWait", or a flag and its
// environment variable), v and r.
func (r Range[T]) Check(setting string, v T) error {
	if r.Contains(v) {
		return nil
	}
	return &RangeError{Setting: setting, Value: format(v), Range: r.String()}
}

// RangeError reports a numeric setting outside the values that work.
type RangeError struct {
	// Setting names it: a Config field, or a flag and its environment
	// variable.
	Setting string
	// Value is the value given, Range the values allowed ("1 to 1024").
	Value, Range string
}

func (e *RangeError) Error() string {
	return fmt.Sprintf("%s %s: out of range, use %s", e.Setting, e.Value, e.Range)
}

// NeverIfZero is a Config duration for a flag whose 0 on the command line
// means never: negative, since a Config's 0 is its default.
func NeverIfZero(flag time.Duration) time.Duration {
	if flag == 0 {
		return -1
	}
	return flag
}

// ShortDuration writes d as range errors and -h do (90m as 1h30m, 1h as
// 1h, not 1h0m0s).
func ShortDuration(d time.Duration) string { return format(d) }

// format writes a duration short (90m as 1h30m, 1h as 1h) and any other
// number as is.
func format[T Number](v T) string {
	d, ok := any(v).(time.Duration)
	if !ok {
		return fmt.Sprint(v)
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}
