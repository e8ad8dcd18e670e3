package agent_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/expression"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/agent/agent"
)

// touchStep is an exec step that would create file if it ran.
func touchStep(id, command, file string) workflow.Step {
	if command == "sh" {
		return workflow.Step{ID: id, Kind: workflow.KindExec, Command: "sh", Args: []string{"-c", `touch "$0"`, file}}
	}
	return workflow.Step{ID: id, Kind: workflow.KindExec, Command: command, Args: []string{file}}
}

// requireNotRun checks that the only result of the execution is a final
// failure, reported without a started report, whose error holds want,
// and that file was not created: the operation never ran.
func (b *agentBundle) requireNotRun(t *testing.T, execID, file, want string) *events.OperationFailed {
	t.Helper()
	evs := b.waitFinal(t, execID)
	require.Len(t, evs, 1, "a refused operation is never reported started")
	f, ok := evs[0].Data.(*events.OperationFailed)
	require.True(t, ok, "result is %s", evs[0].Type)
	require.True(t, f.Final, "a refusal is final: retrying cannot help")
	require.Contains(t, f.Error, want)
	require.Contains(t, f.Error, "agent "+agentName)
	b.waitQueueEmpty(t)
	if file != "" {
		require.NoFileExists(t, file, "the command ran")
	}
	return f
}

// TestAgentRefusesExecUnlessAllowed: an agent whose operator did not allow
// exec fails exec steps at once, final, without running the command; its
// other operations run.
func TestAgentRefusesExecUnlessAllowed(t *testing.T) {
	t.Parallel()
	b := setupAgentWith(t, agent.Config{})
	file := filepath.Join(t.TempDir(), "ran")

	b.publishTask(t, "x-exec-off", touchStep("touch", "sh", file))
	b.requireNotRun(t, "x-exec-off", file, "exec steps are not enabled on this agent")

	task := b.publishTask(t, "x-noop", workflow.Step{ID: "nothing", Kind: workflow.KindNoop})
	requireStartedThen(t, task, b.waitFinal(t, "x-noop"), events.TypeOperationSucceeded)
}

// TestAgentExecAllowList: with an allow-list, a listed command runs; an
// unlisted one, or a listed base name reached through another path, is
// refused without running.
func TestAgentExecAllowList(t *testing.T) {
	t.Parallel()
	truePath, err := exec.LookPath("true")
	require.NoError(t, err)
	truePath, err = filepath.Abs(truePath)
	require.NoError(t, err)
	b := setupAgentWith(t, agent.Config{Policy: agent.Policy{AllowExec: true, ExecAllow: []string{"touch", truePath}}})
	dir := t.TempDir()

	allowed := filepath.Join(dir, "allowed")
	task := b.publishTask(t, "x-listed", touchStep("touch", "touch", allowed))
	requireStartedThen(t, task, b.waitFinal(t, "x-listed"), events.TypeOperationSucceeded)
	require.FileExists(t, allowed)

	task = b.publishTask(t, "x-resolved", workflow.Step{ID: "t", Kind: workflow.KindExec, Command: "true"})
	requireStartedThen(t, task, b.waitFinal(t, "x-resolved"), events.TypeOperationSucceeded)

	shell := filepath.Join(dir, "shell")
	b.publishTask(t, "x-shell", touchStep("touch", "sh", shell))
	b.requireNotRun(t, "x-shell", shell, `command "sh" is not in this agent's exec allow-list`)

	// A program named touch elsewhere is not the touch on the agent's PATH.
	fake := filepath.Join(dir, "touch")
	require.NoError(t, os.WriteFile(fake, []byte("#!/bin/sh\ntouch \"$1\"\n"), 0o755))
	other := filepath.Join(dir, "other")
	b.publishTask(t, "x-fake", touchStep("touch", fake, other))
	b.requireNotRun(t, "x-fake", other, "is not in this agent's exec allow-list")
}

// TestAgentHTTPAllowHosts: an http step to a host not allowed is refused
// without a request; one to an allowed host that redirects to a host not
// allowed fails (final) without the second request.
func TestAgentHTTPAllowHosts(t *testing.T) {
	t.Parallel()
	var hits, redirected atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { redirected.Add(1) }))
	t.Cleanup(target.Close)
	src := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		// The same server by another name: localhost is not allowed.
		http.Redirect(w, r, strings.Replace(target.URL, "127.0.0.1", "localhost", 1)+"/there", http.StatusFound)
	}))
	t.Cleanup(src.Close)
	b := setupAgentWith(t, agent.Config{Policy: agent.Policy{HTTPAllowHosts: []string{"127.0.0.1"}}})

	b.publishTask(t, "x-host", workflow.Step{ID: "call", Kind: workflow.KindHTTP, URL: strings.Replace(src.URL, "127.0.0.1", "localhost", 1)})
	b.requireNotRun(t, "x-host", "", `host "localhost:`)
	require.Zero(t, hits.Load(), "no request was sent")

	b.publishTask(t, "x-redirect", workflow.Step{ID: "call", Kind: workflow.KindHTTP, URL: src.URL})
	evs := b.waitFinal(t, "x-redirect")
	f, ok := evs[len(evs)-1].Data.(*events.OperationFailed)
	require.True(t, ok, "result is %s", evs[len(evs)-1].Type)
	require.True(t, f.Final)
	require.Contains(t, f.Error, "is not in this agent's http allow-list")
	require.Equal(t, int32(1), hits.Load())
	require.Zero(t, redirected.Load(), "the redirect was not followed")
}

