package api

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEveryRouteIsDocumented: docs/api.md's endpoint table lists every
// route the api serves, and no route it does not.
func TestEveryRouteIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../../docs/api.md")
	require.NoError(t, err)
	documented := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		// Rows of the endpoint table: | `METHOD /path` | what |
		if rest, ok := strings.CutPrefix(line, "| `"); ok {
			if pattern, _, ok := strings.Cut(rest, "` |"); ok && strings.Contains(pattern, " /") {
				documented[pattern] = true
			}
		}
	}
	served := map[string]bool{}
	for _, rt := range (&Server{}).routes() {
		served[rt.pattern] = true
		require.True(t, documented[rt.pattern], "docs/api.md's endpoint table does not list %s", rt.pattern)
	}
	for pattern := range documented {
		require.True(t, served[pattern], "docs/api.md lists %s, which the api does not serve", pattern)
	}
}
