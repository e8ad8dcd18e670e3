package workflow_test

import (
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/workflow"
)

// schemaErrorCases are input schemas refused when the definition is
// applied, with a text that the message must hold to say why.
var schemaErrorCases = []struct {
	name   string
	schema []string // the lines under input:, from line 3
	field  string   // the schema keyword at fault, as a field path
	line   int
	cause  string
}{
	{"UnknownType", []string{"  type: objet"}, "input.type", 3, "value must be one of 'array', 'boolean'"},
	{"NestedTypeNotAString", []string{"  type: object", "  properties:", "    x: {type: 3}"}, "input.properties.x.type", 5, "value must be one of"},
	{"BadPattern", []string{"  type: object", "  properties:", `    day: {type: string, pattern: "[0-9"}`}, "input.properties.day.pattern", 5, "missing closing ]"},
	{"NegativeMinLength", []string{"  minLength: -1"}, "input.minLength", 3, "minimum: got -1, want 0"},
	{"RefToNowhere", []string{`  $ref: "#/$defs/nope"`}, "input", 3, `"#/$defs/nope" not found`},
	{"Draft7RequiredNotAList", []string{"  $schema: http://json-schema.org/draft-07/schema#", "  required: name"}, "input.required", 4, "got string, want array"},
	{"UnknownMetaschema", []string{"  $schema: https://example.com/my-meta"}, "input", 3, "not to https://example.com/my-meta"},
	{"RefToAFile", []string{"  $ref: /etc/hostname"}, "input", 3, "refer only to itself"},
}

func schemaDefinition(schema []string) string {
	return yml(append(append([]string{"name: wf", "input:"}, schema...), "steps:", "  - {id: a, kind: noop}")...)
}

// TestInputSchemaErrors: an input schema that does not compile is refused
// when the definition is applied, as one problem on one line that names
// the input field and its line.
func TestInputSchemaErrors(t *testing.T) {
	t.Parallel()

	for _, tc := range schemaErrorCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			_, err := workflow.Parse([]byte(schemaDefinition(tc.schema)))
			require.ErrorIs(t, err, workflow.ErrInvalid)
			var ve *workflow.ValidationError
			require.ErrorAs(t, err, &ve)
			require.Len(t, ve.Problems, 1)
			p := ve.Problems[0]
			require.Equal(t, tc.field, p.Field)
			require.Equal(t, tc.line, p.Line, "the line of the keyword at fault")
			require.Contains(t, p.Message, tc.cause)
			require.NotContains(t, err.Error(), "\n")
		})
	}
}

// TestInputSchemaErrorsHideServerDetails is what a user applying a
// definition should see: the problem, not where the server runs nor the
// whole metaschema check.
func TestInputSchemaErrorsHideServerDetails(t *testing.T) {
	t.Parallel()

	wd, err := os.Getwd()
	require.NoError(t, err)
	for _, tc := range schemaErrorCases {
		_, err := workflow.Parse([]byte(schemaDefinition(tc.schema)))
		require.Error(t, err)
		msg := err.Error()
		require.NotContains(t, msg, wd, tc.name)
		require.NotContains(t, msg, "file://", tc.name)
		require.NotContains(t, msg, "metaschema", tc.name)
		require.NotContains(t, msg, "'allOf' failed", tc.name)
	}
}

