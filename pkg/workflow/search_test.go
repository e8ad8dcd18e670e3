package workflow_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/workflow"
)

func TestSearchAttributesAreParsed(t *testing.T) {
	t.Parallel()
	d, err := workflow.Parse([]byte(yml(
		"name: wf",
		"input:",
		"  type: object",
		"  properties:",
		"    customer: {type: string}",
		"search_attributes: [input.customer, vars.tier]",
		"steps:",
		"  - {id: a, kind: let, vars: {tier: gold}}",
	)))
	require.NoError(t, err)
	require.Equal(t, []workflow.SearchAttribute{{Name: "customer", From: workflow.SearchFromInput}, {Name: "tier", From: workflow.SearchFromVars}},
		d.SearchAttributeList())
	none, err := workflow.Parse([]byte(wf("  - {id: a, kind: noop}")))
	require.NoError(t, err)
	require.Empty(t, none.SearchAttributeList())
}

func TestSearchAttributeProblems(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		input string
		want  []problem
	}{
		{
			name:  "NotInputOrVars",
			input: yml("name: wf", "search_attributes: [steps.a.output, input, input.a.b, vars.1x]", "steps:", "  - {id: a, kind: noop}"),
			want: []problem{
				{"search_attributes[0]", 2, `"steps.a.output" names no input member or variable: write input.<member> or vars.<variable> (a top-level one: a letter or _, then letters, digits or _, at most 64)`},
				{"search_attributes[1]", 2, `"input" names no input member or variable: write input.<member> or vars.<variable> (a top-level one: a letter or _, then letters, digits or _, at most 64)`},
				{"search_attributes[2]", 2, `"input.a.b" names no input member or variable: write input.<member> or vars.<variable> (a top-level one: a letter or _, then letters, digits or _, at most 64)`},
				{"search_attributes[3]", 2, `"vars.1x" names no input member or variable: write input.<member> or vars.<variable> (a top-level one: a letter or _, then letters, digits or _, at most 64)`},
			},
		},
		{
			name:  "NamedTwice",
			input: yml("name: wf", "search_attributes: [input.customer, vars.customer]", "steps:", "  - {id: a, kind: noop}"),
			want: []problem{{"search_attributes[1]", 2,
				"attribute customer is named twice (search_attributes[0] too): an attribute is called by its member's or variable's name, which must be unique"}},
		},
		{
			name: "WriteOnlyInput",
			input: yml("name: wf", "input:", "  type: object", "  properties:", "    password: {type: string, writeOnly: true}",
				"search_attributes: [input.password]", "steps:", "  - {id: a, kind: noop}"),
			want: []problem{{"search_attributes[0]", 6,
				"input.password is writeOnly in the input schema: read models show it redacted, so there is no value to search by"}},
		},
		{
			name: "NoSuchMember",
			input: yml("name: wf", "input:", "  type: object", "  additionalProperties: false", "  properties:", "    customer: {type: string}",
				"search_attributes: [input.custmer]", "steps:", "  - {id: a, kind: noop}"),
			want: []problem{{"search_attributes[0]", 7, "input.custmer is not a member the input schema allows (it lists [customer] and no others)"}},
		},
		{
			name: "TooMany",
			input: yml("name: wf", "search_attributes: [vars.a, vars.b, vars.c, vars.d, vars.e, vars.f, vars.g, vars.h, vars.i,"+
				" vars.j, vars.k, vars.l, vars.m, vars.n, vars.o, vars.p, vars.q]", "steps:", "  - {id: a, kind: noop}"),
			want: []problem{{"search_attributes", 2, "at most 16 search attributes, not 17: each is indexed for every execution"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := workflow.Parse([]byte(tc.input))
			var ve *workflow.ValidationError
			require.ErrorAs(t, err, &ve)
			got := make([]problem, len(ve.Problems))
			for i, p := range ve.Problems {
				got[i] = problem{p.Field, p.Line, p.Message}
			}
			require.Equal(t, tc.want, got)
		})
	}
}

// TestSearchAttributesOfAnOpenSchema: a member the schema does not list
// is fine when the schema allows others.
func TestSearchAttributesOfAnOpenSchema(t *testing.T) {
	t.Parallel()
	_, err := workflow.Parse([]byte(yml("name: wf", "input:", "  type: object", "  properties:", "    customer: {type: string}",
		"search_attributes: [input.region]", "steps:", "  - {id: a, kind: noop}")))
	require.NoError(t, err)
}
