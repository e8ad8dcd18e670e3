package expression_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/expression"
)

// TestRenderErrors: a template that cannot be evaluated is an
// *expression.Error naming the expression, on one line, wherever it sits
// in the value.
func TestRenderErrors(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		in   any
		expr string // the expression the error names
		want string // the whole message
	}{
		{"NilMember", "${vars.missing.x}", "vars.missing.x",
			"expression ${vars.missing.x}: cannot fetch x from null at character 14 (what it is fetched from is missing or null: ?.x gives null instead, and ?? a default)"},
		{"IndexOutOfRange", "first: ${input.tags[5]}", "input.tags[5]",
			"expression ${input.tags[5]}: index out of range: 5 (its length is 2) at character 11"},
		{"UnknownNameInASlice", "${input.tags[1:x]}", "input.tags[1:x]", // the checker does not look there
			"expression ${input.tags[1:x]}: unknown name x at character 14"},
		{"DivisionByZero", "${input.n / (vars.count - 2)}", "input.n / (vars.count - 2)",
			"expression ${input.n / (vars.count - 2)}: gives an infinite number or NaN, which JSON cannot hold (a division by zero? check the divisor first)"},
		{"InfinityInPairs", "${toPairs({'a': input.n / 0})}", "toPairs({'a': input.n / 0})", // a shape normalize cannot make JSON's
			"expression ${toPairs({'a': input.n / 0})}: gives an infinite number or NaN, which JSON cannot hold (a division by zero? check the divisor first)"},
		{"InfinityInAList", "${[1, -input.n / 0.0]}", "[1, -input.n / 0.0]",
			"expression ${[1, -input.n / 0.0]}: gives an infinite number or NaN, which JSON cannot hold (a division by zero? check the divisor first)"},
		{"BadConversion", "${int('x')}", "int('x')",
			"expression ${int('x')}: int() cannot read the string \"x\" as a whole number at character 1"},
		{"Empty", "${ }", "", "expression ${}: is empty"},
		{"KeysIsOff", "${keys(input)}", "keys(input)", // Go's map order would make it give other values
			"expression ${keys(input)}: unknown name keys at character 1 (keys() is off: its order would change from one evaluation to the next)"},
		{"ValuesIsOff", "${values(input)}", "values(input)",
			"expression ${values(input)}: unknown name values at character 1 (values() is off: its order would change from one evaluation to the next)"},
		{"RootNotInTheEnvironment", "${result.stdout}", "result.stdout",
			"expression ${result.stdout}: unknown name result at character 1"},
		{"InAMap", map[string]any{"a": "ok", "b": map[string]any{"c": "${vars.missing.x}"}}, "vars.missing.x",
			"expression ${vars.missing.x}: cannot fetch x from null at character 14 (what it is fetched from is missing or null: ?.x gives null instead, and ?? a default)"},
		{"NameWithDigitsOfNull", "${vars.missing.x1}", "vars.missing.x1",
			"expression ${vars.missing.x1}: cannot fetch x1 from null at character 14 (what it is fetched from is missing or null: ?.x1 gives null instead, and ?? a default)"},
		{"IndexOfNull", "${vars.missing[0]}", "vars.missing[0]",
			"expression ${vars.missing[0]}: cannot fetch 0 from null at character 13 (what it is fetched from is missing or null: ?.[...] gives null instead, and ?? a default)"},
		{"KeyOfNull", "${vars.missing['a b']}", "vars.missing['a b']",
			"expression ${vars.missing['a b']}: cannot fetch \"a b\" from null at character 13 (what it is fetched from is missing or null: ?.[...] gives null instead, and ?? a default)"},
		// The library's runtime messages name Go's types; they are given
		// in the words of the values an expression sees.
		{"NullInAnOperation", "${vars.missing + 1}", "vars.missing + 1",
			"expression ${vars.missing + 1}: invalid operation: null + a number at character 14 (a value it uses is missing or null: ?? gives a default)"},
		{"Operation", "${input.tags * input}", "input.tags * input",
			"expression ${input.tags * input}: invalid operation: a list * an object at character 12"},
		{"Negation", "${-vars.missing}", "-vars.missing",
			"expression ${-vars.missing}: invalid operation: - null at character 1 (a value it uses is missing or null: ?? gives a default)"},
		{"NullArgument", "${upper(vars.missing)}", "upper(vars.missing)",
			"expression ${upper(vars.missing)}: got null where a string was expected at character 1 (a value it uses is missing or null: ?? gives a default)"},
		{"LenOfNull", "${len(vars.missing)}", "len(vars.missing)",
			"expression ${len(vars.missing)}: invalid argument for len: null at character 1 (a value it uses is missing or null: ?? gives a default)"},
		{"LenOfANumber", "${len(input.n)}", "len(input.n)",
			"expression ${len(input.n)}: invalid argument for len: a number at character 1"},
		{"NullCondition", "${vars.missing ? 1 : 2}", "vars.missing ? 1 : 2",
			"expression ${vars.missing ? 1 : 2}: got null where a boolean was expected at character 20 (a value it uses is missing or null: ?? gives a default)"},
		{"IntOfNull", "${int(vars.missing)}", "int(vars.missing)",
			"expression ${int(vars.missing)}: int() takes a number or a string, not null at character 1 (a value it uses is missing or null: ?? gives a default)"},
		{"FloatOfAnObject", "${float(input)}", "float(input)",
			"expression ${float(input)}: float() takes a number or a string, not an object at character 1"},
		// The library names a string it cannot read by its text: the
		// string "bool" read as a Go type.
		{"IntOfATypesName", "${int(input.host + 'bool')}", "int(input.host + 'bool')",
			"expression ${int(input.host + 'bool')}: int() cannot read the string \"db1bool\" as a whole number at character 1"},
		{"FloatOfAString", "${float('x')}", "float('x')",
			"expression ${float('x')}: float() cannot read the string \"x\" as a number at character 1"},
		{"NullOnTheRight", "${1 + vars.missing}", "1 + vars.missing",
			"expression ${1 + vars.missing}: invalid operation: a number + null at character 3 (a value it uses is missing or null: ?? gives a default)"},
		{"CallANumber", "${input.n()}", "input.n()",
			"expression ${input.n()}: invalid operation: cannot call a number at character 7"},
		{"InANumber", "${'a' in input.n}", "'a' in input.n",
			"expression ${'a' in input.n}: operator \"in\" not defined on a number at character 5"},
		{"ANumberAsAKey", "${input.n in input}", "input.n in input",
			"expression ${input.n in input}: an object's keys are strings, not a number at character 9"},
		{"AListsIndexByName", "${input.tags.x}", "input.tags.x", // the library's own int() of the index
			"expression ${input.tags.x}: got a string where a number (a list's index, a count) was expected at character 12"},
		{"AListsIndexNull", "${input.tags[vars.missing]}", "input.tags[vars.missing]",
			"expression ${input.tags[vars.missing]}: got null where a number (a list's index, a count) was expected at character 11 (a value it uses is missing or null: ?? gives a default)"},
		{"WholeNumberWanted", "${bitand(input.n, 1)}", "bitand(input.n, 1)", // JSON's numbers are float64
			"expression ${bitand(input.n, 1)}: bitand() takes a whole number: int(x) makes one at character 1"},
		{"TakeAWholeNumber", "${take(input.tags, input.n)}", "take(input.tags, input.n)",
			"expression ${take(input.tags, input.n)}: take() takes a whole number of elements: int(x) makes one at character 1"},
		{"ReverseNull", "${reverse(vars.missing)}", "reverse(vars.missing)",
			"expression ${reverse(vars.missing)}: cannot reverse null at character 1 (a value it uses is missing or null: ?? gives a default)"},
		{"FlattenANumber", "${flatten(input.n)}", "flatten(input.n)",
			"expression ${flatten(input.n)}: cannot flatten a number at character 1"},
		{"TakeFromAnObject", "${take(input, 1)}", "take(input, 1)",
			"expression ${take(input, 1)}: cannot take from an object at character 1"},
		{"JoinNull", "${join(vars.missing)}", "join(vars.missing)",
			"expression ${join(vars.missing)}: invalid argument for join: null at character 1 (a value it uses is missing or null: ?? gives a default)"},
		{"FromJSONOfNoJSON", "${fromJSON(input.host)}", "fromJSON(input.host)",
			"expression ${fromJSON(input.host)}: fromJSON() was given no JSON: invalid character 'd' looking for beginning of value at character 1"},
		{"FromJSONOfAHugeNumber", "${fromJSON('1e999')}", "fromJSON('1e999')",
			"expression ${fromJSON('1e999')}: fromJSON() was given a number too large to hold: 1e999 at character 1"},
		{"AllOfANumber", "${all(input.n, true)}", "all(input.n, true)",
			"expression ${all(input.n, true)}: got a number where a list was expected at character 1"},
		{"NullKeyOfNull", "${vars.missing[vars.other]}", "vars.missing[vars.other]",
			"expression ${vars.missing[vars.other]}: cannot fetch null from null at character 13 (what it is fetched from is missing or null: ?.[...] gives null instead, and ?? a default)"},
		{"NumberKeyOfNull", "${vars.missing[1.5]}", "vars.missing[1.5]",
			"expression ${vars.missing[1.5]}: cannot fetch 1.5 from null at character 13 (what it is fetched from is missing or null: ?.[...] gives null instead, and ?? a default)"},
		{"CallNull", "${vars.missing()}", "vars.missing()",
			"expression ${vars.missing()}: invalid operation: cannot call null at character 6 (a value it uses is missing or null: ?? gives a default)"},
		{"FetchFromANumber", "${input.n.x}", "input.n.x",
			"expression ${input.n.x}: cannot fetch x from a number at character 9"},
		{"InAList", []any{"ok", 1, "${nope}"}, "nope", "expression ${nope}: unknown name nope at character 1"},
		{"SecondOfTwo", "${input.host}-${nope}", "nope", "expression ${nope}: unknown name nope at character 1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := expression.Render(tc.in, env())
			require.Nil(t, got)
			var ee *expression.Error
			require.ErrorAs(t, err, &ee)
			require.Equal(t, tc.expr, ee.Expr)
			require.NotNil(t, errors.Unwrap(err), "the cause is kept")
			require.Equal(t, tc.want, err.Error())
		})
	}
}

