package workflow_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/workflow"
)

// TestParseErrorsNameTheField: a value of the wrong type, a wrong node
// kind, a number with a fraction where a whole number goes (which the
// decoder would cut) and an invalid input schema are each one line that
// names the field at fault, without Go type names, file paths or a
// metaschema dump.
func TestParseErrorsNameTheField(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, input, field, msg string
		line                    int
	}{
		{name: "ListForAString", input: "name: t\nsteps:\n  - id: a\n    kind: noop\n    timeout: [1]\n",
			field: "steps[0].timeout", line: 5, msg: "must be a string, not a list"},
		{name: "MappingForAString", input: "name: t\nsteps:\n  - id: a\n    kind: noop\n    timeout:\n      x: 1\n",
			field: "steps[0].timeout", msg: "must be a string, not a mapping"},
		{name: "StringForANumber", input: "name: t\nsteps:\n  - id: a\n    kind: foreach\n    items: [1]\n    concurrency: abc\n    steps:\n      - id: b\n        kind: noop\n",
			field: "steps[0].concurrency", line: 6, msg: "must be a whole number, not a string"},
		{name: "FractionForAVersion", input: "name: t\nversion: 20.5\nsteps:\n  - {id: a, kind: noop}\n",
			field: "version", line: 2, msg: "must be a whole number, not 20.5"},
		{name: "FractionInJSON", input: `{"name":"t","version":3.7,"steps":[{"id":"a","kind":"noop"}]}`,
			field: "version", line: 1, msg: "must be a whole number, not 3.7"},
		{name: "FractionForARetryLimit", input: "name: t\nsteps:\n  - id: a\n    kind: noop\n    retry: {limit: 2.5}\n",
			field: "steps[0].retry.limit", line: 5, msg: "must be a whole number, not 2.5"},
		{name: "FractionDeep", input: "name: t\nsteps:\n  - id: a\n    kind: workflow\n    steps:\n      - id: b\n        kind: foreach\n        items: [1]\n        concurrency: 1.5\n        steps: [{id: c, kind: noop}]\n",
			field: "steps[0].steps[0].concurrency", line: 9, msg: "must be a whole number, not 1.5"},
		{name: "VersionZero", input: "name: t\nversion: 0\nsteps:\n  - {id: a, kind: noop}\n",
			field: "version", line: 2, msg: "must be a positive version number (or absent, to let the registry number versions), not 0"},
		{name: "QuotedFraction", input: "name: t\nversion: '20.5'\nsteps:\n  - {id: a, kind: noop}\n",
			field: "version", line: 2, msg: `must be a whole number, not "20.5"`},
		{name: "QuotedFractionInJSON", input: `{"name":"t","steps":[{"id":"a","kind":"noop","retry":{"limit":"2.9"}}]}`,
			field: "steps[0].retry.limit", line: 1, msg: `must be a whole number, not "2.9"`},
		{name: "VersionZeroAsAFraction", input: "name: t\nversion: 0.0\nsteps:\n  - {id: a, kind: noop}\n",
			field: "version", line: 2, msg: "not 0.0"},
		{name: "VersionZeroQuoted", input: "name: t\nversion: '0'\nsteps:\n  - {id: a, kind: noop}\n",
			field: "version", line: 2, msg: `not "0"`},
		{name: "VersionZeroAnchored", input: "&top\nname: t\nversion: &z 0\nsteps:\n  - {id: a, kind: noop}\n",
			field: "version", msg: "must be a positive version number"},
		{name: "IntTagOnAWord", input: "name: !!int t\nsteps:\n  - {id: a, kind: noop}\n",
			field: "name", line: 1, msg: "!!int says a whole number, and t is not: remove the tag or change the value"},
		{name: "IntTagOnAFraction", input: "name: t\nsteps:\n  - id: a\n    kind: noop\n    retry: {limit: !!int 2.5}\n",
			field: "steps[0].retry.limit", line: 5, msg: "!!int says a whole number, and 2.5 is not"},
		{name: "IntTagOnAQuotedNumber", input: "name: t\nsteps:\n  - {id: a, kind: noop, input: [!!int '5']}\n",
			field: "steps[0].input[0]", line: 3, msg: `!!int says a whole number, and '5' is not`},
		{name: "BoolTagOnAQuotedBool", input: "name: t\nsteps:\n  - {id: a, kind: noop, local: !!bool \"true\"}\n",
			field: "steps[0].local", line: 3, msg: `!!bool says true or false, and "true" is not`},
		{name: "IntTagOnAQuotedHex", input: "name: t\nversion: !!int \"0x1F\"\nsteps:\n  - {id: a, kind: noop}\n",
			field: "version", line: 2, msg: `!!int says a whole number, and "0x1F" is not`},
		{name: "IntTagOnATooLargeNumber", input: "name: t\nversion: !!int 99999999999999999999999\nsteps:\n  - {id: a, kind: noop}\n",
			field: "version", line: 2, msg: "must be at most 9007199254740991"},
		{name: "IntTagUnderATaggedParent", input: "!!map\nname: !!int t\nsteps: !!seq\n  - {id: a, kind: noop}\n",
			field: "name", line: 2, msg: "!!int says a whole number, and t is not"},
		{name: "BoolTagInATaggedList", input: "name: t\nsteps: !!seq\n  - {id: a, kind: noop, local: !!bool 1}\n",
			field: "steps[0].local", line: 3, msg: "!!bool says true or false, and 1 is not"},
		{name: "BoolTagOnANumber", input: "name: t\nsteps:\n  - {id: a, kind: noop, local: !!bool 1}\n",
			field: "steps[0].local", line: 3, msg: "!!bool says true or false, and 1 is not"},
		{name: "NaNForAVersion", input: "name: t\nversion: .nan\nsteps:\n  - {id: a, kind: noop}\n",
			field: "version", line: 2, msg: "must be a whole number, not .nan"},
		{name: "InfinityForALimit", input: "name: t\nsteps:\n  - {id: a, kind: noop, retry: {limit: .inf}}\n",
			field: "steps[0].retry.limit", line: 3, msg: "must be a whole number, not .inf"},
		{name: "MinusInfinityForALimit", input: "name: t\nsteps:\n  - {id: a, kind: noop, retry: {limit: -.Inf}}\n",
			field: "steps[0].retry.limit", line: 3, msg: "must be a whole number, not -.Inf"},
		{name: "OverflowForALimit", input: "name: t\nsteps:\n  - {id: a, kind: noop, retry: {limit: 99999999999999999999}}\n",
			field: "steps[0].retry.limit", line: 3, msg: "must be a whole number from -9223372036854775808 to 9223372036854775807, not 99999999999999999999"},
		{name: "OverflowByOne", input: "name: t\nsteps:\n  - {id: a, kind: noop, retry: {limit: 9223372036854775808}}\n",
			field: "steps[0].retry.limit", line: 3, msg: "must be a whole number from -9223372036854775808 to 9223372036854775807, not 9223372036854775808"},
		{name: "VersionOverflow", input: "name: t\nversion: 9223372036854775808\nsteps:\n  - {id: a, kind: noop}\n",
			field: "version", line: 2, msg: "must be at most 9007199254740991 (the largest whole number every JSON reader keeps exact), not 9223372036854775808"},
		{name: "VersionOverflowBelow", input: "name: t\nversion: -1" + strings.Repeat("0", 200) + "\nsteps:\n  - {id: a, kind: noop}\n",
			field: "version", line: 2, msg: "must be a positive version number (or absent, to let the registry number versions), not -1000000000000000000000000000000... (202 characters)"},
		{name: "OverflowAsAnExponent", input: "name: t\nsteps:\n  - {id: a, kind: noop, retry: {limit: 1e30}}\n",
			field: "steps[0].retry.limit", line: 3, msg: "from -9223372036854775808 to 9223372036854775807, not 1e30"},
		{name: "OverflowQuoted", input: "name: t\nsteps:\n  - {id: a, kind: noop, retry: {limit: \"-99999999999999999999\"}}\n",
			field: "steps[0].retry.limit", line: 3, msg: `not "-99999999999999999999"`},
		{name: "OverflowBeyondFloats", input: "name: t\nsteps:\n  - {id: a, kind: noop, retry: {limit: 1e400}}\n",
			field: "steps[0].retry.limit", line: 3, msg: "from -9223372036854775808 to 9223372036854775807, not 1e400"},
		{name: "OverflowInHex", input: "name: t\nsteps:\n  - {id: a, kind: noop, retry: {limit: 0xFFFFFFFFFFFFFFFFFF}}\n",
			field: "steps[0].retry.limit", line: 3, msg: "from -9223372036854775808 to 9223372036854775807, not 0xFFFFFFFFFFFFFFFFFF"},
		{name: "InfinityQuoted", input: "name: t\nsteps:\n  - {id: a, kind: noop, retry: {limit: 'inf'}}\n",
			field: "steps[0].retry.limit", line: 3, msg: `must be a whole number, not "inf"`},
		{name: "WholeBeyondAFloat", input: "name: t\nversion: 9223372036854775807.0\nsteps:\n  - {id: a, kind: noop}\n",
			field: "version", line: 2, msg: "must be a whole number written as one (9223372036854775807), not 9223372036854775807.0"},
		{name: "FractionTooSmallToSee", input: "name: t\nsteps:\n  - {id: a, kind: noop, retry: {limit: 1e-999999999}}\n",
			field: "steps[0].retry.limit", line: 3, msg: "must be a whole number, not 1e-999999999"},
		{name: "LongFraction", input: "name: t\nsteps:\n  - {id: a, kind: noop, retry: {limit: 2." + strings.Repeat("0", 200) + "1}}\n",
			field: "steps[0].retry.limit", line: 3, msg: "must be a whole number, not 2.000000000000000000000000000000... (203 characters)"},
		{name: "StringForAListDeep", input: "name: t\nsteps:\n  - id: a\n    kind: workflow\n    steps:\n      - id: b\n        kind: exec\n        args: x\n",
			field: "steps[0].steps[0].args", line: 8, msg: "must be a list, not a string"},
		{name: "SchemaUnknownType", input: "name: t\ninput:\n  type: banana\nsteps:\n  - id: a\n    kind: noop\n",
			field: "input.type", line: 3, msg: "value must be one of 'array', 'boolean'"},
		{name: "SchemaWrongKeywordType", input: "name: t\ninput:\n  type: object\n  properties:\n    a: {minLength: x}\nsteps:\n  - id: a\n    kind: noop\n",
			field: "input.properties.a.minLength", msg: "got string, want integer"},
		{name: "SchemaRefToAFile", input: "name: t\ninput:\n  $ref: /etc/passwd\nsteps:\n  - id: a\n    kind: noop\n",
			field: "input", msg: "refer only to itself"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := workflow.Parse([]byte(tt.input))
			var ve *workflow.ValidationError
			require.True(t, errors.As(err, &ve), "want a validation error, got %v", err)
			require.Len(t, ve.Problems, 1, "%v", ve.Problems)
			p := ve.Problems[0]
			require.Equal(t, tt.field, p.Field)
			require.Contains(t, p.Message, tt.msg)
			if tt.line > 0 {
				require.Equal(t, tt.line, p.Line)
			}
			for _, leak := range []string{"interface {}", "Go struct", "file://", "metaschema", "jsonschema", "\n", "/etc/passwd\""} {
				require.NotContains(t, err.Error(), leak)
			}
			require.Equal(t, err.Error(), strings.TrimSpace(err.Error()))
		})
	}
}