func TestCheckInput(t *testing.T) {
	t.Parallel()

	d, err := workflow.Parse([]byte(yml(
		"name: report",
		"input:",
		"  type: object",
		"  required: [date]",
		"  additionalProperties: false",
		"  properties:",
		`    date: {type: string, pattern: "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}`,
		"    hosts: {type: array, items: {type: string}}",
		"    format: {enum: [pdf, html]}",
		"steps:",
		"  - {id: a, kind: noop}",
	)))
	require.NoError(t, err)

	tests := []struct {
		name  string
		input string
		want  []workflow.FieldError
	}{
		{"Valid", `{"date":"2026-01-01","hosts":["a","b"],"format":"pdf"}`, nil},
		{"NoInputIsAnEmptyObject", ``, []workflow.FieldError{{Field: "input.date", Message: "is required"}}},
		{"NullIsAnEmptyObject", `null`, []workflow.FieldError{{Field: "input.date", Message: "is required"}}},
		{"BlankIsAnEmptyObject", " \n", []workflow.FieldError{{Field: "input.date", Message: "is required"}}},
		{"WrongType", `{"date":5}`, []workflow.FieldError{{Field: "input.date", Message: "got number, want string"}}},
		{"ListItemNamedByIndex", `{"date":"2026-01-01","hosts":["a",3]}`, []workflow.FieldError{{Field: "input.hosts.1", Message: "got number, want string"}}},
		{"NotInTheEnum", `{"date":"2026-01-01","format":"doc"}`, []workflow.FieldError{{Field: "input.format", Message: "value must be one of 'pdf', 'html'"}}},
		{"EveryProblem", `{"date":"x","extra":1}`, []workflow.FieldError{
			{Field: "input", Message: "additional properties 'extra' not allowed"},
			{Field: "input.date", Message: "'x' does not match pattern '^[0-9]{4}-[0-9]{2}-[0-9]{2}$'"},
		}},
		// Sorted by field: the schema library's order varies between runs.
		{"SortedByField", `{"hosts":[1],"format":"doc","date":5}`, []workflow.FieldError{
			{Field: "input.date", Message: "got number, want string"},
			{Field: "input.format", Message: "value must be one of 'pdf', 'html'"},
			{Field: "input.hosts.0", Message: "got number, want string"},
		}},
		{"NotAnObject", `[1]`, []workflow.FieldError{{Field: "input", Message: "got array, want object"}}},
		{"NotJSON", `{`, []workflow.FieldError{{Field: "input", Message: "is not valid JSON: unexpected EOF"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			for range 20 { // the same every time
				require.Equal(t, tc.want, d.CheckInput(json.RawMessage(tc.input)))
			}
		})
	}

	t.Run("EachMissingMemberNamed", func(t *testing.T) {
		t.Parallel()

		nested := workflow.Definition{Name: "wf", Input: map[string]any{
			"type": "object", "required": []any{"who", "where"},
			"properties": map[string]any{"where": map[string]any{"type": "object", "required": []any{"host"}}},
		}}
		require.Equal(t, []workflow.FieldError{{Field: "input.where", Message: "is required"}, {Field: "input.who", Message: "is required"}},
			nested.CheckInput(json.RawMessage(`{}`)))
		require.Equal(t, []workflow.FieldError{{Field: "input.where.host", Message: "is required"}},
			nested.CheckInput(json.RawMessage(`{"who":"ada","where":{}}`)))
	})

	t.Run("MembersNamedAsWritten", func(t *testing.T) {
		t.Parallel()

		odd := workflow.Definition{Name: "wf", Input: map[string]any{
			"type": "object", "required": []any{"a/b"},
			"properties": map[string]any{"a/b": map[string]any{"type": "object", "properties": map[string]any{"c~d": map[string]any{"type": "string"}}}},
		}}
		require.Equal(t, []workflow.FieldError{{Field: "input.a/b.c~d", Message: "got number, want string"}},
			odd.CheckInput(json.RawMessage(`{"a/b":{"c~d":1}}`)), "a member's name, not its JSON pointer escape")
		require.Equal(t, []workflow.FieldError{{Field: "input.a/b", Message: "is required"}}, odd.CheckInput(json.RawMessage(`{}`)))
	})

	t.Run("ProblemsUnderARefNamed", func(t *testing.T) {
		t.Parallel()

		// The schema library words what is wrong under a $ref as
		// "validation failed" at the $ref, not what and where.
		refd := workflow.Definition{Name: "wf", Input: map[string]any{
			"type": "object", "required": []any{"who"},
			"properties": map[string]any{"who": map[string]any{"$ref": "#/$defs/person"}},
			"$defs": map[string]any{"person": map[string]any{
				"type": "object", "required": []any{"name"},
				"properties": map[string]any{"name": map[string]any{"type": "string"}, "age": map[string]any{"type": "integer"}},
			}},
		}}
		require.Equal(t, []workflow.FieldError{{Field: "input.who.name", Message: "is required"}},
			refd.CheckInput(json.RawMessage(`{"who":{}}`)))
		require.Equal(t, []workflow.FieldError{
			{Field: "input.who.age", Message: "got string, want integer"},
			{Field: "input.who.name", Message: "got number, want string"},
		}, refd.CheckInput(json.RawMessage(`{"who":{"name":1,"age":"x"}}`)))
		require.Nil(t, refd.CheckInput(json.RawMessage(`{"who":{"name":"ada","age":36}}`)))
	})

	t.Run("AlternativesOneProblem", func(t *testing.T) {
		t.Parallel()

		// An anyOf's, a oneOf's failure is one problem naming every way
		// out, not a list of problems that read as all to be fixed; a
		// contains says why no item matched.
		alt := workflow.Definition{Name: "wf", Input: map[string]any{
			"type": "object",
			"properties": map[string]any{
				"n": map[string]any{"anyOf": []any{map[string]any{"type": "integer"}, map[string]any{"type": "string"}}},
				"a": map[string]any{"anyOf": []any{
					map[string]any{"type": "object", "required": []any{"x"}},
					map[string]any{"type": "object", "required": []any{"y"}},
				}},
				"o": map[string]any{"oneOf": []any{map[string]any{"type": "integer"}, map[string]any{"$ref": "#/$defs/id"}}},
				"l": map[string]any{"type": "array", "contains": map[string]any{"type": "string"}},
			},
			"$defs": map[string]any{"id": map[string]any{"type": "object", "required": []any{"id"}}},
		}}
		require.Equal(t, []workflow.FieldError{
			{Field: "input.a", Message: "'anyOf' failed: x is required; or y is required"},
			{Field: "input.l", Message: "no items match contains schema: 0: got number, want string; 1: got number, want string"},
			{Field: "input.n", Message: "'anyOf' failed: got boolean, want integer; or got boolean, want string"},
			{Field: "input.o", Message: "'oneOf' failed, none matched: got object, want integer; or id is required"},
		}, alt.CheckInput(json.RawMessage(`{"n":true,"a":{},"o":{},"l":[1,2]}`)))
		require.Nil(t, alt.CheckInput(json.RawMessage(`{"n":1,"a":{"y":1},"o":{"id":1},"l":[1,"s"]}`)))
	})

	t.Run("AlternativesSaidTheSameEachTimeAndBounded", func(t *testing.T) {
		t.Parallel()

		// A branch's problems come from the schema library in the order
		// of a map's keys; alternatives within alternatives, spelt out
		// whole, grow with the product of their branches.
		var sch map[string]any
		require.NoError(t, json.Unmarshal([]byte(`{"type":"object","properties":{
			"p":{"anyOf":[{"type":"string"},{"$ref":"#/$defs/x"}]},
			"n":{"$ref":"#/$defs/n"}},
			"$defs":{
			"x":{"type":"object","required":["id","name"],"properties":{"age":{"type":"integer"},"tag":{"type":"string"}}},
			"n":{"anyOf":[{"type":"integer"},
				{"type":"object","properties":{"c":{"$ref":"#/$defs/n"}},"required":["c"]},
				{"type":"object","properties":{"c":{"$ref":"#/$defs/n"}},"required":["d"]}]}}}`), &sch))
		nested := workflow.Definition{Name: "wf", Input: sch}
		deep := `"x"`
		for range 8 {
			deep = `{"c":` + deep + `}`
		}
		in := json.RawMessage(`{"p":{"age":"a","tag":1},"n":` + deep + `}`)
		want := []workflow.FieldError{
			{Field: "input.n", Message: "'anyOf' failed: got object, want integer; or c: 'anyOf' failed; or c: 'anyOf' failed and d is required"},
			{Field: "input.p", Message: "'anyOf' failed: got object, want string; or age: got string, want integer and id is required and name is required and tag: got number, want string"},
		}
		for range 20 {
			require.Equal(t, want, nested.CheckInput(in))
		}

		// Each cause of a contains is an item: a long list is cut.
		list := workflow.Definition{Name: "wf", Input: map[string]any{
			"type": "object", "properties": map[string]any{"l": map[string]any{"type": "array", "contains": map[string]any{"type": "string"}}},
		}}
		items := strings.TrimSuffix(strings.Repeat("1,", 500), ",")
		got := list.CheckInput(json.RawMessage(`{"l":[` + items + `]}`))
		require.Len(t, got, 1)
		require.LessOrEqual(t, len(got[0].Message), 1024+len(" …"))
		require.True(t, strings.HasPrefix(got[0].Message, "no items match contains schema: 0: got number, want string; 1: "), got[0].Message)
		require.True(t, strings.HasSuffix(got[0].Message, " …"), got[0].Message)
	})

	t.Run("NoSchemaTakesAnything", func(t *testing.T) {
		t.Parallel()

		none := workflow.Definition{Name: "wf"}
		for _, in := range []string{``, `{`, `[1]`, `{"x":1}`} {
			require.Nil(t, none.CheckInput(json.RawMessage(in)), in)
		}
	})

	t.Run("InvalidSchemaBuiltInGo", func(t *testing.T) {
		t.Parallel()

		bad := workflow.Definition{Name: "wf", Input: map[string]any{"type": "objet"}}
		problems := bad.CheckInput(json.RawMessage(`{}`))
		require.Len(t, problems, 1)
		require.Equal(t, "input", problems[0].Field)
		require.True(t, strings.HasPrefix(problems[0].Message, "the workflow's input schema is invalid: "), problems[0].Message)
		require.NotContains(t, problems[0].Message, "\n")
	})

	t.Run("SchemaNotEncodable", func(t *testing.T) {
		t.Parallel()

		bad := workflow.Definition{Name: "wf", Input: map[string]any{"f": func() {}}}
		problems := bad.CheckInput(json.RawMessage(`{}`))
		require.Len(t, problems, 1)
		require.Equal(t, "input", problems[0].Field)
		require.Contains(t, problems[0].Message, "unsupported type")
	})
}

// TestInputSchemaReadsNoFiles: a definition comes from a user, over the
// api, and is compiled by the api and by every dispatcher: a $ref or
// $schema naming a file must not make them read their own disks.
func TestInputSchemaReadsNoFiles(t *testing.T) {
	t.Parallel()

	dir := t.TempDir()
	path := filepath.Join(dir, "string.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"type": "string"}`), 0o600))
	meta := filepath.Join(dir, "meta.json")
	require.NoError(t, os.WriteFile(meta, []byte(`{"$schema": "https://json-schema.org/draft/2020-12/schema"}`), 0o600))
	fileURL := (&url.URL{Scheme: "file", Path: path}).String()

	tests := []struct {
		name   string
		schema map[string]any
	}{
		{"RefToAPath", map[string]any{"$ref": path}},
		{"RefToAFileURL", map[string]any{"$ref": fileURL}},
		{"NestedRef", map[string]any{"type": "object", "properties": map[string]any{"x": map[string]any{"$ref": fileURL}}}},
		{"SchemaFromAFile", map[string]any{"$schema": (&url.URL{Scheme: "file", Path: meta}).String()}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			b, err := json.Marshal(map[string]any{"name": "wf", "input": tc.schema, "steps": []any{map[string]any{"id": "a", "kind": "noop"}}})
			require.NoError(t, err)
			_, err = workflow.Parse(b)
			var ve *workflow.ValidationError
			require.ErrorAs(t, err, &ve, "the schema was compiled from the file")
			require.Len(t, ve.Problems, 1)
			require.Equal(t, "input", ve.Problems[0].Field)
			require.True(t, strings.HasPrefix(ve.Problems[0].Message, "is not a valid JSON Schema: "), ve.Problems[0].Message)

			d := workflow.Definition{Name: "wf", Input: tc.schema}
			problems := d.CheckInput(json.RawMessage(`"a string"`))
			require.Len(t, problems, 1, "the input was checked against the file")
			require.Equal(t, "input", problems[0].Field)
			require.True(t, strings.HasPrefix(problems[0].Message, "the workflow's input schema is invalid: "), problems[0].Message)
		})
	}
}