// TestCompileErrorsSayWhatWasMeant: an unknown name one slip away from a
// root names the root; a call of an unknown function one slip away from
// one of the library's names that function (never a root, and a root is
// never named for a call); a disabled function says why it is off. The
// message stays on one line, with the place of the error in the
// expression.
func TestCompileErrorsSayWhatWasMeant(t *testing.T) {
	t.Parallel()

	roots := []string{"input", "vars", "steps", "workflow", "item"}
	for _, tc := range []struct{ in, want string }{
		{"${inptu.host}", `expression ${inptu.host}: unknown name inptu at character 1 (did you mean "input"?)`},
		{"${itme}", `expression ${itme}: unknown name itme at character 1 (did you mean "item"?)`},
		{"${vars.n + lenn(input.tags)}", `expression ${vars.n + lenn(input.tags)}: unknown name lenn at character 10 (did you mean "len"?)`},
		{"${uper (input.host)}", `expression ${uper (input.host)}: unknown name uper at character 1 (did you mean "upper"?)`},
		{"${nope.host}", "expression ${nope.host}: unknown name nope at character 1"}, // none is a function, not a root
		{"${inptu(1)}", "expression ${inptu(1)}: unknown name inptu at character 1"},  // input is a root, not a function
		{"${stpes.a.output + itme}", `expression ${stpes.a.output + itme}: unknown name stpes at character 1 (did you mean "steps"?)`},
		{"${now()}", "expression ${now()}: unknown name now at character 1 (the clock is not available, so that an expression evaluated again gives the same value: use workflow.started_at, or pass the time in the input)"},
		// Line breaks shown as spaces: the character counts in what is shown.
		{"${input.a +\n  1 +}", "expression ${input.a +   1 +}: unexpected token EOF at character 15"},
		{"${input.a  +  nope}", "expression ${input.a  +  nope}: unknown name nope at character 13"},
		{"${'a  b' +\tnope}", "expression ${'a  b' + nope}: unknown name nope at character 10"},
		{"${kyes(input)}", `expression ${kyes(input)}: unknown name kyes at character 1 (did you mean "keys"? keys() is off: its order would change from one evaluation to the next)`},
		{"${nonw()}", "expression ${nonw()}: unknown name nonw at character 1"},                                                 // now and none, as near
		{"${'ünï' + lenn(input)}", `expression ${'ünï' + lenn(input)}: unknown name lenn at character 9 (did you mean "len"?)`}, // columns count letters, not bytes
		// The checker's messages of literals, in the values' words, not Go's.
		{"${'a' < 1}", "expression ${'a' < 1}: invalid operation: a string < a number at character 5"},
		{"${-'a'}", "expression ${-'a'}: invalid operation: - a string at character 1"},
		{"${upper(1)}", "expression ${upper(1)}: upper() takes a string, not a number at character 7"},
		{"${int([1])}", "expression ${int([1])}: int() takes a number or a string, not a list at character 1"}, // as when it runs
		{"${float(true)}", "expression ${float(true)}: float() takes a number or a string, not a boolean at character 1"},
		{"${int(nil)}", "expression ${int(nil)}: int() takes a number or a string, not null at character 1 (a value it uses is missing or null: ?? gives a default)"},
	} {
		err := expression.Compile(tc.in, roots)
		var ee *expression.Error
		require.ErrorAs(t, err, &ee, tc.in)
		require.Equal(t, tc.want, err.Error(), tc.in)
	}
}