// secretTask is a step as the dispatcher renders it: fields with
// ${secret.NAME} as text, and the templates the agent resolves.
func secretTask(t *testing.T, step workflow.Step) workflow.Step {
	t.Helper()
	step.SecretRefs = map[string]string{}
	for k, v := range step.Env {
		if _, tmpl, err := expression.RenderSecretString(v, nil); err == nil && tmpl != "" {
			step.SecretRefs["/env/"+expression.PointerToken(k)] = tmpl
		}
	}
	for k, v := range step.Headers {
		if _, tmpl, err := expression.RenderSecretString(v, nil); err == nil && tmpl != "" {
			step.SecretRefs["/headers/"+expression.PointerToken(k)] = tmpl
		}
	}
	return step
}

// requireAbsentFromResults scans every message of the results stream, raw,
// for each of values.
func requireAbsentFromResults(t *testing.T, js jetstream.JetStream, values ...string) {
	t.Helper()
	stream, err := js.Stream(t.Context(), bus.StreamResults)
	require.NoError(t, err)
	info, err := stream.Info(t.Context())
	require.NoError(t, err)
	require.NotZero(t, info.State.Msgs)
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(t.Context(), seq)
		require.NoError(t, err)
		raw := string(m.Data) + fmt.Sprint(m.Header)
		for _, v := range values {
			require.NotContains(t, raw, v, "result %d holds a secret's value", seq)
		}
	}
}

// TestAgentResolvesSecrets: the agent gives an operation the secrets its
// step references, from files (a trailing newline removed), and masks
// their values in everything it reports; text that merely looks like a
// reference is passed on as text.
func TestAgentResolvesSecrets(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "TOKEN"), []byte("tok-7f3a9c\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "db-pass"), []byte("pw-51e2"), 0o600))
	var gotAuth atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth.Store(r.Header.Get("Authorization"))
		w.Header().Set("X-Echo", r.Header.Get("Authorization"))
		fmt.Fprintf(w, "you sent %s", r.Header.Get("Authorization"))
	}))
	t.Cleanup(srv.Close)
	b := setupAgentWith(t, agent.Config{Policy: agent.Policy{AllowExec: true}, SecretsDir: dir})

	b.publishTask(t, "x-exec", secretTask(t, workflow.Step{ID: "run", Kind: workflow.KindExec, Command: "sh",
		Args: []string{"-c", `echo "token=$TOKEN pass=$PASS literal=$0"; echo "$TOKEN" >&2`, "${secret.TOKEN}"},
		Env:  map[string]string{"TOKEN": "${secret.TOKEN}", "PASS": "pre-${secret.db-pass}"}}))
	evs := b.waitFinal(t, "x-exec")
	ok, isOK := evs[len(evs)-1].Data.(*events.OperationSucceeded)
	require.True(t, isOK, "%+v", evs[len(evs)-1].Data)
	require.JSONEq(t, `{"stdout":"token=[secret TOKEN] pass=pre-[secret db-pass] literal=${secret.TOKEN}\n","stderr":"[secret TOKEN]\n","exit_code":0}`,
		string(ok.Output), "the secrets reached the command; the text in args was not resolved")

	b.publishTask(t, "x-http", secretTask(t, workflow.Step{ID: "call", Kind: workflow.KindHTTP, URL: srv.URL,
		Headers: map[string]string{"Authorization": "Bearer ${secret.TOKEN}"}}))
	evs = b.waitFinal(t, "x-http")
	hok, isOK := evs[len(evs)-1].Data.(*events.OperationSucceeded)
	require.True(t, isOK, "%+v", evs[len(evs)-1].Data)
	require.Equal(t, "Bearer tok-7f3a9c", gotAuth.Load())
	require.Contains(t, string(hok.Output), `"body":"you sent Bearer [secret TOKEN]"`)
	require.Contains(t, string(hok.Output), `"X-Echo":"Bearer [secret TOKEN]"`)

	requireAbsentFromResults(t, b.js, "tok-7f3a9c", "pw-51e2")
}

