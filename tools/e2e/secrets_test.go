package e2e

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/redact"
	"jetflow.dev/services/agent/agent"
	"jetflow.dev/tools/internal/devstack"
)

func randomText(t *testing.T, prefix string) string {
	t.Helper()
	b := make([]byte, 12)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return prefix + hex.EncodeToString(b)
}

// scanStream reads every message of a stream, raw (subject, headers and
// data), and calls fn with each.
func scanStream(t *testing.T, js jetstream.JetStream, name string, fn func(seq uint64, raw string)) int {
	t.Helper()
	stream, err := js.Stream(t.Context(), name)
	require.NoError(t, err)
	info, err := stream.Info(t.Context())
	require.NoError(t, err)
	n := 0
	for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(t.Context(), seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // acknowledged from a work queue, or deleted
		}
		require.NoError(t, err)
		fn(seq, m.Subject+"\n"+fmt.Sprint(m.Header)+"\n"+string(m.Data))
		n++
	}
	return n
}

// apiGet returns the raw body of a GET on the api.
func apiGet(t *testing.T, s *stack, path string, header ...string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, s.info.APIURL+path, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := apiHTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "GET %s: %s", path, b)
	return string(b)
}

// TestSecretsStayOutOfHistoryReadModelsAndAnswers: a workflow uses
// ${secret.TOKEN} in a command's environment and an http header, and the
// command echoes it. The execution succeeds with the secret in use (the
// http server received it), and the secret's value is in no message of any
// stream (the events, results, tasks and commands, raw), in no read model
// (every revision kept in the executions bucket), and in no api answer
// about the execution. A writeOnly input member's value, which the history
// keeps, is in no read model and no api answer either.
func TestSecretsStayOutOfHistoryReadModelsAndAnswers(t *testing.T) {
	t.Parallel()
	token, password := randomText(t, "tok-"), randomText(t, "pw-")
	var (
		mu   sync.Mutex
		auth []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("X-You-Sent", r.Header.Get("Authorization")) // a careless server echoes it
		fmt.Fprintf(w, "hello %s", r.Header.Get("Authorization"))
	}))
	t.Cleanup(srv.Close)
	s := startStack(t, func(cfg *devstack.Config) {
		dir := devstack.SecretsDir(cfg.DataDir)
		require.NoError(t, os.MkdirAll(dir, 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "TOKEN"), []byte(token+"\n"), 0o600))
	})

	s.apply(t, `name: uses-secrets
input:
  type: object
  required: [user]
  properties:
    user: {type: string}
    password: {type: string, writeOnly: true}
steps:
  - id: show
    kind: exec
    command: sh
    args: ["-c", 'echo "token=$TOKEN user=$0 password=$1"; echo "$TOKEN" >&2', "${input.user}", "${input.password}"]
    env:
      TOKEN: ${secret.TOKEN}
  - id: call
    kind: http
    url: `+srv.URL+`/hook
    headers:
      Authorization: Bearer ${secret.TOKEN}
  - id: keep
    kind: let
    vars: {pw: "${input.password}", user: "${input.user}"}
output:
  said: ${trim(steps.show.output.stdout)}
  answer: ${steps.call.output.body}
`)
	x := s.runToEnd(t, client.StartRequest{Workflow: "uses-secrets", ID: "secret-1",
		Input: map[string]any{"user": "bob", "password": password}})
	require.Equal(t, projections.StatusSucceeded, x.Status, x.Error)
	mu.Lock()
	require.Equal(t, []string{"Bearer " + token}, auth, "the agent sent the secret")
	mu.Unlock()
	require.JSONEq(t, `{"said":"token=[secret TOKEN] user=bob password=`+redact.Mask+`","answer":"hello Bearer [secret TOKEN]"}`, string(x.Output))
	require.JSONEq(t, `{"user":"bob","password":"`+redact.Mask+`"}`, string(x.Input))
	require.True(t, x.Redacted, "the read model says it hides values")

	// Every stream, every message, raw: the secret is nowhere. The start
	// command and the history hold the password (the input is recorded);
	// the secret's reference is recorded, as text.
	names := s.js.StreamNames(t.Context())
	var streams []string
	for n := range names.Name() {
		streams = append(streams, n)
	}
	require.NoError(t, names.Err())
	require.Contains(t, streams, bus.StreamEvents)
	require.Contains(t, streams, bus.StreamResults)
	reference := false
	for _, name := range streams {
		scanStream(t, s.js, name, func(seq uint64, raw string) {
			require.NotContains(t, raw, token, "stream %s, message %d", name, seq)
			if name == bus.StreamEvents && strings.Contains(raw, "${secret.TOKEN}") {
				reference = true
			}
			if strings.HasPrefix(name, "KV_") {
				require.NotContains(t, raw, password, "stream %s (a bucket), message %d", name, seq)
			}
		})
	}
	require.True(t, reference, "the history records the reference")
	require.Positive(t, scanStream(t, s.js, "KV_"+bus.BucketExecutions, func(uint64, string) {}), "read models were scanned")

	// The api: the execution, as of now and as of its last event, the
	// list, its events as JSON and as a followed stream.
	answers := map[string]string{
		"execution": apiGet(t, s, "/v1/executions/secret-1"),
		"at_seq":    apiGet(t, s, fmt.Sprintf("/v1/executions/secret-1?at_seq=%d", x.LastSeq)),
		"list":      apiGet(t, s, "/v1/executions?workflow=uses-secrets"),
		"events":    apiGet(t, s, "/v1/executions/secret-1/events"),
		"later":     apiGet(t, s, "/v1/executions/secret-1/events?from_seq=3"),
		"follow":    apiGet(t, s, "/v1/executions/secret-1/events", "Accept", "text/event-stream"),
	}
	for name, body := range answers {
		require.NotContains(t, body, token, name)
		require.NotContains(t, body, password, name)
	}
	require.Contains(t, answers["events"], "${secret.TOKEN}")
	require.Regexp(t, `"password":\s*"\[redacted\]"`, answers["events"])
	sc := bufio.NewScanner(strings.NewReader(answers["follow"]))
	data := 0
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: ") {
			data++
		}
	}
	require.Equal(t, x.Events, data, "the followed stream sent every event")
}