func TestUnclosedTemplates(t *testing.T) {
	t.Parallel()

	for name, in := range map[string]string{
		"NoBrace":             "${input.host",
		"OpenSingleQuote":     "${'abc}",
		"OpenDoubleQuote":     `${"abc}`,
		"OpenBacktick":        "${`abc}",
		"EscapedClosingQuote": `${"abc\"}`,
		"MapLiteralOpen":      "${ {'a': 1 }",
		"SecondUnclosed":      "${input.host} ${vars.count",
	} {
		_, err := expression.Render(in, env())
		require.ErrorIs(t, err, expression.ErrUnclosed, name)
		require.ErrorIs(t, expression.Compile(in, nil), expression.ErrUnclosed, name)
	}
}

func TestRenderKeepsJSONShapes(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		in   string
		want any
	}{
		{"IntBecomesANumber", "${len(input.tags)}", float64(2)},
		{"RangeBecomesAListOfNumbers", "${1..3}", []any{float64(1), float64(2), float64(3)}},
		{"MappedList", "${map(input.tags, upper(#))}", []any{"A", "B"}},
		{"MapLiteral", "${ {'a': input.host} }", map[string]any{"a": "db1"}},
		{"Null", "${vars.missing}", nil},
		{"NilSafe", "${input?.y?.z}", nil},
		{"Default", "${input.x ?? 'd'}", "d"},
		{"Bool", "${input.n > 2}", true},
		{"EscapedQuoteInString", `${ 'a\'}b' }`, "a'}b"},
		{"BacktickString", "${`a}b`}", "a}b"},
		{"TrimmedCode", "${   input.host   }", "db1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := expression.Render(tc.in, env())
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}

	t.Run("OtherValuesAsTheyAre", func(t *testing.T) {
		t.Parallel()

		for _, v := range []any{nil, 3, 2.5, true, map[string]string{"a": "${x}"}} {
			got, err := expression.Render(v, env())
			require.NoError(t, err)
			require.Equal(t, v, got)
		}
	})
}

