package svc

import (
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestVersion(t *testing.T) {
	bi := &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "3f2a9c1b7d4e5f60718293a4b5c6d7e8f9012345"},
		{Key: "vcs.time", Value: "2026-11-24T15:30:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}}
	require.Equal(t, "v1.2.3 3f2a9c1b7d4e+dirty 2026-11-24T15:30:00Z", versionOf(bi))
	require.Equal(t, "(devel)", versionOf(&debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}))
	require.NotEmpty(t, Version(), "a test binary has build info too")
}
