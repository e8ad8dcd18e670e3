package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/tools/internal/devstack"
)

// TestServicesAsSeparatePrograms builds the four service binaries and runs
// each as its own process against one NATS server: they share nothing
// but JetStream subjects.
func TestServicesAsSeparatePrograms(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the service binaries")
	}
	t.Parallel()
	srv := natstest.RunJetStream(t)
	tokenFile, token, err := devstack.EnsureAdminToken(t.TempDir())
	require.NoError(t, err)
	// The api listens on a port the system picks and logs it (at info): a
	// port picked here and freed could be taken before the api listens.
	// At info: each logs "starting" once its signal handling is set up,
	// which a stop waits for (a SIGTERM before it ends the process by the
	// default action: on a loaded machine, the last started may not have
	// reached its main when the test is done).
	env := append(os.Environ(), "JETFLOW_NATS_URL="+srv.ClientURL(), "JETFLOW_HTTP_ADDR=127.0.0.1:0", "JETFLOW_ADMIN_TOKEN_FILE="+tokenFile,
		"JETFLOW_LOG_LEVEL=info", "JETFLOW_TASK_ACK_WAIT=2s", "JETFLOW_AGENT_ALLOW_EXEC=true", "JETFLOW_AGENT_EXEC_ALLOW=echo")
	var apiLog string
	for _, name := range []string{"api", "dispatcher", "agent", "janitor"} {
		cmd := exec.Command(buildService(t, name))
		cmd.Env = env
		logPath := filepath.Join(t.TempDir(), name+".log")
		logf, err := os.Create(logPath)
		require.NoError(t, err)
		cmd.Stdout, cmd.Stderr = logf, logf
		if name == "api" {
			apiLog = logPath
		}
		require.NoError(t, cmd.Start())
		t.Cleanup(func() {
			started := time.Now()
			for time.Since(started) < 60*time.Second {
				if log, _ := os.ReadFile(logPath); strings.Contains(string(log), `"message":"starting"`) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				log, _ := os.ReadFile(logPath)
				require.NoError(t, err, "%s did not exit cleanly on SIGTERM:\n%s", name, log)
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				t.Errorf("%s did not stop on SIGTERM", name)
			}
		})
	}
	listening := regexp.MustCompile(`"addr":"(127\.0\.0\.1:\d+)".*"message":"api listening"`)
	c := client.New("", client.WithToken(token))
	require.Eventually(t, func() bool {
		if c.Base == "" {
			out, _ := os.ReadFile(apiLog)
			m := listening.FindSubmatch(out)
			if m == nil {
				return false
			}
			c.Base = "http://" + string(m[1])
		}
		resp, err := http.Get(c.Base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond)
	ctx := context.Background()
	_, err = c.ApplyWorkflow(ctx, []byte("name: apart\nsteps:\n  - id: a\n    kind: exec\n    command: echo\n    args: [separate]\n  - id: b\n    kind: noop\n"))
	require.NoError(t, err)
	st, err := c.Start(ctx, client.StartRequest{Workflow: "apart", ID: "apart-1"})
	require.NoError(t, err)
	var x projections.Execution
	require.Eventually(t, func() bool {
		x, err = c.Execution(ctx, st.ID)
		return err == nil && x.Status.Terminal()
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	require.Contains(t, string(x.Steps[0].Output), "separate")

	// The agent was started with exec allowed for echo only: another
	// command fails its step at once (no retry helps), and never runs.
	file := filepath.Join(t.TempDir(), "ran")
	_, err = c.ApplyWorkflow(ctx, []byte(fmt.Sprintf("name: refused\nsteps:\n  - id: a\n    kind: exec\n    command: sh\n"+
		"    args: [-c, 'touch \"$0\"', %q]\n    retry: {limit: 3, backoff: {initial: 10ms}}\n", file)))
	require.NoError(t, err)
	st, err = c.Start(ctx, client.StartRequest{Workflow: "refused", ID: "refused-1"})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		x, err = c.Execution(ctx, st.ID)
		return err == nil && x.Status.Terminal()
	}, 30*time.Second, 20*time.Millisecond)
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Contains(t, x.Steps[0].Error, `command "sh" is not in this agent's exec allow-list`)
	require.True(t, x.Steps[0].Final)
	require.Equal(t, 1, x.Steps[0].Attempt, "a refusal is not retried")
	require.NoFileExists(t, file)
}
