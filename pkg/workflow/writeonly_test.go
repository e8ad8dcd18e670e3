package workflow_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/workflow"
)

// TestWriteOnlyPaths: the members an input schema marks writeOnly, found
// through the keywords that nest schemas, as paths with * for any member.
func TestWriteOnlyPaths(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name   string
		schema []string
		want   [][]string
	}{
		{"None", []string{"  type: object", "  properties: {a: {type: string}}"}, nil},
		{"Property", []string{"  type: object", "  properties:", "    user: {type: string}", "    password: {type: string, writeOnly: true}"},
			[][]string{{"password"}}},
		{"WholeInput", []string{"  type: object", "  writeOnly: true"}, [][]string{{}}},
		{"Nested", []string{"  properties:", "    db:", "      properties:", "        pass: {writeOnly: true}", "        host: {type: string}"},
			[][]string{{"db", "pass"}}},
		{"FalseIsNotWriteOnly", []string{"  properties:", "    a: {writeOnly: false}"}, nil},
		{"Items", []string{"  properties:", "    keys: {type: array, items: {writeOnly: true}}"}, [][]string{{"keys", "*"}}},
		{"ItemMember", []string{"  properties:", "    users:", "      items:", "        properties: {token: {writeOnly: true}}"},
			[][]string{{"users", "*", "token"}}},
		{"AdditionalProperties", []string{"  properties:", "    tokens: {additionalProperties: {writeOnly: true}}"}, [][]string{{"tokens", "*"}}},
		{"PatternProperties", []string{"  patternProperties:", "    '^key_': {writeOnly: true}"}, [][]string{{"*"}}},
		{"AllOf", []string{"  allOf:", "    - properties: {a: {writeOnly: true}}", "    - properties: {b: {writeOnly: true}}"},
			[][]string{{"a"}, {"b"}}},
		{"IfThenElse", []string{"  if: {properties: {kind: {const: db}}}", "  then: {properties: {pw: {writeOnly: true}}}"},
			[][]string{{"pw"}}},
		{"Ref", []string{"  properties:", `    main: {$ref: "#/$defs/cred"}`, `    backup: {$ref: "#/$defs/cred"}`,
			"  $defs:", "    cred:", "      properties: {secret: {writeOnly: true}}"},
			[][]string{{"backup", "secret"}, {"main", "secret"}}},
		{"RecursiveRef", []string{"  properties:", "    pw: {writeOnly: true}", `    child: {$ref: "#"}`},
			nil}, // checked below: bounded, and finds pw at every level it walks
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d, err := workflow.Parse([]byte(schemaDefinition(tc.schema)))
			require.NoError(t, err)
			got := d.WriteOnlyPaths()
			if tc.name == "RecursiveRef" {
				require.Contains(t, got, []string{"pw"})
				require.Contains(t, got, []string{"child", "pw"})
				return
			}
			require.Equal(t, tc.want, got)
		})
	}
}
