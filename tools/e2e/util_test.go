package e2e

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

var (
	binDir    string
	buildOnce sync.Once
	buildOut  string
	buildErr  error
)

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
	bin := filepath.Join(binDir, "jetflow")
	buildOnce.Do(func() {
		buildOut, buildErr = runCmd(context.Background(), "go", "build", "-o", bin, "jetflow.dev/tools/cmd/jetflow")
	})
	require.NoError(t, buildErr, buildOut)
	return bin
}

func runCmd(ctx context.Context, name string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
