package api

import (
	"cmp"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestEveryRouteIsDocumented: docs/api.md's endpoint table lists every
// route the api serves, with the scope it needs, and no route it does not.
func TestEveryRouteIsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../../docs/api.md")
	require.NoError(t, err)
	documented := map[string]string{} // pattern: scope
	for _, line := range strings.Split(string(doc), "\n") {
		// Rows of the endpoint table: | `METHOD /path` | scope | what |
		if rest, ok := strings.CutPrefix(line, "| `"); ok {
			if pattern, rest, ok := strings.Cut(rest, "` | "); ok && strings.Contains(pattern, " /") {
				scope, _, _ := strings.Cut(rest, " |")
				documented[pattern] = scope
			}
		}
	}
	served := map[string]bool{}
	for _, rt := range (&Server{}).routes() {
		served[rt.pattern] = true
		scope, ok := documented[rt.pattern]
		require.True(t, ok, "docs/api.md's endpoint table does not list %s", rt.pattern)
		require.Equal(t, cmp.Or(string(rt.scope), "none"), scope, "docs/api.md's scope of %s", rt.pattern)
	}
	for pattern := range documented {
		require.True(t, served[pattern], "docs/api.md lists %s, which the api does not serve", pattern)
	}
}