// TestMissingSecretFailsTheStep: a step whose secret the agent does not
// have fails at once (final: its retries are not used), naming the secret;
// the command does not run.
func TestMissingSecretFailsTheStep(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	file := filepath.Join(t.TempDir(), "ran")
	s.apply(t, fmt.Sprintf(`name: missing-secret
steps:
  - id: use
    kind: exec
    command: sh
    args: ["-c", 'touch "$0"', %q]
    env: {K: "${secret.NOT_THERE}"}
    retry: {limit: 3, backoff: {initial: 10ms}}
`, file))
	x := s.runToEnd(t, client.StartRequest{Workflow: "missing-secret", ID: "missing-1"})
	require.Equal(t, projections.StatusFailed, x.Status)
	st := stepByID(t, x, "use")
	require.Contains(t, st.Error, `secret "NOT_THERE" is not configured on this agent`)
	require.True(t, st.Final)
	require.Equal(t, 1, st.Attempt, "retrying cannot help")
	require.NoFileExists(t, file)
}

// TestAgentPolicyInTheStack: with exec off, an exec step fails (final)
// without running while the rest of the workflow's operations run.
func TestAgentPolicyInTheStack(t *testing.T) {
	t.Parallel()
	s := startStack(t, func(cfg *devstack.Config) { cfg.AgentPolicy = &agent.Policy{} })
	file := filepath.Join(t.TempDir(), "ran")
	s.apply(t, fmt.Sprintf(`name: no-exec
steps:
  - {id: first, kind: noop}
  - id: run
    kind: exec
    command: touch
    args: [%q]
    retry: {limit: 3, backoff: {initial: 10ms}}
`, file))
	x := s.runToEnd(t, client.StartRequest{Workflow: "no-exec", ID: "no-exec-1"})
	require.Equal(t, projections.StatusFailed, x.Status)
	require.Equal(t, projections.OpSucceeded, stepByID(t, x, "first").Status)
	st := stepByID(t, x, "run")
	require.Contains(t, st.Error, "exec steps are not enabled on this agent")
	require.True(t, st.Final)
	require.Equal(t, 1, st.Attempt)
	require.True(t, st.StartedAt.IsZero(), "never reported started")
	require.NoFileExists(t, file)
}