func TestRenderString(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		in   string
		want string
	}{
		{"Literal", "plain", "plain"},
		{"String", "${input.host}", "db1"},
		{"Number", "${input.n * 2}", "6"},
		{"List", "${input.tags}", `["a","b"]`},
		{"Object", "${steps.fetch.output}", `{"status":200}`},
		{"Null", "${vars.missing}", ""},
		{"Bool", "${input.n > 2}", "true"},
		{"Interpolated", "n=${input.n}, tags=${input.tags}", `n=3, tags=["a","b"]`},
		{"Escaped", "$${input.n} is ${input.n}", "${input.n} is 3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := expression.RenderString(tc.in, env())
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}

	t.Run("Error", func(t *testing.T) {
		t.Parallel()

		got, err := expression.RenderString("x-${nope}", env())
		require.Empty(t, got)
		var ee *expression.Error
		require.ErrorAs(t, err, &ee)
		require.Equal(t, "nope", ee.Expr)
	})
}

// TestConditionGivesABoolean: anything else is an error that says what it gave.
func TestConditionGivesABoolean(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name, cond, want string
	}{
		{"String", "input.host", "expression ${input.host}: gives the string \"db1\", a condition must give true or false"},
		{"Number", "input.n", "expression ${input.n}: gives the number 3, a condition must give true or false"},
		{"Int", "len(input.tags)", "expression ${len(input.tags)}: gives the number 2, a condition must give true or false"},
		{"Object", "input", `expression ${input}: gives the object {"host":"db1","n":3,"t":"true","tags":["a","b"]}, a condition must give true or false`},
		{"List", "${input.tags}", `expression ${input.tags}: gives the list ["a","b"], a condition must give true or false`},
		{"StringTrue", "input.t", "expression ${input.t}: gives the string \"true\", a condition must give true or false (a string is not a boolean: compare it, == \"true\")"},
		{"Null", "vars.missing", "expression ${vars.missing}: gives null, a condition must give true or false (a value it uses is missing or null: ?? false gives a default)"},
		{"Range", "1..3", "expression ${1..3}: gives the list [1,2,3], a condition must give true or false"},
		{"Syntax", "input.n +", "expression ${input.n +}: unexpected token EOF at character 9"},
		{"Runtime", "vars.missing.x", "expression ${vars.missing.x}: cannot fetch x from null at character 14 (what it is fetched from is missing or null: ?.x gives null instead, and ?? a default)"},
		{"Empty", "  ", "expression ${}: is empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			ok, err := expression.Condition(tc.cond, env())
			require.False(t, ok)
			var ee *expression.Error
			require.ErrorAs(t, err, &ee)
			require.Equal(t, tc.want, err.Error())
		})
	}
}

