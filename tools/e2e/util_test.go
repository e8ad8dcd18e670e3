package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	binDir string
	builds sync.Map // import path -> *build
)

// build is one binary compiled for this test run.
type build struct {
	once     sync.Once
	bin, out string
	err      error
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "jetflow-e2e-")
	if err != nil {
		panic(err)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildJetflow compiles the jetflow binary once per test run.
func buildJetflow(t *testing.T) string {
	t.Helper()
	return buildBinary(t, "jetflow.dev/tools/cmd/jetflow", "jetflow")
}

// buildService compiles the binary of a service (api, dispatcher, agent or
// janitor) once per test run and returns its path.
func buildService(t *testing.T, name string) string {
	t.Helper()
	return buildBinary(t, "jetflow.dev/services/"+name, "jetflow-"+name)
}

// buildBinary compiles the main package pkg of the workspace into the
// binary name, once per test run (tests running in parallel share the
// build), without -race whatever the tests run with.
func buildBinary(t *testing.T, pkg, name string) string {
	t.Helper()
	b, _ := builds.LoadOrStore(pkg, &build{})
	bd := b.(*build)
	bd.once.Do(func() {
		bd.bin = filepath.Join(binDir, name)
		var goBin string
		if goBin, bd.err = exec.LookPath("go"); bd.err == nil {
			bd.out, bd.err = runCmd(context.Background(), goBin, "build", "-o", bd.bin, pkg)
		}
	})
	require.NoError(t, bd.err, "build %s: %s", pkg, bd.out)
	return bd.bin
}

func runCmd(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}
