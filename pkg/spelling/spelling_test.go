package spelling_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/spelling"
)

// TestMeant: the one known name a name is a slip of, and none when two
// are as near, the name is known, too short, or far from all.
func TestMeant(t *testing.T) {
	known := []string{"hello", "order-flow", "clear-lock", "cart", "card"}
	for name, want := range map[string]string{
		"helo":       "hello",      // a letter left out
		"hlelo":      "hello",      // two swapped
		"order_flow": "order-flow", // '_' for '-'
		"ordre-flow": "order-flow",
		"hello":      "",     // known
		"crat":       "cart", // a swap away; card is two
		"carx":       "",     // cart and card, as near
		"hel":        "",     // too short to tell
		"goodbye":    "",     // far from all
	} {
		require.Equal(t, want, spelling.Meant(name, known), name)
	}
	require.Empty(t, spelling.Meant("order-flow", []string{"order-flow", "order_flow"}), "known, though its other spelling is too")
}
