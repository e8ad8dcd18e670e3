package interp

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// TestScheduleKeepsSecretReferences: the input the dispatcher records for
// an operation keeps ${secret.NAME} as text (it never has a value to put
// there) and lists, by JSON pointer, the template of each field that
// references a secret; text from the input that looks like a reference is
// escaped in the templates and listed nowhere.
func TestScheduleKeepsSecretReferences(t *testing.T) {
	t.Parallel()

	def := workflow.Definition{Name: "deploy", Steps: []workflow.Step{
		{ID: "push", Kind: workflow.KindExec, Command: "sh", Args: []string{"-c", "echo $TOKEN", "${input.who}"},
			Env: map[string]string{"TOKEN": "${secret.TOKEN}", "WHO": "${input.who}", "A/B": "x-${secret.K}"}},
		{ID: "notify", Kind: workflow.KindHTTP, URL: "https://hooks.example.com/${secret.HOOK}",
			Headers: map[string]string{"Authorization": "Bearer ${secret.TOKEN} ${input.who}"},
			Body:    map[string]any{"text": "deployed by ${input.who}", "auth": map[string]any{"key": "${secret.K}"}}},
	}}
	steps := []events.StepRef{{ID: "push", Kind: workflow.KindExec}, {ID: "notify", Kind: workflow.KindHTTP}}
	start := &events.ExecutionStarted{Workflow: "deploy", Version: 1, Input: json.RawMessage(`{"who":"${secret.OTHER}"}`), Steps: steps, Token: "tok"}

	a := decide(def, foldPayloads(t, start))
	require.Equal(t, actSchedule, a.kind)
	var spec workflow.Step
	require.NoError(t, json.Unmarshal(a.input, &spec))
	require.Equal(t, "${secret.TOKEN}", spec.Env["TOKEN"])
	require.Equal(t, "${secret.OTHER}", spec.Env["WHO"], "the input's text is kept as it is in the fields")
	require.Equal(t, []string{"-c", "echo $TOKEN", "${secret.OTHER}"}, spec.Args)
	require.Equal(t, map[string]string{"/env/TOKEN": "${secret.TOKEN}", "/env/A~1B": "x-${secret.K}"}, spec.SecretRefs,
		"only the definition's references are templates")

	a = decide(def, foldPayloads(t, concat([]events.Payload{start}, through("push", projections.OpSucceeded))...))
	require.Equal(t, actSchedule, a.kind)
	require.Equal(t, "notify", a.step.ID)
	spec = workflow.Step{}
	require.NoError(t, json.Unmarshal(a.input, &spec))
	require.Equal(t, "https://hooks.example.com/${secret.HOOK}", spec.URL)
	require.Equal(t, map[string]any{"text": "deployed by ${secret.OTHER}", "auth": map[string]any{"key": "${secret.K}"}}, spec.Body)
	require.Equal(t, map[string]string{
		"/url":                   "https://hooks.example.com/${secret.HOOK}",
		"/headers/Authorization": "Bearer ${secret.TOKEN} $${secret.OTHER}",
		"/body/auth/key":         "${secret.K}",
	}, spec.SecretRefs)
	require.NotContains(t, spec.SecretRefs, "/body/text")
}
