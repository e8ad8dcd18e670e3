package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/internal/builtin"
)

// Builtins returns the built-in handlers: noop, log, exec and http.
func Builtins(cfg Config, log zerolog.Logger) map[string]operation.Handler {
	return map[string]operation.Handler{
		workflow.KindNoop: builtin.Noop,
		workflow.KindLog:  builtin.Log(log),
		workflow.KindExec: execHandler{grace: cfg.KillGrace, maxOutput: cfg.MaxOutput, hideEnv: cfg.SecretsEnvPrefix},
		workflow.KindHTTP: httpHandler{client: &http.Client{Timeout: cfg.HTTPTimeout, CheckRedirect: checkRedirect(cfg.Policy)},
			maxOutput: cfg.MaxOutput},
	}
}

// checkRedirect lets an http step follow a redirect only to a host the
// policy allows (and at most 10, as net/http's default).
func checkRedirect(p Policy) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("stopped after 10 redirects")
		}
		return p.DecideURL(req.URL.String())
	}
}

// commandEnv is the agent's environment less the variables that hold its
// secrets (those with prefix hide, if not empty): a command gets only
// the secrets its step references.
func commandEnv(hide string) []string {
	env := os.Environ()
	if hide == "" {
		return env
	}
	return slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, hide) })
}

// ExecOutput is the output of an exec step.
type ExecOutput struct {
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	ExitCode  int    `json:"exit_code"`
	Truncated bool   `json:"truncated,omitempty"`
}

type execHandler struct {
	grace     time.Duration
	maxOutput int
	// hideEnv is the prefix of the agent's variables not passed on.
	hideEnv string
}

func (h execHandler) Handle(ctx context.Context, t operation.Task) (any, error) {
	s, err := builtin.Spec(t)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, s.Command, s.Args...)
	cmd.Dir = s.Dir
	cmd.Env = append(commandEnv(h.hideEnv), "JETFLOW_EXECUTION_ID="+t.ExecutionID, "JETFLOW_STEP_ID="+t.StepID,
		"JETFLOW_IDEMPOTENCY_KEY="+t.TaskID, fmt.Sprintf("JETFLOW_ATTEMPT=%d", t.Attempt))
	for k, v := range s.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	// Own process group, so a kill reaches the command's children; and the
	// kernel kills it if the agent dies, so a redelivered task never runs
	// beside an orphan of its previous delivery.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var termAt time.Time // when SIGTERM was sent (set before Run returns)
	cmd.Cancel = func() error {
		// WaitDelay's SIGKILL reaches only the command itself: kill the
		// rest of the group too.
		pgid := cmd.Process.Pid
		termAt = time.Now()
		time.AfterFunc(h.grace, func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
		return syscall.Kill(-pgid, syscall.SIGTERM)
	}
	cmd.WaitDelay = h.grace
	beat := func() { operation.Heartbeat(ctx) } // output shows it is alive (a step's heartbeat)
	stdout, stderr := &capped{max: h.maxOutput, beat: beat}, &capped{max: h.maxOutput, beat: beat}
	cmd.Stdout, cmd.Stderr = stdout, stderr

	// Pdeathsig fires when the thread that forked exits: keep it alive
	// until the command ends.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	err = cmd.Run()
	out := ExecOutput{Stdout: stdout.String(), Stderr: stderr.String(), Truncated: stdout.truncated || stderr.truncated}
	if cmd.ProcessState != nil {
		out.ExitCode = cmd.ProcessState.ExitCode()
	}
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			if ctx.Err() != nil {
				// Why it was stopped is the context's cause, which the agent
				// puts first: the message says only how.
				return out, &operation.Failure{Err: quietError{fmt.Sprintf("command %s stopped (%s)", s.Command, howStopped(termAt, ee.ProcessState)), ctx.Err()}, Output: out}
			}
			return out, &operation.Failure{Err: fmt.Errorf("command %s: %w", s.Command, err), Output: out}
		}
		if why := dirMissing(s.Dir, err); why != nil {
			return out, &operation.Failure{Err: fmt.Errorf("run command %s: its dir %s: %w", s.Command, s.Dir, why), Output: out}
		}
		return out, &operation.Failure{Err: fmt.Errorf("run command %s: %w", s.Command, unrepeated(err, "")), Output: out}
	}
	return out, nil
}

// dirMissing is why dir cannot be a command's working directory, when
// the command's start failed with err for a missing file: Go does not
// look at the directory itself with SysProcAttr set, and its error names
// the command, as if the command were missing. nil otherwise.
func dirMissing(dir string, err error) error {
	if dir == "" || !errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	_, serr := os.Stat(dir)
	if pe, ok := serr.(*fs.PathError); ok { //nolint:errorlint // os.Stat's own
		return pe.Err
	}
	return serr
}

