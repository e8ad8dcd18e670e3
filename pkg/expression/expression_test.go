package expression_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/expression"
)

func env() map[string]any {
	return map[string]any{
		"input":    map[string]any{"host": "db1", "n": float64(3), "tags": []any{"a", "b"}, "t": "true"},
		"vars":     map[string]any{"count": float64(2)},
		"steps":    map[string]any{"fetch": map[string]any{"output": map[string]any{"status": float64(200)}, "status": "succeeded"}},
		"workflow": map[string]any{"id": "x1", "name": "wf", "version": float64(1), "attempt": float64(1)},
	}
}

func TestRender(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		in   any
		want any
	}{
		"Literal":          {"plain text", "plain text"},
		"Interpolation":    {"apt-${input.host}", "apt-db1"},
		"WholeKeepsType":   {"${input.n * 2}", float64(6)},
		"WholeList":        {"${input.tags}", []any{"a", "b"}},
		"ListInText":       {"tags=${input.tags}", `tags=["a","b"]`},
		"StepOutput":       {"${steps.fetch.output.status == 200}", true},
		"Vars":             {"${vars.count + 1}", float64(3)},
		"Workflow":         {"run ${workflow.id} of ${workflow.name}", "run x1 of wf"},
		"MapLiteral":       {"${ {'a': 1}.a }", float64(1)},
		"BraceInString":    {"${ 'a}b' }", "a}b"},
		"Escaped":          {"cost: $${input.n}", "cost: ${input.n}"},
		"Nested":           {map[string]any{"k": []any{"${input.host}", 5}}, map[string]any{"k": []any{"db1", 5}}},
		"NullInText":       {"x${vars.missing}y", "xy"},
		"TwoExpressions":   {"${input.host}:${input.n}", "db1:3"},
		"FunctionsBuiltin": {"${upper(input.host)}", "DB1"},
	} {
		got, err := expression.Render(tc.in, env())
		require.NoError(t, err, name)
		require.Equal(t, tc.want, got, name)
	}
}

func TestCompileFindsMistakesEarly(t *testing.T) {
	t.Parallel()
	require.NoError(t, expression.Compile(map[string]any{"a": "${input.x}", "b": []any{"${steps.s.output}"}}, nil))
	for name, in := range map[string]any{
		"UnknownRoot": "${inptu.x}",
		"Syntax":      "${input.x +}",
		"Unclosed":    "${input.x",
		"Empty":       "${ }",
		"Now":         "${now()}",
		"InList":      []any{"ok", "${vars.}"},
	} {
		require.Error(t, expression.Compile(in, nil), name)
	}
	require.Error(t, expression.CompileCondition("input.x >", nil))
	require.NoError(t, expression.CompileCondition("${input.x > 1}", nil))
	require.NoError(t, expression.CompileCondition("input.x > 1", nil))
}

func TestCondition(t *testing.T) {
	t.Parallel()
	ok, err := expression.Condition("input.n > 2", env())
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = expression.Condition("${input.host == 'db2'}", env())
	require.NoError(t, err)
	require.False(t, ok)
	_, err = expression.Condition("input.host", env())
	require.ErrorContains(t, err, "must give true or false")
	_, err = expression.Condition("input.n / vars.nothing.x", env())
	require.Error(t, err)
}

func TestRootsHoldAnyValue(t *testing.T) {
	t.Parallel()
	roots := append(append([]string{}, expression.Roots...), "result")
	require.NoError(t, expression.Compile("${result + 1}", roots))
	require.NoError(t, expression.Compile("${result.stdout}", roots))
	require.NoError(t, expression.Compile("${len(result)}", roots))
	got, err := expression.Render("${result + 1}", map[string]any{"result": float64(40)})
	require.NoError(t, err)
	require.Equal(t, float64(41), got)
	require.Error(t, expression.Compile("${resutl + 1}", roots))
}

// TestModuloOfJSONNumbers: % takes whole numbers from JSON (float64) as
// well as integer literals, and refuses, saying why, a number with a
// fraction, a string, and a zero divisor.
func TestModuloOfJSONNumbers(t *testing.T) {
	t.Parallel()
	e := env()
	e["input"] = map[string]any{"n": float64(7), "half": 1.5, "s": "x", "big": float64(1 << 40), "neg": float64(-7), "huge": float64(1 << 60), "over": 1e19}
	for code, want := range map[string]any{
		"${input.n % 2}":          float64(1),
		"${input.n % 2 == 1}":     true,
		"${7 % 3}":                float64(1),
		"${input.big % 1000}":     float64((1 << 40) % 1000),
		"${input.neg % 4}":        float64(-3),
		"${input.huge % 7}":       float64((1 << 60) % 7),
		"${let mod = 3; mod}":     float64(3),
		"${int(input.half) % 2}":  float64(1),
		"${(input.n + 1) % 4}":    float64(0),
		"${input.n % input.n}":    float64(0),
		"${[1, 2, 3, 4][2] % 2}":  float64(1),
		"${input.n % 2 ?? 'n/a'}": float64(1),
	} {
		got, err := expression.Render(code, e)
		require.NoError(t, err, code)
		require.Equal(t, want, got, code)
	}
	for code, msg := range map[string]string{
		"${input.half % 2}": "% takes whole numbers (within ±2^63), not the number 1.5 and the number 2",
		"${input.over % 2}": "% takes whole numbers (within ±2^63), not the number",
		"${input.s % 2}":    "% takes whole numbers (within ±2^63), not the string \"x\" and the number 2",
		"${input.n % 0}":    "% by zero",
	} {
		_, err := expression.Render(code, e)
		require.ErrorContains(t, err, msg, code)
	}
	require.NoError(t, expression.Compile(map[string]any{"c": "${item % 2 == 0}"}, []string{"item"}))
	require.Error(t, expression.Compile(map[string]any{"c": "${!(7 % 3)}"}, nil), "two ints keep their type: still checked with the definition")
}
