package events_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
)

func TestValidLockName(t *testing.T) {
	t.Parallel()

	for _, ok := range []string{"db", "apt-web-1", "A.b_c-d", "9lives", "x.y.z"} {
		require.True(t, events.ValidLockName(ok), ok)
	}
	for _, bad := range []string{"", ".a", "a.", "a..b", "-a", "a b", "a/b", "a*", "a>", string(make([]byte, 129))} {
		require.False(t, events.ValidLockName(bad), bad)
	}
}