func TestTemplates(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		in   any
		want bool
	}{
		{"Plain", "plain", false},
		{"Dollar", "costs $5 {each}", false},
		{"Expression", "a ${b}", true},
		{"Escaped", "$${b}", true}, // IsTemplate is a cheap check: the escape still holds ${
		{"Unclosed", "${b", true},
		{"NestedInAMap", map[string]any{"a": 1, "b": []any{"x", map[string]any{"c": "${d}"}}}, true},
		{"NoStrings", map[string]any{"a": 1, "b": []any{true, nil}}, false},
		{"Nil", nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			require.Equal(t, tc.want, expression.HasTemplate(tc.in))
			if s, ok := tc.in.(string); ok {
				require.Equal(t, tc.want, expression.IsTemplate(s))
			}
		})
	}
}

func TestExpressionSizeIsBounded(t *testing.T) {
	t.Parallel()

	small := "${" + strings.Repeat("1+", 500) + "1}"
	require.NoError(t, expression.Compile(small, nil))
	big := "${" + strings.Repeat("1+", 1500) + "1}"
	err := expression.Compile(big, nil)
	var ee *expression.Error
	require.ErrorAs(t, err, &ee)
	require.Contains(t, err.Error(), "exceeds maximum allowed nodes")
}

// TestCompileSaysWhereInTheValue: a problem inside maps and lists names
// the member (a name as .name, another key quoted, a list's index); one
// in a plain string names none.
func TestCompileSaysWhereInTheValue(t *testing.T) {
	t.Parallel()
	v := map[string]any{"a": []any{"ok", map[string]any{"Content-Type": "${nope}"}}, "b": "fine"}
	var at *expression.PathError
	err := expression.Compile(v, nil)
	require.ErrorAs(t, err, &at)
	require.Equal(t, `.a[1]["Content-Type"]`, at.Path)
	var ee *expression.Error
	require.ErrorAs(t, err, &ee, "the expression's error inside")
	require.Equal(t, "expression ${nope}: unknown name nope at character 1", err.Error(), "the message is the expression's")

	require.ErrorAs(t, expression.Compile(map[string]any{"total": "${input.x +"}, nil), &at)
	require.Equal(t, ".total", at.Path)
	require.ErrorIs(t, at, expression.ErrUnclosed)

	err = expression.Compile("${nope}", nil)
	require.Error(t, err)
	require.False(t, errors.As(err, &at), "a plain string: no member")

	for k, want := range map[string]string{"x1": ".x1", "_a": "._a", "é": ".é", "1x": `["1x"]`, "": `[""]`, "a.b": `["a.b"]`} {
		require.Equal(t, want, expression.Member(k), k)
	}
}

// TestPlainWordsLeaveWhatTheyDoNotKnow: a message of the library whose
// types are not those of an expression's values, or of a shape not
// known, is left as it is, never half rewritten.
func TestPlainWordsLeaveWhatTheyDoNotKnow(t *testing.T) {
	t.Parallel()

	for _, msg := range []string{
		"invalid operation: time.Time + int",
		"invalid operation: int(x)",
		"invalid operation: int(time.Time)",
		"cannot take time.Duration elements",
		"cannot reverse chan",
		"reflect: call of reflect.Value.Len on chan Value",
		"reflect.Value.MapIndex: value of type time.Time is not assignable to type string",
		"invalid operation: - (mismatched type time.Duration)",
		"invalid operation: < (mismatched types string and time.Time)",
		"cannot use time.Time as argument (type string) to call upper",
		"interface conversion: interface {} is time.Time, not string",
		"cannot fetch x from time.Time",
		"cannot fetch from",
	} {
		got, null := expression.PlainWords(msg)
		require.Equal(t, msg, got)
		require.False(t, null, msg)
	}
	got, null := expression.PlainWords("cannot fetch a from b from <nil>")
	require.Equal(t, `cannot fetch "a from b" from null`, got, "the last from names the value")
	require.True(t, null)
	for msg, want := range map[string]string{ // the other types the library may name
		"invalid operation: int64 * bool":                   "invalid operation: a number * a boolean",
		"invalid operation: float(bool)":                    "got a boolean where a number (a list's index, a count) was expected",
		"invalid operation: int64(<nil>)":                   "got null where a number (a list's index, a count) was expected",
		"cannot use float64 as argument (type int)":         "expected a whole number: int(x) makes one",
		"cannot use <nil> as argument (type string)":        "got null where a string was expected",
		"reflect: call of reflect.Value.Type on zero Value": "got null where another value was expected",
		"cannot take from map[string]interface {}":          "cannot take from an object",
	} {
		got, _ := expression.PlainWords(msg)
		require.Equal(t, want, got, msg)
	}
}

