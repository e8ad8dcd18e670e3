package visibility_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/services/api/visibility"
)

// TestCursorOfAnotherOrderIsRefused: a time order's next, passed to a
// list in another order, id order included, is an error naming both
// orders, never a page of something else; an id order's cursor is the
// last id, whatever it looks like.
func TestCursorOfAnotherOrderIsRefused(t *testing.T) {
	next := visibility.Cursor{Sort: visibility.SortStartedDesc, Time: 1764000000000000000, ID: "inv-7"}.String()
	c, err := visibility.ParseCursor(visibility.SortStartedDesc, next)
	require.NoError(t, err)
	require.Equal(t, "inv-7", c.ID)
	for _, other := range []visibility.Sort{visibility.SortID, visibility.SortEndedAsc} {
		_, err := visibility.ParseCursor(other, next)
		require.True(t, errors.Is(err, visibility.ErrCursor), "%s: %v", other, err)
		require.ErrorContains(t, err, "started_desc")
	}
	for _, id := range []string{"inv-7", "ce-5254", "c3RhcnRlZF9kZXNj", "a.b_c-d"} {
		c, err := visibility.ParseCursor(visibility.SortID, id)
		require.NoError(t, err, id)
		require.Equal(t, id, c.ID)
	}
}
