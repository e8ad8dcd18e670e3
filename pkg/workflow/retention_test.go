package workflow_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/retention"
	"jetflow.dev/pkg/workflow"
)

func TestParseRetention(t *testing.T) {
	t.Parallel()
	d, err := workflow.Parse([]byte(`name: provision
retention: max(context, 6h)
steps:
  - id: approve
    kind: noop
  - id: keep-all
    kind: workflow
    retention: forever
  - id: failing
    kind: fail
    message: denied
    retention: forever hash ${workflow.name} failed
    condition: ${input.deny == true}
  - id: count
    kind: noop
    retention: 5
`))
	require.NoError(t, err)
	require.Equal(t, workflow.Retention("max(context, 6h)"), d.Retention)
	require.Equal(t, workflow.Retention("forever"), d.Steps[1].Retention)
	require.Equal(t, workflow.Retention("forever hash ${workflow.name} failed"), d.Steps[2].Retention)
	require.Equal(t, workflow.Retention("5"), d.Steps[3].Retention, "a YAML number is kept as its text")

	// The pinned (canonical JSON) form reads back the same.
	b, err := d.Canonical()
	require.NoError(t, err)
	again, err := workflow.Parse(b)
	require.NoError(t, err)
	require.Equal(t, d, again)
}

func TestParseRetentionErrors(t *testing.T) {
	t.Parallel()
	const steps = "steps:\n  - id: a\n    kind: noop\n"
	tests := []struct {
		name, input, field string
		line               int
		msg                string
	}{
		{"Unknown", "name: wf\nretention: sometimes\n" + steps, "retention", 2, `"sometimes" is not a retention rule: unknown value "sometimes"`},
		{"Negative", "name: wf\nretention: -3\n" + steps, "retention", 2, `"-3" is negative`},
		{"Unclosed", "name: wf\nretention: max(5, 24h\n" + steps, "retention", 2, "missing its closing parenthesis"},
		{"DisabledInMax", "name: wf\nretention: min(disabled, 3)\n" + steps, "retention", 2, "disabled cannot be an argument of min or max"},
		{"HashWithoutKey", "name: wf\nretention: 2 hash\n" + steps, "retention", 2, "hash needs a key"},
		{"HashBadExpression", "name: wf\nretention: 2 hash ${nothing.here}\n" + steps, "retention", 2, "hash expression"},
		{"List", "name: wf\nretention: [1, 2]\n" + steps, "retention", 2, "is not a retention rule"},
		{"Bool", "name: wf\nretention: true\n" + steps, "retention", 2, `unknown value "true"`},
		{"Step", "name: wf\nsteps:\n  - id: a\n    kind: noop\n  - id: b\n    kind: log\n    message: hi\n    retention: 3 days\n",
			"steps[1].retention", 8, `unexpected "days" after 3`},
		{"NestedStep", "name: wf\nsteps:\n  - id: blk\n    kind: workflow\n    steps:\n      - id: in\n        kind: noop\n        retention: max(\n",
			"steps[0].steps[0].retention", 8, "a value is missing"},
		{"WorkflowStepWithNothing", "name: wf\nsteps:\n  - id: blk\n    kind: workflow\n", "steps[0].steps", 3, "steps (a block), workflow (another workflow's name) or retention"},
	}
	t.Run("HashTwoBadExpressions", func(t *testing.T) { // one problem each
		t.Parallel()
		_, err := workflow.Parse([]byte("name: wf\nretention: 2 hash ${inptu}-${nope}\n" + steps))
		var ve *workflow.ValidationError
		require.ErrorAs(t, err, &ve)
		require.Len(t, ve.Problems, 2, "%v", ve.Problems)
		require.Contains(t, ve.Problems[0].Message, "hash expression ${inptu}: unknown name inptu")
		require.Contains(t, ve.Problems[1].Message, "hash expression ${nope}: unknown name nope")
	})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := workflow.Parse([]byte(tt.input))
			require.ErrorIs(t, err, workflow.ErrInvalid)
			var ve *workflow.ValidationError
			require.ErrorAs(t, err, &ve)
			var found *workflow.FieldError
			for i, p := range ve.Problems {
				if p.Field == tt.field && strings.Contains(p.Message, tt.msg) {
					found = &ve.Problems[i]
				}
			}
			require.NotNil(t, found, "no problem with field %q and message %q in %v", tt.field, tt.msg, ve.Problems)
			require.Equal(t, tt.line, found.Line, "line of %v", *found)
			require.Contains(t, err.Error(), "field "+tt.field)
		})
	}
}

// TestResolveRetention: a retention: field in the context of the rule and
// group in force before it.
func TestResolveRetention(t *testing.T) {
	t.Parallel()
	prev, err := retention.ParseRule("min(forever, 3)")
	require.NoError(t, err)
	env := func() map[string]any { return map[string]any{"input": map[string]any{"team": "ops", "blank": " "}} }
	for _, c := range []struct {
		name, field string
		want        *events.Retention
		err         string
	}{
		{"RuleKeepsGroup", "5", &events.Retention{Rule: "5", Key: "before"}, ""},
		{"ContextIsThePrevious", "max(context, 6h)", &events.Retention{Rule: "max(min(forever, 3), 6h)", Key: "before"}, ""},
		{"HashOnlyKeepsRule", "hash ${input.team}-runs", &events.Retention{Rule: "min(forever, 3)", Key: "ops-runs"}, ""},
		{"HashEmpty", "2 hash ${input.blank}", nil, `retention hash "${input.blank}" gives an empty key`},
		{"HashFails", "2 hash ${input.team.x.y}", nil, "retention hash: "},
		{"Invalid", "sometimes", nil, "retention: "},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got, err := workflow.Retention(c.field).Resolve(prev, "before", env)
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				require.Nil(t, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
	_, err = workflow.Retention("sometimes").Resolve(prev, "", env)
	require.ErrorIs(t, err, retention.ErrInvalid)
}
