package svcrun

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestExitCode: a failure is printed after the program's name and exits
// 1; -h, a clean stop and an error after a stop was asked for exit 0.
func TestExitCode(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		err     error
		stopped bool
		code    int
		printed string
	}{
		"Clean":          {},
		"Failure":        {err: errors.New("boom"), code: 1, printed: "jetflow-x: boom\n"},
		"Help":           {err: fmt.Errorf("parse: %w", flag.ErrHelp)},
		"ErrorAfterStop": {err: errors.New("drain: closed"), stopped: true},
		"StoppedClean":   {stopped: true},
	} {
		var out bytes.Buffer
		require.Equal(t, tc.code, exitCode("jetflow-x", tc.err, tc.stopped, &out), name)
		require.Equal(t, tc.printed, out.String(), name)
	}
}