// TestCompileConditionRefusesWhatIsNeverABoolean: a condition whose
// type is known when it is checked (a literal's, a function's) and is no
// boolean fails every evaluation: it is refused when applied. One whose
// type is known only when it runs is accepted.
func TestCompileConditionRefusesWhatIsNeverABoolean(t *testing.T) {
	t.Parallel()

	for in, kind := range map[string]string{`${"yes"}`: "a string", "${1 / 2}": "a number", "${len(input.tags)}": "a number",
		"${[1]}": "a list", "${{'a': 1}}": "an object", "${upper(input.host)}": "a string", "${input.n > 1 ? 'a' : 'b'}": "a string"} {
		err := expression.CompileCondition(in, nil)
		var ee *expression.Error
		require.ErrorAs(t, err, &ee, in)
		require.ErrorContains(t, err, "gives "+kind+", a condition must give true or false", in)
	}
	for _, in := range []string{"${input.flag}", "${input.n > 1}", "${true}", "${input.x ?? false}", "${let y = input.x; y}", "input.n == 3"} {
		require.NoError(t, expression.CompileCondition(in, nil), in)
	}
}

// TestInfinityInATextIsWritten: a division by zero written in a text
// (a log's message, a command's argument, a lock's name) is written as
// it was before an infinity became a value's error: +Inf, NaN.
func TestInfinityInATextIsWritten(t *testing.T) {
	t.Parallel()

	got, err := expression.Render("ratio ${input.n / 0} ${-input.n / 0}", env())
	require.NoError(t, err)
	require.Equal(t, "ratio +Inf -Inf", got)
	ok, err := expression.Condition("input.n / 0 > 1", env())
	require.NoError(t, err, "an infinity on the way to a boolean")
	require.True(t, ok)
}

// TestCompileListRefusesWhatIsNeverAList: a foreach's items that give no
// list whatever they are run with (a value neither a list nor a string,
// text, an expression whose type is known and no list) are refused when
// applied, with what they are; a list, or one ${...} whose type is known
// only when it runs or is a list, is accepted.
func TestCompileListRefusesWhatIsNeverAList(t *testing.T) {
	t.Parallel()

	for _, c := range []struct {
		in   any
		want string
	}{
		{5, "the number 5 is not a list: give a list, or an expression that gives one (${input.hosts})"},
		{uint64(7), "the number 7 is not a list"},                // as YAML decodes it
		{[]byte("hello"), `the string "aGVsbG8=" is not a list`}, // YAML's !!binary, held as text
		{true, "the boolean true is not a list"},
		{map[string]any{"a": 1}, `the object {"a":1} is not a list`},
		{"hosts", `the string "hosts" gives text, not a list: give a list, or one ${...} alone that gives one (${input.hosts})`},
		{"hosts: ${input.tags}", `the string "hosts: ${input.tags}" gives text, not a list`},
		{" ${input.tags}", `gives text, not a list`},
		{`${"a"}`, `expression ${"a"}: gives a string, not a list`},
		{"${len(input.tags)}", "expression ${len(input.tags)}: gives a number, not a list"},
		{"${{'a': 1}}", "expression ${{'a': 1}}: gives an object, not a list"},
	} {
		require.ErrorContains(t, expression.CompileList(c.in, nil), c.want, "%v", c.in)
	}
	for _, in := range []any{[]any{"a", "${input.host}"}, []string{"a"}, "${input.tags}", "${[1, 2]}", "${input.x ?? []}",
		"${filter(input.tags, # != 'a')}", nil} {
		require.NoError(t, expression.CompileList(in, nil), "%v", in)
	}
}