// TestAgentSecretMissing: a step referencing a secret the agent does not
// have fails, final, naming the secret, without running.
func TestAgentSecretMissing(t *testing.T) {
	t.Parallel()
	b := setupAgentWith(t, agent.Config{Policy: agent.Policy{AllowExec: true}, SecretsDir: t.TempDir(), SecretsEnvPrefix: "JFTEST_NONE_",
		LookupEnv: func(string) (string, bool) { return "", false }})
	file := filepath.Join(t.TempDir(), "ran")
	step := touchStep("touch", "sh", file)
	step.Env = map[string]string{"K": "${secret.API_KEY}"}
	b.publishTask(t, "x-missing", secretTask(t, step))
	f := b.requireNotRun(t, "x-missing", file, `secret "API_KEY" is not configured on this agent`)
	require.Contains(t, f.Error, "no file API_KEY in its secrets directory, no environment variable JFTEST_NONE_API_KEY")

	// An agent without any secret source says so.
	b = setupAgentWith(t, agent.Config{Policy: agent.Policy{AllowExec: true}})
	b.publishTask(t, "x-nosource", secretTask(t, step))
	b.requireNotRun(t, "x-nosource", file, "this agent has no secrets")
}

// TestAgentSecretsFromEnvironment: with a prefix, the agent's environment
// variables are secrets; and no command gets them unless its step asks.
// (Not parallel: it sets the process's environment.)
func TestAgentSecretsFromEnvironment(t *testing.T) {
	t.Setenv("JFTEST_SECRET_ENVTOK", "env-9b8d")
	t.Setenv("JFTEST_SECRET_UNUSED", "unused-4c1f")
	b := setupAgentWith(t, agent.Config{Policy: agent.Policy{AllowExec: true}, SecretsEnvPrefix: "JFTEST_SECRET_"})

	b.publishTask(t, "x-env", secretTask(t, workflow.Step{ID: "run", Kind: workflow.KindExec, Command: "sh",
		Args: []string{"-c", `echo "got=$T"; env | grep JFTEST_ || echo none`},
		Env:  map[string]string{"T": "${secret.ENVTOK}"}}))
	evs := b.waitFinal(t, "x-env")
	ok, isOK := evs[len(evs)-1].Data.(*events.OperationSucceeded)
	require.True(t, isOK, "%+v", evs[len(evs)-1].Data)
	require.JSONEq(t, `{"stdout":"got=[secret ENVTOK]\nnone\n","stderr":"","exit_code":0}`, string(ok.Output))
	requireAbsentFromResults(t, b.js, "env-9b8d", "unused-4c1f")
}

// TestAgentMasksSecretCutByTheOutputLimit: output cut at the size limit in
// the middle of a secret does not keep its beginning.
func TestAgentMasksSecretCutByTheOutputLimit(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "T"), []byte("abcdefghijkl"), 0o600))
	b := setupAgentWith(t, agent.Config{Policy: agent.Policy{AllowExec: true}, SecretsDir: dir, MaxOutput: 10})
	b.publishTask(t, "x-cut", secretTask(t, workflow.Step{ID: "run", Kind: workflow.KindExec, Command: "sh",
		Args: []string{"-c", `echo "12345$T"`}, Env: map[string]string{"T": "${secret.T}"}}))
	evs := b.waitFinal(t, "x-cut")
	ok, isOK := evs[len(evs)-1].Data.(*events.OperationSucceeded)
	require.True(t, isOK, "%+v", evs[len(evs)-1].Data)
	require.JSONEq(t, `{"stdout":"12345[secret T]","stderr":"","exit_code":0,"truncated":true}`, string(ok.Output))
	requireAbsentFromResults(t, b.js, "abcde")
}

// TestNewChecksPolicyAndSecrets: an agent does not start with a policy or
// a secret source that cannot work.
func TestNewChecksPolicyAndSecrets(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	for name, tc := range map[string]struct {
		cfg agent.Config
		msg string
	}{
		"AllowListWithoutExec": {agent.Config{Policy: agent.Policy{ExecAllow: []string{"echo"}}}, "exec is not allowed"},
		"BadHost":              {agent.Config{Policy: agent.Policy{HTTPAllowHosts: []string{"http://x"}}}, "not a host name"},
		"MissingSecretsDir":    {agent.Config{SecretsDir: filepath.Join(file, "nope")}, "secrets directory"},
		"SecretsDirIsAFile":    {agent.Config{SecretsDir: file}, "is not a directory"},
		"BadEnvPrefix":         {agent.Config{SecretsEnvPrefix: "9-X"}, "secrets environment prefix"},
	} {
		_, err := agent.New(tc.cfg, nil, zerolog.New(zerolog.NewTestWriter(t)))
		require.ErrorContains(t, err, tc.msg, name)
	}
}
