package dispatch

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/workflow"
)

// TestStartsKeepEachVersionTheyAreCheckedAgainst: a version is read and
// prepared once, and the one kept serves the next starts; another
// version is another definition; a version not registered is not found
// and nothing is kept for it.
func TestStartsKeepEachVersionTheyAreCheckedAgainst(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	defs, err := catalog.Open(t.Context(), js)
	require.NoError(t, err)
	apply := func(message string) {
		t.Helper()
		_, _, err := defs.Apply(t.Context(), workflow.Definition{Name: "greet", Steps: []workflow.Step{
			{ID: "hello", Kind: workflow.KindLog, Message: message}}})
		require.NoError(t, err)
	}
	apply("one")
	starts := newStartDefs(maxPinnedDefs)
	first, err := starts.get(t.Context(), defs, "greet", 1)
	require.NoError(t, err)
	require.Equal(t, "one", first.Spec.Steps[0].Message)
	again, err := starts.get(t.Context(), defs, "greet", 1)
	require.NoError(t, err)
	require.Same(t, first, again, "kept")

	apply("two")
	second, err := starts.get(t.Context(), defs, "greet", 2)
	require.NoError(t, err)
	require.Equal(t, "two", second.Spec.Steps[0].Message)
	require.NotSame(t, first, second)

	_, err = starts.get(t.Context(), defs, "greet", 3)
	require.ErrorIs(t, err, catalog.ErrNotFound)
	starts.mu.Lock()
	defer starts.mu.Unlock()
	require.Equal(t, 2, starts.defs.len(), "nothing kept for a version not registered")
}
