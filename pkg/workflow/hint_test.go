package workflow_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/workflow"
)

func TestSyntaxErrorsHintAtTheCause(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ input, hint string }{
		"Indentation": {"name: wf\nsteps:\n  - id: a\n   kind: noop\n", "indentation"},
		"Tab":         {"name: wf\nsteps:\n\t- id: a\n", "not tabs"},
	} {
		_, err := workflow.Parse([]byte(tc.input))
		require.Error(t, err, name)
		require.Contains(t, err.Error(), tc.hint, name)
	}
}
