package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/agent/agent"
)

// builtin returns the built-in handler of kind, with the agent's defaults
// for every Config field left zero.
func builtin(t *testing.T, kind string, cfg agent.Config) operation.Handler {
	t.Helper()
	return builtinWithLog(t, kind, cfg, zerolog.New(zerolog.NewTestWriter(t)))
}

func builtinWithLog(t *testing.T, kind string, cfg agent.Config, log zerolog.Logger) operation.Handler {
	t.Helper()
	if cfg.KillGrace == 0 {
		cfg.KillGrace = 5 * time.Second
	}
	if cfg.HTTPTimeout == 0 {
		cfg.HTTPTimeout = 10 * time.Second
	}
	if cfg.MaxOutput == 0 {
		cfg.MaxOutput = 1 << 20
	}
	h, ok := agent.Builtins(cfg, log)[kind]
	require.True(t, ok, "no built-in %s handler", kind)
	return h
}

func task(t *testing.T, step workflow.Step) operation.Task {
	t.Helper()
	spec, err := json.Marshal(step)
	require.NoError(t, err)
	return operation.Task{TaskID: "x1." + step.ID + ".2", ExecutionID: "x1", Workflow: "wf", StepID: step.ID,
		Attempt: 2, Delivery: 1, Kind: step.Kind, Spec: spec}
}

func execStep(script string) workflow.Step {
	return workflow.Step{ID: "run", Kind: workflow.KindExec, Command: "sh", Args: []string{"-c", script}}
}

func requireFailure(t *testing.T, err error) *operation.Failure {
	t.Helper()
	var f *operation.Failure
	require.ErrorAs(t, err, &f)
	return f
}

func TestBuiltinKinds(t *testing.T) {
	t.Parallel()

	h := agent.Builtins(agent.Config{}, zerolog.New(zerolog.NewTestWriter(t)))
	n := 0
	for _, kind := range workflow.Kinds {
		if workflow.IsOperation(kind) && kind != workflow.KindCall { // call steps name a custom handler
			require.Contains(t, h, kind)
			n++
		}
	}
	require.Len(t, h, n)
}

func TestNoop(t *testing.T) {
	t.Parallel()

	out, err := builtin(t, workflow.KindNoop, agent.Config{}).Handle(t.Context(),
		task(t, workflow.Step{ID: "nothing", Kind: workflow.KindNoop}))
	require.NoError(t, err)
	require.Nil(t, out)
}

func TestLog(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name, level, wantLevel string
	}{
		{"DefaultLevel", "", "info"},
		{"Warn", "warn", "warn"},
		{"Debug", "debug", "debug"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			var buf bytes.Buffer
			log := zerolog.New(io.MultiWriter(&buf, zerolog.NewTestWriter(t)))
			h := builtinWithLog(t, workflow.KindLog, agent.Config{}, log)
			out, err := h.Handle(t.Context(), task(t, workflow.Step{ID: "say", Kind: workflow.KindLog, Message: "built it", Level: tc.level}))
			require.NoError(t, err)
			require.Equal(t, map[string]string{"message": "built it", "level": tc.wantLevel}, out)

			var line map[string]any
			require.NoError(t, json.Unmarshal(buf.Bytes(), &line))
			require.Equal(t, tc.wantLevel, line["level"])
			require.Equal(t, "built it", line["step_message"])
			require.Equal(t, "workflow log", line["message"])
			require.Equal(t, "x1", line["execution_id"])
			require.Equal(t, "say", line["step_id"])
		})
	}
}

func TestBadSpec(t *testing.T) {
	t.Parallel()

	for _, kind := range []string{workflow.KindLog, workflow.KindExec, workflow.KindHTTP} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()

			tk := task(t, workflow.Step{ID: "s", Kind: kind})
			tk.Spec = json.RawMessage(`{not json`)
			_, err := builtin(t, kind, agent.Config{}).Handle(t.Context(), tk)
			require.ErrorContains(t, err, "decode "+kind+" step spec")
		})
	}
}

