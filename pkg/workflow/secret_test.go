package workflow_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/workflow"
)

// TestSecretReferences: ${secret.NAME} is accepted in the fields an agent
// receives (exec args, env and dir; http url, headers and body; call
// input) and refused, with the field and the reason, everywhere the
// dispatcher evaluates, in an expression, or with a bad name.
func TestSecretReferences(t *testing.T) {
	t.Parallel()

	ok := []struct{ name, step string }{
		{"ExecArgs", `{id: a, kind: exec, command: sh, args: ["-c", "x ${secret.A}"]}`},
		{"ExecEnv", `{id: a, kind: exec, command: sh, env: {T: "${secret.api-key}"}}`},
		{"ExecDir", `{id: a, kind: exec, command: ls, dir: "/srv/${secret.D}"}`},
		{"HTTPURL", `{id: a, kind: http, url: "https://example.com/?key=${secret.K}"}`},
		{"HTTPHeader", `{id: a, kind: http, url: "https://example.com", headers: {Authorization: "Bearer ${secret.T}"}}`},
		{"HTTPBody", `{id: a, kind: http, url: "https://example.com", body: {auth: {token: "${secret.T}"}}}`},
		{"CallInput", `{id: a, kind: call, operation: op, input: {password: "${secret.P}", list: ["${secret.Q}"]}}`},
	}
	for _, tc := range ok {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := workflow.Parse([]byte(yml("name: wf", "steps:", "  - "+tc.step)))
			require.NoError(t, err)
		})
	}

	bad := []struct{ name, step, field, msg string }{
		{"ExecCommand", `{id: a, kind: exec, command: "${secret.C}"}`, "steps[0].command", "can be referenced only in the fields of an operation"},
		{"LogMessage", `{id: a, kind: log, message: "${secret.M}"}`, "steps[0].message", "can be referenced only"},
		{"HTTPMethod", `{id: a, kind: http, method: "${secret.M}", url: "https://example.com"}`, "steps[0].method", "can be referenced only"},
		{"Let", `{id: a, kind: let, vars: {x: "${secret.X}"}}`, "steps[0].vars.x", "can be referenced only"},
		{"Condition", `{id: a, kind: noop, condition: "${secret.X == 'a'}"}`, "steps[0].condition", "can be referenced only"},
		{"Output", `{id: a, kind: noop, output: "${secret.X}"}`, "steps[0].output", "can be referenced only"},
		{"FailMessage", `{id: a, kind: fail, message: "${secret.X}"}`, "steps[0].message", "can be referenced only"},
		{"InAnExpression", `{id: a, kind: exec, command: sh, args: ["${'x' + secret.A}"]}`, "steps[0].args[0]", "cannot be part of an expression"},
		{"BadName", `{id: a, kind: exec, command: sh, env: {T: "${secret.a.b}"}}`, "steps[0].env.T", "letters, digits"},
		{"SecretRefsField", `{id: a, kind: noop, secret_refs: {"/x": "y"}}`, "steps[0].secret_refs", `unknown field "secret_refs"`},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := workflow.Parse([]byte(yml("name: wf", "steps:", "  - "+tc.step)))
			var ve *workflow.ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, tc.field, ve.Problems[0].Field, "%v", err)
			require.Contains(t, ve.Problems[0].Message, tc.msg)
		})
	}

	// A definition built in Go cannot carry the dispatcher's field either.
	d := workflow.Definition{Name: "wf", Steps: []workflow.Step{{ID: "a", Kind: workflow.KindNoop, SecretRefs: map[string]string{"/x": "y"}}}}
	require.ErrorContains(t, d.Validate(), "steps[0].secret_refs")
}
