package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/tools/internal/devstack"
)

// devProcess is `jetflow dev` running as its own process, so that the test
// can SIGKILL all of it (embedded nats-server included) at any moment.
// Each run listens on ports the system picks, read from what it prints
// when it is up: a port picked by the test and freed for the process to
// take could be taken by another test meanwhile, or after a SIGKILL.
type devProcess struct {
	t        *testing.T
	bin, dir string
	c        *client.Client // on the api of the current run
	natsURL  string         // of the current run
	cmd      *exec.Cmd
	exited   chan struct{} // closed once cmd has exited
	runs     int
}

// newDevProcess returns a devProcess stopped when the test ends; start it.
func newDevProcess(t *testing.T) *devProcess {
	p := &devProcess{t: t, bin: buildJetflow(t), dir: t.TempDir(), c: client.New("http://127.0.0.1:0")}
	t.Cleanup(p.stop)
	return p
}

// devAddrs finds the addresses a run of jetflow dev prints once it is up.
var devAddrs = regexp.MustCompile(`(?m)^\s+NATS: (nats://\S+).*\n\s+api:\s+(http://\S+)`)

func (p *devProcess) start() {
	p.t.Helper()
	p.runs++
	logf, err := os.Create(filepath.Join(p.dir, fmt.Sprintf("run-%d.log", p.runs)))
	require.NoError(p.t, err)
	defer logf.Close()
	p.cmd = exec.Command(p.bin, "dev", "--data", filepath.Join(p.dir, "data"),
		"--nats-addr", "127.0.0.1:0", "--http", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
		"--task-ack-wait", "1s", "--log-level", "warn", "--log-json",
		"--retention-default", "forever") // the tests read every execution after it ends
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	require.NoError(p.t, p.cmd.Start())
	exited := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(exited) }()
	p.exited = exited
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _ := os.ReadFile(logf.Name())
		if m := devAddrs.FindSubmatch(out); m != nil {
			p.natsURL, p.c.Base = string(m[1]), string(m[2])
			tok, err := devstack.ReadToken(filepath.Join(p.dir, "data", devstack.AuthDir, devstack.AdminTokenFile))
			require.NoError(p.t, err, "jetflow dev writes its admin token before it says where it is")
			p.c.Token = tok
			resp, err := http.Get(p.c.Base + "/healthz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return
				}
			}
		}
		state := "still running"
		select {
		case <-exited:
			state = p.cmd.ProcessState.String()
		case <-time.After(20 * time.Millisecond):
			if time.Now().Before(deadline) {
				continue
			}
		}
		out, _ = os.ReadFile(logf.Name())
		p.t.Fatalf("jetflow dev did not come up (run %d, %s); its output:\n%s", p.runs, state, out)
	}
}

// connect opens a NATS connection to the current run with the admin
// identity jetflow dev made in its data directory.
func (p *devProcess) connect() (*nats.Conn, error) {
	opts, err := auth.ConnectOptions(filepath.Join(p.dir, "data", devstack.AuthDir, auth.DefaultNamespace, auth.CredsFile(auth.RoleAdmin)))
	if err != nil {
		return nil, err
	}
	return nats.Connect(p.natsURL, opts...)
}

func (p *devProcess) kill() {
	p.t.Helper()
	require.NoError(p.t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.exited
}

func (p *devProcess) stop() {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// TestCrashRecoveryWithSIGKILL kills the whole dev process (NATS server
// and all four services) three times during multi-step workflows: while
// an exec step runs, while another exec step runs, and right after a
// restart. Every execution must finish with each step's success recorded
// exactly once and a linear history.
func TestCrashRecoveryWithSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test runs jetflow as a separate process")
	}
	t.Parallel()
	p := newDevProcess(t)
	p.start()
	c := p.c // follows each run's api
	ctx := context.Background()
	// The exec steps are held running until the test opens their gate, so
	// that each kill comes while they run, however slow the machine.
	s2, s4 := newGate(t), newGate(t)
	_, err := c.ApplyWorkflow(ctx, []byte(`
name: crashy
steps:
  - id: s1
    kind: noop
  - id: s2
    kind: exec
    command: sh
    args: ["-c", "`+s2.then("echo two")+`"]
  - id: s3
    kind: log
    message: between the slow steps
  - id: s4
    kind: exec
    command: sh
    args: ["-c", "`+s4.then("echo four")+`"]
  - id: s5
    kind: noop
`))
	require.NoError(t, err)
	ids := []string{"crash-1", "crash-2", "crash-3", "crash-4", "crash-5"}
	for _, id := range ids {
		_, err := c.Start(ctx, client.StartRequest{Workflow: "crashy", ID: id})
		require.NoError(t, err)
	}
	waitStep := func(id, step string) {
		require.Eventually(t, func() bool {
			x, err := c.Execution(ctx, id)
			if err != nil {
				return false
			}
			i := x.StepIndex(step)
			return i >= 0 && x.Steps[i].Status == projections.OpStarted
		}, 30*time.Second, 10*time.Millisecond, "%s never started %s", id, step)
	}

	waitStep("crash-1", "s2") // kill 1: while an exec step runs
	p.kill()
	p.start()
	s2.open()
	waitStep("crash-1", "s4") // kill 2: while another exec step runs
	p.kill()
	p.start()
	time.Sleep(300 * time.Millisecond) // kill 3: a moment into recovery (not a state: any moment will do)
	p.kill()
	p.start()
	s4.open()

	for _, id := range ids {
		require.Eventually(t, func() bool {
			x, err := c.Execution(ctx, id)
			return err == nil && x.Status.Terminal()
		}, 60*time.Second, 20*time.Millisecond, "%s did not finish after restarts", id)
	}

	nc, err := p.connect()
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	for _, id := range ids {
		evs, err := history.Read(ctx, js, bus.ExecutionFilter(id), 0)
		require.NoError(t, err)
		x := requireLinear(t, evs)
		require.Equal(t, projections.StatusSucceeded, x.Status, "%s: %s", id, x.Error)
		counts := countTypes(evs)
		require.Equal(t, 1, counts[string(events.TypeExecutionStarted)], id)
		require.Equal(t, 1, counts[string(events.TypeExecutionSucceeded)], id)
		for _, step := range []string{"s1", "s2", "s3", "s4", "s5"} {
			require.Equal(t, 1, counts[string(events.TypeStepSucceeded)+"/"+step], "%s step %s", id, step)
			// Operations: scheduled and sending in one event, once.
			require.Equal(t, 1, counts[string(events.TypeStepDispatched)+"/"+step], "%s step %s", id, step)
			require.Zero(t, counts[string(events.TypeStepScheduled)+"/"+step], "%s step %s", id, step)
		}
		// The read model the api serves agrees with the fold of the stream.
		served, err := c.Execution(ctx, id)
		require.NoError(t, err)
		require.Equal(t, x.Status, served.Status)
		require.Equal(t, x.LastSeq, served.LastSeq)
	}
}
