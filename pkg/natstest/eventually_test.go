package natstest_test

import (
	"fmt"
	"testing"
	"time"

	"jetflow.dev/pkg/natstest"
)

// fatalTB records Eventually's failure instead of ending the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }

// TestLaterPrintsWhatTheLastTrySaw: an argument wrapped in Later is
// read when the message is printed, not when Eventually is called.
func TestLaterPrintsWhatTheLastTrySaw(t *testing.T) {
	t.Parallel()
	f := &fatalTB{TB: t}
	tries := 0
	natstest.Eventually(f, 50*time.Millisecond, func() bool { tries++; return false },
		"tries %d, later %v", tries, natstest.Later(func() any { return tries }))
	want := fmt.Sprintf("condition not met within 50ms: tries 0, later %d", tries)
	if tries < 1 || f.msg != want {
		t.Fatalf("after %d tries the message is %q, want %q", tries, f.msg, want)
	}
}