func TestExec(t *testing.T) {
	t.Parallel()

	t.Run("CapturesOutput", func(t *testing.T) {
		t.Parallel()

		out, err := builtin(t, workflow.KindExec, agent.Config{}).Handle(t.Context(),
			task(t, execStep(`echo out; echo err >&2`)))
		require.NoError(t, err)
		require.Equal(t, agent.ExecOutput{Stdout: "out\n", Stderr: "err\n", ExitCode: 0}, out)
	})

	t.Run("ArgsEnvAndDir", func(t *testing.T) {
		t.Parallel()

		dir := t.TempDir()
		step := workflow.Step{ID: "env", Kind: workflow.KindExec, Command: "sh", Dir: dir,
			Args: []string{"-c", `printf '%s\n' "$1" "$GREETING" "$JETFLOW_EXECUTION_ID" "$JETFLOW_STEP_ID" "$JETFLOW_IDEMPOTENCY_KEY" "$JETFLOW_ATTEMPT" "$(pwd)"`, "sh", "first arg"},
			Env:  map[string]string{"GREETING": "hello world"}}
		out, err := builtin(t, workflow.KindExec, agent.Config{}).Handle(t.Context(), task(t, step))
		require.NoError(t, err)
		realDir, err := filepath.EvalSymlinks(dir)
		require.NoError(t, err)
		got := out.(agent.ExecOutput)
		require.Equal(t, []string{"first arg", "hello world", "x1", "env", "x1.env.2", "2", realDir},
			strings.Split(strings.TrimSuffix(got.Stdout, "\n"), "\n"))
	})

	t.Run("NonZeroExit", func(t *testing.T) {
		t.Parallel()

		out, err := builtin(t, workflow.KindExec, agent.Config{}).Handle(t.Context(),
			task(t, execStep(`echo partial; echo disk is full >&2; exit 3`)))
		f := requireFailure(t, err)
		want := agent.ExecOutput{Stdout: "partial\n", Stderr: "disk is full\n", ExitCode: 3}
		require.Equal(t, want, f.Output)
		require.Equal(t, want, out)
		require.ErrorContains(t, err, "exit status 3")
		var ee interface{ ExitCode() int }
		require.ErrorAs(t, err, &ee)
	})

	t.Run("CommandNotFound", func(t *testing.T) {
		t.Parallel()

		step := workflow.Step{ID: "missing", Kind: workflow.KindExec, Command: "jetflow-no-such-command"}
		_, err := builtin(t, workflow.KindExec, agent.Config{}).Handle(t.Context(), task(t, step))
		_ = requireFailure(t, err)
		require.EqualError(t, err, "run command jetflow-no-such-command: executable file not found in $PATH", "the command named once")
		require.ErrorIs(t, err, exec.ErrNotFound)

		step.Command = "/nonexistent/jetflow-no-such-command"
		_, err = builtin(t, workflow.KindExec, agent.Config{}).Handle(t.Context(), task(t, step))
		_ = requireFailure(t, err)
		require.EqualError(t, err, "run command /nonexistent/jetflow-no-such-command: no such file or directory", "not fork/exec's path again")
		require.ErrorIs(t, err, fs.ErrNotExist)

		// A dir that is missing is named, not the command (which Go's
		// error names).
		step = workflow.Step{ID: "nodir", Kind: workflow.KindExec, Command: "sh", Args: []string{"-c", "true"}, Dir: "/nonexistent/jetflow-dir"}
		_, err = builtin(t, workflow.KindExec, agent.Config{}).Handle(t.Context(), task(t, step))
		_ = requireFailure(t, err)
		require.EqualError(t, err, "run command sh: its dir /nonexistent/jetflow-dir: no such file or directory")
	})

	t.Run("TruncatesOutput", func(t *testing.T) {
		t.Parallel()

		out, err := builtin(t, workflow.KindExec, agent.Config{MaxOutput: 10}).Handle(t.Context(),
			task(t, execStep(`i=0; while [ $i -lt 100 ]; do printf 0123456789; i=$((i+1)); done; printf abc >&2`)))
		require.NoError(t, err)
		require.Equal(t, agent.ExecOutput{Stdout: "0123456789", Stderr: "abc", Truncated: true}, out)
	})

	t.Run("OutputAtLimitIsNotTruncated", func(t *testing.T) {
		t.Parallel()

		out, err := builtin(t, workflow.KindExec, agent.Config{MaxOutput: 10}).Handle(t.Context(),
			task(t, execStep(`printf 0123456789`)))
		require.NoError(t, err)
		require.Equal(t, agent.ExecOutput{Stdout: "0123456789"}, out)
	})

	t.Run("CancelStopsCommand", func(t *testing.T) {
		t.Parallel()

		const grace = 5 * time.Second
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		step := workflow.Step{ID: "wait", Kind: workflow.KindExec, Command: "sleep", Args: []string{"30"}}
		time.AfterFunc(200*time.Millisecond, cancel)
		began := time.Now()
		_, err := builtin(t, workflow.KindExec, agent.Config{KillGrace: grace}).Handle(ctx, task(t, step))
		elapsed := time.Since(began)
		_ = requireFailure(t, err)
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorContains(t, err, "stopped")
		require.Less(t, elapsed, grace/2, "sleep ends on SIGTERM, long before the kill grace")
	})

	t.Run("KillsCommandIgnoringSIGTERM", func(t *testing.T) {
		t.Parallel()

		const grace = 300 * time.Millisecond
		dir := t.TempDir()
		ready, pidFile := filepath.Join(dir, "ready"), filepath.Join(dir, "pid")
		// The shell and its child ignore SIGTERM (an ignored signal stays
		// ignored across fork and exec).
		step := execStep(`trap '' TERM; sleep 30 & echo $! > ` + pidFile + `; touch ` + ready + `; wait`)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		var (
			out      any
			err      error
			finished time.Time
			wg       sync.WaitGroup
		)
		h, tk := builtin(t, workflow.KindExec, agent.Config{KillGrace: grace}), task(t, step)
		wg.Go(func() {
			out, err = h.Handle(ctx, tk)
			finished = time.Now()
		})
		requireEventually(t, 10*time.Second, func() bool { _, err := os.Stat(ready); return err == nil }, "script ready")
		cancelled := time.Now()
		cancel()
		wg.Wait()
		elapsed := finished.Sub(cancelled)

		_ = requireFailure(t, err)
		require.ErrorIs(t, err, context.Canceled)
		require.NotNil(t, out)
		require.GreaterOrEqual(t, elapsed, grace, "SIGKILL comes only after the kill grace")
		require.Less(t, elapsed, grace+2*time.Second, "SIGKILL comes soon after the kill grace")

		b, rerr := os.ReadFile(pidFile)
		require.NoError(t, rerr)
		child, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		require.NoError(t, perr)
		requireEventually(t, 5*time.Second, func() bool { return !alive(child) },
			"the command's child %d (same process group) is killed too", child)
	})
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}