// TestCoreTags: the YAML core schema's tags on the values they describe
// change nothing (the decoder refused version: !!int 5, and took a
// definition tagged !!map for no mapping).
func TestCoreTags(t *testing.T) {
	t.Parallel()
	d, err := workflow.Parse([]byte("!!map\nname: !!str t\nversion: !!int 5\nsteps: !!seq\n  - {id: a, kind: noop, local: !!bool true, retry: {limit: !!float 3}}\n  - &b {id: b, kind: noop, retry: {limit: !!int &l 0x10}}\n"))
	require.NoError(t, err)
	require.Equal(t, "t", d.Name)
	require.Equal(t, 5, d.Version)
	require.Len(t, d.Steps, 2)
	require.True(t, d.Steps[0].Local)
	require.Equal(t, 3, d.Steps[0].Retry.Limit)
	require.Equal(t, 16, d.Steps[1].Retry.Limit)
}

// TestWholeNumbersWrittenOtherwise: a whole number in range is taken
// however YAML writes it (hex, an exponent, a fraction of zero), so the
// range check above refuses only what does not fit.
func TestWholeNumbersWrittenOtherwise(t *testing.T) {
	t.Parallel()
	for text, want := range map[string]int{"0x10": 16, "1e2": 100, "7.0": 7, "1000": 1000, "0o17": 15, "7." + strings.Repeat("0", 200): 7} {
		d, err := workflow.Parse([]byte("name: t\nsteps:\n  - {id: a, kind: noop, retry: {limit: " + text + "}}\n"))
		require.NoError(t, err, text)
		require.Equal(t, want, d.Steps[0].Retry.Limit, text)
	}
	// At the end of the versions' range, read exactly (0377... is YAML
	// 1.1 octal, as the parser reads it).
	for _, text := range []string{"0377777777777777777", "9007199254740991", "0x1FFFFFFFFFFFFF"} {
		d, err := workflow.Parse([]byte("name: t\nversion: " + text + "\nsteps:\n  - {id: a, kind: noop}\n"))
		require.NoError(t, err, text)
		require.Equal(t, workflow.MaxVersion, d.Version, text)
	}
	// At the end of the type's range: in it, so refused by the versions'
	// rule, not as out of range.
	for _, text := range []string{"0777777777777777777777", "9223372036854775807", "0x7FFFFFFFFFFFFFFF"} {
		_, err := workflow.Parse([]byte("name: t\nversion: " + text + "\nsteps:\n  - {id: a, kind: noop}\n"))
		require.ErrorContains(t, err, "field version: must be at most 9007199254740991 (the largest whole number every JSON reader keeps exact), not 9223372036854775807", text)
	}
}
