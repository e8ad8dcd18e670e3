package events_test

import (
	"regexp"
	"strings"
	"testing"

	"jetflow.dev/pkg/events"
)

// The name rules as regular expressions: what the hand-written checks
// must agree with (and what they were before them).
//
// A lock name's further rules (no "..", no final '.') are not the
// expression's: want applies them.
var nameRules = []struct {
	name  string
	re    *regexp.Regexp
	valid func(string) bool
}{
	{"workflow", regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,63}$`), events.ValidWorkflowName},
	{"step", regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,63}$`), events.ValidStepID},
	{"execution", regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$`), events.ValidExecutionID},
	{"queue", regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`), events.ValidQueueName},
	{"signal", regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`), events.ValidSignalName},
	{"lock", regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`), events.ValidLockName},
}

func want(rule string, re *regexp.Regexp, s string) bool {
	if rule == "lock" && (strings.Contains(s, "..") || strings.HasSuffix(s, ".")) {
		return false
	}
	return re.MatchString(s)
}

var nameSeeds = []string{
	"", "a", "A", "z", "Z", "0", "9", "-", "_", ".", "a-", "a_", "a.", "a.b", "a..b", "0a", "-a", "_a", ".a",
	"orders", "order-fulfilment_v2", "ce-0123456789abcdef", "a b", "a/b", "a*", "a>", "é", "aé", "a\n", "\na",
	"a\x00", "ß", "a\u00ff", "[", "`", "@", "{", "/", ":",
	strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a", 65),
	strings.Repeat("a", 127), strings.Repeat("a", 128), strings.Repeat("a", 129),
	"1" + strings.Repeat("-", 63), "1" + strings.Repeat(".", 127),
}

func TestNameRulesAgreeWithTheirExpressions(t *testing.T) {
	for _, r := range nameRules {
		for _, s := range nameSeeds {
			if got, want := r.valid(s), want(r.name, r.re, s); got != want {
				t.Errorf("%s %q: valid %v, the expression says %v", r.name, s, got, want)
			}
		}
		// Every byte, first and later.
		for c := range 256 {
			for _, s := range []string{string([]byte{byte(c)}), "a" + string([]byte{byte(c)}), "1" + string([]byte{byte(c)}) + "z"} {
				if got, want := r.valid(s), want(r.name, r.re, s); got != want {
					t.Errorf("%s %q: valid %v, the expression says %v", r.name, s, got, want)
				}
			}
		}
	}
}

func TestLockNamesRefuseDoubleAndTrailingDots(t *testing.T) {
	for name, want := range map[string]bool{"a.b": true, "a.b.c": true, "a..b": false, "a.": false, "a.b.": false, ".a": false} {
		if got := events.ValidLockName(name); got != want {
			t.Errorf("ValidLockName(%q) = %v, want %v", name, got, want)
		}
	}
}

func FuzzNameRules(f *testing.F) {
	for _, s := range nameSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, r := range nameRules {
			if got, want := r.valid(s), want(r.name, r.re, s); got != want {
				t.Errorf("%s %q: valid %v, the expression says %v", r.name, s, got, want)
			}
		}
	})
}

func BenchmarkValidExecutionID(b *testing.B) {
	id := "ce-0123456789abcdef01234567"
	for b.Loop() {
		if !events.ValidExecutionID(id) {
			b.Fatal("refused")
		}
	}
}