func requireEventually(t *testing.T, timeout time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: "+format, append([]any{timeout}, args...)...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type seenRequest struct {
	method, path string
	header       http.Header
	body         string
}

// recorder is an HTTP server that records requests and answers with
// status, content type and body.
func recorder(t *testing.T, status int, contentType, body string) (*httptest.Server, func() seenRequest) {
	t.Helper()
	var (
		mu   sync.Mutex
		seen seenRequest
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = seenRequest{method: r.Method, path: r.URL.Path, header: r.Header.Clone(), body: string(b)}
		mu.Unlock()
		if contentType != "" {
			w.Header().Set("Content-Type", contentType)
		}
		w.Header().Set("X-Answer", "42")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, func() seenRequest {
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

func TestHTTP(t *testing.T) {
	t.Parallel()

	t.Run("JSONBody", func(t *testing.T) {
		t.Parallel()

		srv, seen := recorder(t, http.StatusCreated, "application/json; charset=utf-8", `{"id":7,"tags":["a"]}`)
		step := workflow.Step{ID: "call", Kind: workflow.KindHTTP, Method: "post", URL: srv.URL + "/hooks",
			Headers: map[string]string{"Authorization": "Bearer s3cret", "X-Trace": "t1"},
			Body:    map[string]any{"env": "prod", "n": 2}}
		tk := task(t, step)
		out, err := builtin(t, workflow.KindHTTP, agent.Config{}).Handle(t.Context(), tk)
		require.NoError(t, err)

		req := seen()
		require.Equal(t, http.MethodPost, req.method)
		require.Equal(t, "/hooks", req.path)
		require.Equal(t, "Bearer s3cret", req.header.Get("Authorization"))
		require.Equal(t, "t1", req.header.Get("X-Trace"))
		require.Equal(t, "application/json", req.header.Get("Content-Type"))
		require.Equal(t, tk.TaskID, req.header.Get("Idempotency-Key"))
		require.JSONEq(t, `{"env":"prod","n":2}`, req.body)

		got := out.(agent.HTTPOutput)
		require.Equal(t, http.StatusCreated, got.Status)
		require.Equal(t, `{"id":7,"tags":["a"]}`, got.Body)
		require.Equal(t, map[string]any{"id": float64(7), "tags": []any{"a"}}, got.JSON)
		require.Equal(t, "42", got.Headers["X-Answer"])
		require.False(t, got.Truncated)
	})

	t.Run("ExplicitContentTypeKept", func(t *testing.T) {
		t.Parallel()

		srv, seen := recorder(t, http.StatusOK, "", "")
		step := workflow.Step{ID: "call", Kind: workflow.KindHTTP, Method: "PUT", URL: srv.URL,
			Headers: map[string]string{"Content-Type": "application/vnd.api+json"}, Body: []any{1, 2}}
		_, err := builtin(t, workflow.KindHTTP, agent.Config{}).Handle(t.Context(), task(t, step))
		require.NoError(t, err)
		require.Equal(t, http.MethodPut, seen().method)
		require.Equal(t, "application/vnd.api+json", seen().header.Get("Content-Type"))
		require.Equal(t, "[1,2]", seen().body)
	})

	t.Run("StringBodyDefaultMethod", func(t *testing.T) {
		t.Parallel()

		srv, seen := recorder(t, http.StatusOK, "text/plain", "plain answer")
		step := workflow.Step{ID: "call", Kind: workflow.KindHTTP, URL: srv.URL, Body: "raw text"}
		out, err := builtin(t, workflow.KindHTTP, agent.Config{}).Handle(t.Context(), task(t, step))
		require.NoError(t, err)
		require.Equal(t, http.MethodGet, seen().method)
		require.Equal(t, "raw text", seen().body)
		require.NotEqual(t, "application/json", seen().header.Get("Content-Type"))
		require.Equal(t, "x1.call.2", seen().header.Get("Idempotency-Key"))
		got := out.(agent.HTTPOutput)
		require.Equal(t, "plain answer", got.Body)
		require.Nil(t, got.JSON, "a non-JSON response is not parsed")
	})

	t.Run("ErrorStatusIsFailure", func(t *testing.T) {
		t.Parallel()

		srv, _ := recorder(t, http.StatusServiceUnavailable, "application/json", `{"error":"down"}`)
		step := workflow.Step{ID: "call", Kind: workflow.KindHTTP, Method: "DELETE", URL: srv.URL + "/x"}
		out, err := builtin(t, workflow.KindHTTP, agent.Config{}).Handle(t.Context(), task(t, step))
		f := requireFailure(t, err)
		require.ErrorContains(t, err, "status 503")
		got, ok := f.Output.(agent.HTTPOutput)
		require.True(t, ok, "failure output is %T", f.Output)
		require.Equal(t, http.StatusServiceUnavailable, got.Status)
		require.Equal(t, map[string]any{"error": "down"}, got.JSON)
		require.Equal(t, got, out)
	})

	t.Run("StatusBelow400Succeeds", func(t *testing.T) {
		t.Parallel()

		srv, _ := recorder(t, http.StatusNoContent, "", "")
		_, err := builtin(t, workflow.KindHTTP, agent.Config{}).Handle(t.Context(),
			task(t, workflow.Step{ID: "call", Kind: workflow.KindHTTP, URL: srv.URL}))
		require.NoError(t, err)
	})

	t.Run("TruncatedResponse", func(t *testing.T) {
		t.Parallel()

		srv, _ := recorder(t, http.StatusOK, "application/json", `{"long":"`+strings.Repeat("x", 100)+`"}`)
		out, err := builtin(t, workflow.KindHTTP, agent.Config{MaxOutput: 16}).Handle(t.Context(),
			task(t, workflow.Step{ID: "call", Kind: workflow.KindHTTP, URL: srv.URL}))
		require.NoError(t, err)
		got := out.(agent.HTTPOutput)
		require.True(t, got.Truncated)
		require.Len(t, got.Body, 16)
		require.Nil(t, got.JSON, "a truncated body is not parsed")
	})

	t.Run("Unreachable", func(t *testing.T) {
		t.Parallel()

		srv := httptest.NewServer(http.NotFoundHandler())
		url := srv.URL
		srv.Close()
		_, err := builtin(t, workflow.KindHTTP, agent.Config{}).Handle(t.Context(),
			task(t, workflow.Step{ID: "call", Kind: workflow.KindHTTP, URL: url}))
		require.Error(t, err)
		var f *operation.Failure
		require.False(t, errors.As(err, &f), "no response, no output")
		require.True(t, strings.HasPrefix(err.Error(), "GET "+url+": "), err.Error())
		require.NotContains(t, err.Error(), `Get "`, "the method and address once")

		// A redirect to where nobody answers names where it went.
		redirect := httptest.NewServer(http.RedirectHandler(url+"/moved", http.StatusFound))
		t.Cleanup(redirect.Close)
		_, err = builtin(t, workflow.KindHTTP, agent.Config{}).Handle(t.Context(),
			task(t, workflow.Step{ID: "call", Kind: workflow.KindHTTP, URL: redirect.URL}))
		require.ErrorContains(t, err, url+"/moved", "the redirect's target")
	})

	t.Run("Timeout", func(t *testing.T) {
		t.Parallel()

		release := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		t.Cleanup(srv.Close)
		t.Cleanup(func() { close(release) })
		began := time.Now()
		_, err := builtin(t, workflow.KindHTTP, agent.Config{HTTPTimeout: 200 * time.Millisecond}).Handle(t.Context(),
			task(t, workflow.Step{ID: "call", Kind: workflow.KindHTTP, URL: srv.URL}))
		require.Error(t, err)
		require.Less(t, time.Since(began), 5*time.Second)
		var timeout interface{ Timeout() bool }
		require.ErrorAs(t, err, &timeout, "still a timeout: %v", err)
		require.True(t, timeout.Timeout())
		require.NotContains(t, err.Error(), `Get "`)
	})
}
