package retention_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/retention"
)

func TestParse(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, text string
		rule       string // the canonical form
		hash       string
	}{
		{"Count", "3", "3", ""},
		{"Zero", "0", "0", ""},
		{"Duration", "24h", "24h", ""},
		{"Days", "7d", "7d", ""},
		{"DaysAndHours", "1d12h", "36h", ""},
		{"Minutes", "90m", "1h30m", ""},
		{"Forever", "forever", "forever", ""},
		{"Context", "context", "context", ""},
		{"Parent", "parent", "parent", ""},
		{"System", "system", "system", ""},
		{"Disabled", "disabled", "disabled", ""},
		{"Max", "max(24h,5)", "max(24h, 5)", ""},
		{"MinOfMax", "min( 2, max(3, 1h) , 2h )", "min(2, max(3, 1h), 2h)", ""},
		{"MaxContext", "max(context, 6h)", "max(context, 6h)", ""},
		{"CountHash", "2 hash start-stop", "2", "start-stop"},
		{"HashExpression", "forever hash ${workflow.name} failed", "forever", "${workflow.name} failed"},
		{"HashOnly", "hash nightly", "context", "nightly"},
		{"HashKeyHoldsHash", "5 hash my hash", "5", "my hash"},
		{"Spaces", "  max(5,  24h)  ", "max(5, 24h)", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			spec, err := retention.Parse(tc.text)
			require.NoError(t, err)
			require.Equal(t, tc.rule, spec.Rule.String())
			require.Equal(t, tc.hash, spec.Hash)
			again, err := retention.ParseRule(spec.Rule.String())
			require.NoError(t, err, "the canonical form parses")
			require.Equal(t, spec.Rule, again)
		})
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, text, want string
	}{
		{"Empty", "  ", "empty"},
		{"Unknown", "sometimes", `unknown value "sometimes"`},
		{"Negative", "-3", `"-3" is negative`},
		{"NegativeDuration", "-1h", `"-1h" is negative`},
		{"ZeroDuration", "0s", "must be positive"},
		{"TwoValues", "5 24h", `unexpected "24h" after 5`},
		{"MaxWithoutParens", "max 5", "needs its arguments in parentheses"},
		{"Unclosed", "max(5, 24h", "missing its closing parenthesis"},
		{"EmptyMax", "max()", `unexpected ")"`},
		{"DisabledInMax", "max(disabled, 5)", "disabled cannot be an argument"},
		{"MissingSeparator", "min(5 24h)", `unexpected "24h" in min(...)`},
		{"HashWithoutKey", "5 hash", "hash needs a key"},
		{"HashBadRule", "often hash x", `unknown value "often"`},
		{"TooLarge", "10000000000", "larger than"},
		{"TooDeep", "max(max(max(max(max(max(max(max(max(1)))))))))", "nest at most"},
		{"Trailing", "max(5))", `unexpected ")" after max(5)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := retention.Parse(tc.text)
			require.Error(t, err)
			require.True(t, errors.Is(err, retention.ErrInvalid))
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestParseDefault(t *testing.T) {
	t.Parallel()
	r, err := retention.ParseDefault("max(3, 7d)")
	require.NoError(t, err)
	require.Equal(t, "max(3, 7d)", r.String())
	for _, bad := range []string{"system", "max(parent, 3)", "context", "3 hash x", ""} {
		_, err := retention.ParseDefault(bad)
		require.Error(t, err, bad)
	}
}

func must(t *testing.T, text string) retention.Rule {
	t.Helper()
	r, err := retention.ParseRule(text)
	require.NoError(t, err)
	return r
}

func TestInContextAndResolve(t *testing.T) {
	t.Parallel()
	prev := must(t, "max(context, 6h)").InContext(retention.Default)
	require.Equal(t, "max(parent, 6h)", prev.String())
	// Applying the same step rule again does not grow the rule.
	again := must(t, "max(context, 6h)").InContext(prev)
	require.Equal(t, "max(parent, 6h)", again.String())
	require.Equal(t, "forever", must(t, "forever").InContext(prev).String())
	require.Equal(t, "min(max(parent, 6h), 2)", must(t, "min(context, 2)").InContext(prev).String())

	sys := must(t, "3")
	require.Equal(t, "max(3, 6h)", prev.Resolve(sys).String())
	require.Equal(t, "3", must(t, "system").Resolve(sys).String())
	require.Equal(t, "3", must(t, "max(parent, system)").Resolve(sys).String())
}

func TestKeep(t *testing.T) {
	t.Parallel()
	type at struct {
		rank int
		age  time.Duration
		keep bool
	}
	for _, tc := range []struct {
		rule  string
		cases []at
	}{
		{"2", []at{{0, time.Hour, true}, {1, 1000 * time.Hour, true}, {2, 0, false}}},
		{"0", []at{{0, 0, false}}},
		{"1h", []at{{5, 59 * time.Minute, true}, {0, time.Hour, false}}},
		{"forever", []at{{1000, 10000 * time.Hour, true}}},
		{"disabled", []at{{0, 0, false}}},
		// The seed's examples: min keeps only what meets every
		// constraint, max what meets any.
		{"min(2, 3, 1h, 2h)", []at{{1, 30 * time.Minute, true}, {1, 90 * time.Minute, false}, {2, time.Minute, false}}},
		{"max(2, 3, 1h, 2h)", []at{{2, 10 * time.Hour, true}, {3, 90 * time.Minute, true}, {3, 3 * time.Hour, false}}},
		{"parent", []at{{100, 100 * time.Hour, true}}}, // unresolved: kept
	} {
		r := must(t, tc.rule)
		for _, c := range tc.cases {
			require.Equal(t, c.keep, r.Keep(c.rank, c.age), "%s at rank %d, age %s", tc.rule, c.rank, c.age)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"3", "max(24h,5)", "min(2, max(3, 1h))", "forever hash ${workflow.name} failed", "hash x", "max(", "7d12h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		spec, err := retention.Parse(text)
		if err != nil {
			return
		}
		again, err := retention.ParseRule(spec.Rule.String())
		if err != nil {
			t.Fatalf("canonical form %q of %q does not parse: %v", spec.Rule.String(), text, err)
		}
		if again.String() != spec.Rule.String() {
			t.Fatalf("canonical form changes: %q then %q", spec.Rule.String(), again.String())
		}
	})
}