// unrepeated is a failed start's or request's err without what the
// message around it already says: exec's 'exec: "x": executable file not
// found in $PATH' and 'fork/exec /opt/x: no such file or directory' name
// the command again, and net/http's 'Get "http://…": dial tcp …' the
// method and address, which are addr's (a redirect's failure names its
// target: kept). What it wraps is kept (errors.Is, a timeout's Timeout).
func unrepeated(err error, addr string) error {
	var xe *exec.Error
	if errors.As(err, &xe) {
		return xe.Err
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Op == "fork/exec" {
		return pe.Err
	}
	var ue *url.Error
	if errors.As(err, &ue) && ue.URL == addr {
		return ue.Err
	}
	return err
}

// quietError is an error whose message leaves out the error it wraps.
type quietError struct {
	msg string
	err error
}

func (e quietError) Error() string { return e.msg }
func (e quietError) Unwrap() error { return e.err }

// howStopped says how a command stopped after SIGTERM was sent at termAt:
// the signal that ended it (SIGKILL once the grace was over) or its exit
// code, and how long after the SIGTERM.
func howStopped(termAt time.Time, ps *os.ProcessState) string {
	if termAt.IsZero() { // it ended by itself as its context ended
		return fmt.Sprintf("exited with code %d", ps.ExitCode())
	}
	after := " " + time.Since(termAt).Round(time.Millisecond).String() + " after it"
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		name := fmt.Sprintf("signal %d (%s)", ws.Signal(), ws.Signal())
		switch ws.Signal() {
		case syscall.SIGTERM:
			name = "SIGTERM"
		case syscall.SIGKILL:
			name = "SIGKILL, the grace being over"
		}
		return fmt.Sprintf("SIGTERM sent; ended by %s%s", name, after)
	}
	return fmt.Sprintf("SIGTERM sent; exited with code %d%s", ps.ExitCode(), after)
}

// HTTPOutput is the output of an http step.
type HTTPOutput struct {
	Status    int               `json:"status"`
	Headers   map[string]string `json:"headers,omitempty"`
	Body      string            `json:"body"`
	JSON      any               `json:"json,omitempty"`
	Truncated bool              `json:"truncated,omitempty"`
}

type httpHandler struct {
	client    *http.Client
	maxOutput int
}

func (h httpHandler) Handle(ctx context.Context, t operation.Task) (any, error) {
	s, err := builtin.Spec(t)
	if err != nil {
		return nil, err
	}
	var body io.Reader
	switch b := s.Body.(type) {
	case nil:
	case string:
		body = strings.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return nil, fmt.Errorf("encode body: %w", err)
		}
		body = bytes.NewReader(j)
		if _, ok := s.Headers["Content-Type"]; !ok {
			s.Headers = cloneWith(s.Headers, "Content-Type", "application/json")
		}
	}
	req, err := http.NewRequestWithContext(ctx, s.HTTPMethod(), s.URL, body)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	for k, v := range s.Headers {
		req.Header.Set(k, v)
	}
	req.Header.Set("Idempotency-Key", t.TaskID)
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", req.Method, s.URL, unrepeated(err, s.URL))
	}
	defer resp.Body.Close()
	buf := &capped{max: h.maxOutput}
	if _, err := io.Copy(buf, resp.Body); err != nil {
		return nil, fmt.Errorf("read response of %s %s: %w", req.Method, s.URL, err)
	}
	out := HTTPOutput{Status: resp.StatusCode, Headers: map[string]string{}, Body: buf.String(), Truncated: buf.truncated}
	for k := range resp.Header {
		out.Headers[k] = resp.Header.Get(k)
	}
	if strings.Contains(resp.Header.Get("Content-Type"), "json") && !buf.truncated {
		var v any
		if json.Unmarshal(buf.Bytes(), &v) == nil {
			out.JSON = v
		}
	}
	if resp.StatusCode >= 400 {
		return out, &operation.Failure{Err: fmt.Errorf("%s %s: status %d", req.Method, s.URL, resp.StatusCode), Output: out}
	}
	return out, nil
}

func cloneWith(m map[string]string, k, v string) map[string]string {
	out := make(map[string]string, len(m)+1)
	for a, b := range m {
		out[a] = b
	}
	out[k] = v
	return out
}

// capped is a buffer that keeps the first max bytes and notes the rest.
type capped struct {
	bytes.Buffer
	max       int
	truncated bool
	// beat, if set, is called on every write: output is a heartbeat.
	beat func()
}

// ReadFrom hides bytes.Buffer's, which io.Copy (and so exec.Cmd) would
// otherwise use, bypassing the cap in Write.
func (c *capped) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{c}, r)
}

func (c *capped) Write(p []byte) (int, error) {
	if c.beat != nil {
		c.beat()
	}
	room := c.max - c.Len()
	if room < len(p) {
		c.truncated = true
		if room > 0 {
			c.Buffer.Write(p[:room])
		}
		return len(p), nil
	}
	return c.Buffer.Write(p)
}
