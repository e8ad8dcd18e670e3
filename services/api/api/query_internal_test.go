package api

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNamelessQueryPart: the message about a query parameter with no
// name quotes that parameter, as sent, not the whole query.
func TestNamelessQueryPart(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"=2":            "=2",
		"limit=1&=2":    "=2",
		"&=2&limit=1":   "=2",
		"=&workflow=x":  "=",
		"limit=1&&a=b":  "limit=1&&a=b", // an empty part has no name either: the whole query
		"workflow=x&=3": "=3",
	} {
		require.Equal(t, want, nameless(raw), "%q", raw)
	}
}
