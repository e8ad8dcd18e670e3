package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/tools/internal/devstack"
)

// stack runs jetflow in-process for the CLI to talk to.
func stack(t *testing.T) devstack.Info {
	t.Helper()
	info, _ := stackIn(t, t.TempDir())
	return info
}

// stackIn is stack on the data directory dir (where the CLI finds it
// through JETFLOW_DATA); it stops when the test ends, or at stop.
func stackIn(t *testing.T, dir string) (info devstack.Info, stop func()) {
	t.Helper()
	cfg := devstack.Config{DataDir: dir, NATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Log: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel), RetentionDefault: "forever"}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan devstack.Info, 1)
	done := make(chan error, 1)
	go func() { done <- devstack.Run(ctx, cfg, func(i devstack.Info) { ready <- i }) }()
	select {
	case info = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("stack stopped: %v", err)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("stack did not start")
	}
	stackTokens.Store(info.APIURL, info.AdminToken)
	stop = sync.OnceFunc(func() {
		stackTokens.Delete(info.APIURL)
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("stack did not stop")
		}
	})
	t.Cleanup(stop)
	return info, stop
}

// stackTokens maps each test stack's api to its admin token.
var stackTokens sync.Map

// jetflow runs the CLI with args against api and returns its exit status
// and output.
func jetflow(t *testing.T, api string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if api != "" {
		pre := []string{"--api", api}
		if tok, ok := stackTokens.Load(api); ok {
			pre = append(pre, "--token", tok.(string))
		}
		args = append(pre, args...)
	}
	code = Main(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "wf.yaml")
	require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	return p
}

// TestExitStatuses: scripts can tell what happened from the exit status
// alone (docs/cli.md).
func TestExitStatuses(t *testing.T) {
	t.Parallel()
	api := stack(t).APIURL
	ok := writeFile(t, "name: fine\nsteps:\n  - id: a\n    kind: noop\n")
	bad := writeFile(t, "name: broken\nsteps:\n  - id: a\n    kind: fail\n    message: no\n")
	code, applied, stderr := jetflow(t, api, "workflow", "apply", "-f", ok, "-f", bad) // each, in order
	require.Equal(t, ExitOK, code, stderr)
	require.Equal(t, "workflow fine version 1 created\nworkflow broken version 1 created\n", applied)
	code, reader, stderr := jetflow(t, api, "keys", "create", "--name", "reader", "--scopes", "read")
	require.Equal(t, ExitOK, code, stderr)
	reader = strings.TrimSpace(reader)
	require.Contains(t, stderr, "shown this once")
	code, out, stderr := jetflow(t, api, "keys", "ls")
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, out, "reader")
	require.NotContains(t, out, reader)
	// A start says which version runs (a loaded machine may answer before
	// the dispatcher started it: accepted, and no version yet).
	code, out, stderr = jetflow(t, api, "run", "fine", "--id", "v-1")
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, []string{"execution v-1 started (fine version 1)\n",
		"execution v-1 accepted (its start is stored; no dispatcher had answered yet: jetflow show v-1)\n"}, out)

	// A free port nothing listens on: the api is unreachable.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nowhere := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())

	for _, tt := range []struct {
		name string
		api  string
		args []string
		want int
		msg  string
	}{
		{"Succeeded", api, []string{"run", "fine", "--watch", "--id", "ok-1"}, ExitOK, ""},
		{"FailedUnderWatch", api, []string{"run", "broken", "--watch", "--id", "bad-1"}, ExitFailed, "execution bad-1 failed"},
		{"FailedUnderFollow", api, []string{"events", "bad-1", "--follow"}, ExitFailed, "execution bad-1 failed"},
		{"FailedWithoutFollowIsOK", api, []string{"events", "bad-1"}, ExitOK, ""},
		{"UnknownFlag", api, []string{"ls", "--colour"}, ExitUsage, "unknown flag"},
		{"MissingArgument", api, []string{"show"}, ExitUsage, "name the execution"},
		{"UnknownCommand", api, []string{"shwo"}, ExitUsage, "unknown command"},
		{"UnknownWorkflowCommand", api, []string{"workflow", "shwo"}, ExitUsage, `unknown command "shwo" for "jetflow workflow"`},
		{"UnknownProjectionsCommand", api, []string{"projections", "rebuilt"}, ExitUsage, `unknown command "rebuilt" for "jetflow projections"`},
		{"ForceCancelIsCancelForce", api, []string{"force-cancel", "x1"}, ExitUsage, "Did you mean this?\n\tcancel\n"},
		{"ForceResumeIsResumeForce", api, []string{"force-resume", "x1"}, ExitUsage, "Did you mean this?\n\tresume\n"},
		{"BadOutput", api, []string{"ls", "-o", "yaml"}, ExitUsage, "use text or json"},
		{"StandardInputTwice", api, []string{"workflow", "apply", "-f", "-", "-f", "-"}, ExitUsage, "standard input"},
		{"ApplyAFileWithoutF", api, []string{"workflow", "apply", "a.yaml", "b.yaml"}, ExitUsage, "give each file with -f: jetflow workflow apply -f a.yaml -f b.yaml"},
		{"BadStatus", api, []string{"ls", "--status", "done"}, ExitUsage, "--status"},
		{"BadInputToTheAPI", api, []string{"run", "fine", "--id", "-bad-"}, ExitUsage, "id"},
		{"NotFound", api, []string{"show", "nope"}, ExitNotFound, "does not exist"},
		{"WorkflowNotFound", api, []string{"run", "nope"}, ExitNotFound, "not registered"},
		{"VersionNotFound", api, []string{"run", "fine", "--version", "9"}, ExitNotFound, `workflow "fine" has no version 9 (field version, HTTP 404)` + "\n"},
		{"VersionNotANumber", api, []string{"run", "fine", "--version", "abc"}, ExitUsage, `--version "abc": give a whole number`},
		{"VersionTooLarge", api, []string{"run", "fine", "--version", strings.Repeat("9", 100)}, ExitUsage, `--version "99999999999999999999999999999999"... (100 characters): out of range; give a whole number`},
		{"InputNotKeyValue", api, []string{"run", "fine", "--input", "who"}, ExitUsage, `--input "who": write it as key=value`},
		{"InputAJSONObject", api, []string{"run", "fine", "--input", `{"who":"x=y"}`}, ExitUsage, "a whole JSON object goes in --input-json"},
		{"VersionZero", api, []string{"run", "fine", "--version", "0"}, ExitUsage, "--version 0: give a version number from 1, or leave it out for the latest"},
		{"Conflict", api, []string{"run", "fine", "--id", "ok-1"}, ExitConflict, "already used"},
		{"Unreachable", nowhere, []string{"ls"}, ExitUnreachable, "cannot reach the api at " + nowhere},
		{"NotAuthenticated", api, []string{"--token", "jfk_0000000000000000_" + strings.Repeat("0", 64), "ls"}, ExitDenied, "the api refused the token given"},
		{"NotAllowed", api, []string{"--token", reader, "run", "fine"}, ExitDenied, "needs the scope start"},
	} {
		code, _, stderr := jetflow(t, tt.api, tt.args...)
		require.Equal(t, tt.want, code, "%s: %s", tt.name, stderr)
		require.Contains(t, stderr, tt.msg, tt.name)
		require.NotContains(t, stderr, "JETFLOW_DATA", "%s: the api was named with --api: no hint about jetflow dev's data", tt.name)
	}
}

// TestJSONOutput: -o json prints the api's own JSON on every command
// that prints api answers.
func TestJSONOutput(t *testing.T) {
	t.Parallel()
	api := stack(t).APIURL
	f := writeFile(t, "name: fine\nsteps:\n  - id: a\n    kind: noop\n")
	code, _, stderr := jetflow(t, api, "workflow", "apply", "-f", f)
	require.Equal(t, ExitOK, code, stderr)

	code, out, stderr := jetflow(t, api, "run", "fine", "--id", "j-1", "-o", "json")
	require.Equal(t, ExitOK, code, stderr)
	var started client.Started
	require.NoError(t, json.Unmarshal([]byte(out), &started), out)
	require.Equal(t, "j-1", started.ID)
	require.Equal(t, "/v1/executions/j-1", started.Links["self"])

	// --watch -o json: one line for the answer, then one per event.
	code, out, stderr = jetflow(t, api, "run", "fine", "--id", "j-2", "--watch", "-o", "json")
	require.Equal(t, ExitOK, code, stderr)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.GreaterOrEqual(t, len(lines), 3, out)
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &started))
	require.Equal(t, "j-2", started.ID)
	var last client.Event
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &last))
	require.Equal(t, "io.jetflow.execution.succeeded", string(last.Type))

	// show reads the read model, which catches up with the events a
	// moment after --watch saw the last one.
	var x projections.Execution
	require.Eventually(t, func() bool {
		code, out, _ = jetflow(t, api, "show", "j-2", "-o", "json")
		return code == ExitOK && json.Unmarshal([]byte(out), &x) == nil && x.Status == projections.StatusSucceeded
	}, 20*time.Second, 50*time.Millisecond, out)

	code, out, stderr = jetflow(t, api, "events", "j-2", "-o", "json")
	require.Equal(t, ExitOK, code, stderr)
	var evs client.EventList
	require.NoError(t, json.Unmarshal([]byte(out), &evs), out)
	require.NotEmpty(t, evs.Events)

	// Nothing listed: an empty list, as the api answers, not null (a
	// script's jq '.executions[]' would fail on it).
	code, out, stderr = jetflow(t, api, "ls", "--workflow", "none-such", "-o", "json")
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, out, `"executions": []`, out)

	var list client.ExecutionList
	require.Eventually(t, func() bool { // the list is a projection: it catches up
		code, out, _ = jetflow(t, api, "ls", "-o", "json")
		list = client.ExecutionList{}
		return code == ExitOK && json.Unmarshal([]byte(out), &list) == nil && len(list.Executions) == 2
	}, 20*time.Second, 20*time.Millisecond, out)
	// The newest first (the dispatchers record the starts, so j-1 may
	// have started after j-2).
	newest, older := list.Executions[0], list.Executions[1]
	require.False(t, newest.StartedAt.Before(older.StartedAt), "ls lists the newest first: %s", out)

	// A page of one: the executions on stdout, the next page's command
	// (with the list's filters and page size, and no order, which it
	// asks for again the same way) on stderr.
	code, out, stderr = jetflow(t, api, "ls", "--workflow", "fine", "--limit", "1")
	require.Equal(t, ExitOK, code, stderr)
	require.NotContains(t, out, "more:")
	require.Equal(t, 2, strings.Count(out, "\n"), "a header and one execution: %s", out)
	require.Contains(t, out, newest.ID)
	more, ok := strings.CutPrefix(strings.TrimSpace(stderr), "more: jetflow --api "+api+" ls --workflow fine --limit 1 --after ")
	require.True(t, ok, stderr)
	code, out, stderr = jetflow(t, api, "ls", "--workflow", "fine", "--limit", "1", "--after", more)
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, out, older.ID)
	require.Empty(t, stderr, "the last page")
	// An id as the cursor, as when ls listed in id order: what to add.
	code, _, stderr = jetflow(t, api, "ls", "--workflow", "fine", "--after", newest.ID)
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, `--after "`+newest.ID+`": not a cursor of this list: give the one its more: line gave; ls lists the newest first: to page by execution id, add --sort id`)
	code, _, stderr = jetflow(t, api, "ls", "--workflow", "fine", "--sort", "started_asc", "--after", newest.ID)
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, "; to page by execution id, list with --sort id")
	code, _, stderr = jetflow(t, api, "ls", "--workflow", "fine", "--sort", "started_asc", "--after", more)
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, "not a cursor of this list (it is one of a list in started_desc order, and this one is in started_asc order)")
	code, _, stderr = jetflow(t, api, "ls", "--workflow", "fine", "--sort", "id", "--after", newest.ID)
	require.Equal(t, ExitOK, code, stderr)

	// counts: every execution of the workflow, by status (j-1 may still
	// be ending).
	var counts client.ExecutionCounts
	require.Eventually(t, func() bool {
		code, out, _ = jetflow(t, api, "counts", "--workflow", "fine", "-o", "json")
		return code == ExitOK && json.Unmarshal([]byte(out), &counts) == nil && counts.Counts["succeeded"] == 2
	}, 20*time.Second, 20*time.Millisecond, out)
	require.Equal(t, client.ExecutionCounts{Counts: map[string]int{"succeeded": 2}, Total: 2}, counts)
	code, out, stderr = jetflow(t, api, "counts")
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, out, "succeeded")
	require.Contains(t, out, "total")

	code, out, stderr = jetflow(t, api, "workflow", "ls", "-o", "json")
	require.Equal(t, ExitOK, code, stderr)
	var wfs struct {
		Workflows []client.WorkflowSummary `json:"workflows"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &wfs), out)
	require.Len(t, wfs.Workflows, 1)

	code, out, stderr = jetflow(t, api, "locks", "ls", "-o", "json")
	require.Equal(t, ExitOK, code, stderr)
	var locks struct {
		Locks []client.Lock `json:"locks"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &locks), out)
	require.Empty(t, locks.Locks)
}

// TestShowSaysWhichRetentionApplies: jetflow show names the retention rule
// in force, the system default's value included.
func TestShowSaysWhichRetentionApplies(t *testing.T) {
	t.Parallel()
	api := stack(t).APIURL
	for _, def := range []string{
		"name: plain\nsteps:\n  - id: a\n    kind: noop\n",
		"name: kept\nretention: 10 hash nightly\nsteps:\n  - id: a\n    kind: noop\n",
	} {
		code, _, stderr := jetflow(t, api, "workflow", "apply", "-f", writeFile(t, def))
		require.Equal(t, ExitOK, code, stderr)
	}
	code, _, stderr := jetflow(t, api, "run", "plain", "--id", "p-1", "--watch")
	require.Equal(t, ExitOK, code, stderr)
	code, _, stderr = jetflow(t, api, "run", "kept", "--id", "k-1", "--watch")
	require.Equal(t, ExitOK, code, stderr)
	require.Eventually(t, func() bool { // the janitor records the system rule when it starts
		_, out, _ := jetflow(t, api, "show", "p-1")
		return strings.Contains(out, "forever (the system default), in group plain")
	}, 20*time.Second, 20*time.Millisecond)
	_, out, _ := jetflow(t, api, "show", "k-1")
	require.Contains(t, out, "retention  10, in group nightly")
}

// TestStatusesAgree: the statuses ls --help offers are those the api
// filters by and docs/api.md lists.
func TestStatusesAgree(t *testing.T) {
	t.Parallel()
	code, out, _ := jetflow(t, "", "ls", "--help")
	require.Equal(t, ExitOK, code)
	doc, err := os.ReadFile("../../../docs/api.md")
	require.NoError(t, err)
	for _, st := range projections.ListedStatuses {
		require.Contains(t, out, string(st))
		require.Contains(t, string(doc), "`"+string(st)+"`", "docs/api.md does not list status %s", st)
	}
	require.Contains(t, out, statusList())
	require.True(t, slices.Contains(projections.ListedStatuses, projections.StatusSuspended))
}

// TestAPIFoundWithoutFlags: the CLI finds the api of the jetflow dev
// running on its data directory (JETFLOW_DATA, or .jetflow), and
// jetflow env prints where it is for other tools.
func TestAPIFoundWithoutFlags(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	info, stop := stackIn(t, dir)

	env := map[string]string{"JETFLOW_DATA": dir}
	a := &app{getenv: func(k string) string { return env[k] }}
	require.Equal(t, info.APIURL, a.api())
	env["JETFLOW_API"] = "http://elsewhere:1"
	require.Equal(t, "http://elsewhere:1", a.api(), "JETFLOW_API wins over the data directory")
	a.apiURL = "http://flag:2"
	require.Equal(t, "http://flag:2", a.api(), "--api wins over everything")

	var out bytes.Buffer
	b := &app{getenv: func(k string) string { return map[string]string{"JETFLOW_DATA": dir}[k] }, stdout: &out, stderr: &out}
	cmd := b.envCmd()
	cmd.SetArgs(nil)
	require.NoError(t, cmd.Execute())
	require.True(t, strings.HasPrefix(out.String(), "export JETFLOW_API='"+info.APIURL+"'\nexport NATS_URL='"+info.NATSURL+"'\n"+
		"export JETFLOW_TOKEN='"+info.AdminToken+"'\n"+
		"export NATS_CREDS='"+filepath.Join(dir, devstack.AuthDir, "default", "client.creds")+"'\n"), out.String())

	t.Log("the token: --token, JETFLOW_TOKEN, the jetflow dev's whose api it is, the config file")
	cfgDir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(cfgDir, "jetflow"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(cfgDir, "jetflow", "token"), []byte("# mine\nfrom-config\n"), 0o600))
	env = map[string]string{"JETFLOW_DATA": dir, "XDG_CONFIG_HOME": cfgDir}
	c := &app{getenv: func(k string) string { return env[k] }}
	require.NotEmpty(t, info.AdminToken)
	require.Equal(t, info.AdminToken, c.token(), "beside jetflow dev: its admin token")
	env["JETFLOW_API"] = "http://elsewhere:1"
	require.Equal(t, "from-config", c.token(), "another api: not the dev's token")
	env["JETFLOW_TOKEN"] = "from-env"
	require.Equal(t, "from-env", c.token())
	c.tokenFlag = "from-flag"
	require.Equal(t, "from-flag", c.token())
	require.Empty(t, (&app{getenv: func(string) string { return "" }}).token())

	stop()
	_, err := os.Stat(filepath.Join(dir, devstack.ConnFile))
	require.True(t, os.IsNotExist(err), "a stopped jetflow dev leaves no connection file")
	require.Equal(t, defaultAPI, (&app{getenv: func(k string) string { return map[string]string{"JETFLOW_DATA": dir}[k] }}).api())
}

// TestAConnectionFileNamesOnlyItsOwnFiles: a .jetflow of another's
// making (one that came with a cloned repository) cannot have the CLI
// send a file of the user's, or the user's configured token, to the api
// it names: the files it names count only inside it, symbolic links
// resolved, and the api it names gets no token but its dev's own.
func TestAConnectionFileNamesOnlyItsOwnFiles(t *testing.T) {
	t.Parallel()
	data, home := t.TempDir(), t.TempDir()
	secret := filepath.Join(home, "secret")
	require.NoError(t, os.WriteFile(secret, []byte("ghp_not-for-them\n"), 0o600))
	cfgDir := filepath.Join(home, "config")
	require.NoError(t, os.MkdirAll(filepath.Join(cfgDir, "jetflow"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(cfgDir, "jetflow", "token"), []byte("from-config\n"), 0o600))
	require.NoError(t, os.Symlink(secret, filepath.Join(data, "link")))
	conn := func(tokenFile string) {
		t.Helper()
		b, err := json.Marshal(devstack.Conn{API: "http://127.0.0.1:1", NATS: "nats://127.0.0.1:2", TokenFile: tokenFile,
			AdminCreds: secret, ClientCreds: filepath.Join(data, "link")})
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(data, devstack.ConnFile), b, 0o600))
	}
	env := map[string]string{"JETFLOW_DATA": data, "XDG_CONFIG_HOME": cfgDir}
	a := &app{getenv: func(k string) string { return env[k] }}

	for _, tokenFile := range []string{secret, filepath.Join(data, "link"), filepath.Join(data, "..", filepath.Base(home), "secret")} {
		conn(tokenFile)
		require.Equal(t, "http://127.0.0.1:1", a.api())
		require.Empty(t, a.token(), "token_file %s: neither the file's first line nor the configured token", tokenFile)
		c, err := devstack.ReadConn(data)
		require.NoError(t, err)
		require.Empty(t, c.TokenFile)
		require.Empty(t, c.AdminCreds, "creds outside the data directory are not taken either")
		require.Empty(t, c.ClientCreds, "nor through a link")
	}

	own := filepath.Join(data, "auth", "admin.token")
	require.NoError(t, os.MkdirAll(filepath.Dir(own), 0o700))
	require.NoError(t, os.WriteFile(own, []byte("dev-admin\n"), 0o600))
	conn(own)
	require.Equal(t, "dev-admin", a.token(), "its own token, inside it")
	env["JETFLOW_API"] = "http://elsewhere:1"
	require.Equal(t, "from-config", a.token(), "the api the user names gets the configured token")
}

// TestVersion: jetflow version prints its own build and the api's.
func TestVersion(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	info, _ := stackIn(t, dir)
	api := info.APIURL
	code, out, stderr := jetflow(t, api, "version")
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, out, "jetflow "+svc.Version()+"\n")
	require.Contains(t, out, "api     "+svc.Version()+" ("+api+")", "the api in this process is the same build")

	t.Log("-o json: the local build; the api only when --api or JETFLOW_API names it")
	code, out, stderr = jetflow(t, api, "version", "-o", "json")
	require.Equal(t, ExitOK, code, stderr)
	var v versionInfo
	require.NoError(t, json.Unmarshal([]byte(out), &v), out)
	require.Equal(t, svc.Version(), v.Version)
	require.Equal(t, runtime.Version(), v.GoVersion)
	require.NotNil(t, v.API, out)
	require.Equal(t, apiVersion{URL: api, Version: svc.Version()}, *v.API)

	for name, env := range map[string]map[string]string{
		"NothingNamed":     {},
		"BesideJetflowDev": {"JETFLOW_DATA": dir}, // its api is found, but not named
	} {
		var buf, errBuf bytes.Buffer
		a := &app{getenv: func(k string) string { return env[k] }, stdout: &buf, stderr: &errBuf}
		cmd := a.versionCmd()
		cmd.SetArgs([]string{"-o", "json"})
		require.NoError(t, cmd.Execute(), name)
		var raw map[string]any
		require.NoError(t, json.Unmarshal(buf.Bytes(), &raw), buf.String())
		require.NotContains(t, raw, "api", "%s: asked an api nobody named", name)
		for _, k := range []string{"version", "commit", "go_version", "nats_server"} { // the test binary embeds the server too
			require.Contains(t, raw, k, name)
		}
	}

	t.Log("an api named but not answering: said in the answer, exit 0")
	var buf bytes.Buffer
	a := &app{apiURL: "http://127.0.0.1:1", getenv: func(string) string { return "" }, stdout: &buf, stderr: &buf}
	cmd := a.versionCmd()
	cmd.SetArgs([]string{"-o", "json"})
	require.NoError(t, cmd.Execute())
	var down versionInfo
	require.NoError(t, json.Unmarshal(buf.Bytes(), &down), buf.String())
	require.NotNil(t, down.API, buf.String())
	require.Equal(t, "http://127.0.0.1:1", down.API.URL)
	require.Empty(t, down.API.Version)
	require.NotEmpty(t, down.API.Error)
}

// TestLocalVersion: the commit comes from what make build stamped, else
// from what Go recorded, with its time and whether the checkout had
// changes; the nats-server release is the one built in.
func TestLocalVersion(t *testing.T) {
	t.Parallel()
	bi := &debug.BuildInfo{Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "3f2a9c1b7d4e5f60718293a4b5c6d7e8f9012345"},
		{Key: "vcs.time", Value: "2026-11-24T15:30:00Z"},
		{Key: "vcs.modified", Value: "true"},
	}, Deps: []*debug.Module{
		{Path: "github.com/nats-io/nats.go", Version: "v1.56.0"},
		{Path: "github.com/nats-io/nats-server/v2", Version: "v2.15.3"},
	}}
	v := localVersion(bi, true)
	require.Equal(t, "v2.15.3", v.NATSServer)
	bi.Deps[1].Replace = &debug.Module{Path: "example.com/nats-server-fork", Version: "v2.15.4-fix"}
	require.Equal(t, "v2.15.4-fix", localVersion(bi, true).NATSServer, "the server built in is the replacement")
	require.Equal(t, "3f2a9c1b7d4e5f60718293a4b5c6d7e8f9012345", v.Commit)
	require.Equal(t, "2026-11-24T15:30:00Z", v.CommitTime)
	require.True(t, v.Modified)
	require.Equal(t, runtime.Version(), v.GoVersion)
	none := localVersion(nil, false)
	require.Equal(t, stampedCommit, none.Commit)
	require.Equal(t, svc.Version(), none.Version)
}

// TestRunOfAnUnregisteredWorkflow: a run of a workflow that is not
// registered says which registered one its name is a slip of, or where
// to find them, and exits as not found.
func TestRunOfAnUnregisteredWorkflow(t *testing.T) {
	t.Parallel()
	api := stack(t).APIURL
	code, _, stderr := jetflow(t, api, "workflow", "apply", "-f", writeFile(t, "name: zebra-feed\nsteps:\n  - id: a\n    kind: noop\n"))
	require.Equal(t, ExitOK, code, stderr)

	code, _, stderr = jetflow(t, api, "run", "zebra-fed")
	require.Equal(t, ExitNotFound, code, stderr)
	require.Contains(t, stderr, `workflow "zebra-fed" is not registered (field workflow, HTTP 404): did you mean "zebra-feed"? (jetflow workflow ls lists them)`)

	code, _, stderr = jetflow(t, api, "run", "quokka-walk")
	require.Equal(t, ExitNotFound, code, stderr)
	require.Contains(t, stderr, `workflow "quokka-walk" is not registered (field workflow, HTTP 404): jetflow workflow ls lists the registered ones`)
}

// TestWorkflowShow: workflow show prints the latest version (or
// --version N) as YAML that workflow apply takes back as the same
// definition (the same version, nothing created), with the versions in a
// comment; -o json is the api's answer; a workflow or version not
// registered is not found, and a version below 1 a usage error.
func TestWorkflowShow(t *testing.T) {
	t.Parallel()
	api := stack(t).APIURL
	v1 := writeFile(t, "name: shown\ndescription: first\nsteps:\n  - id: a\n    kind: noop\n")
	v2 := writeFile(t, "name: shown\ndescription: second <b>\nsteps:\n  - id: a\n    kind: sleep\n    duration: 1s\n")
	for _, f := range []string{v1, v2} {
		code, _, stderr := jetflow(t, api, "workflow", "apply", "-f", f)
		require.Equal(t, ExitOK, code, stderr)
	}

	code, out, stderr := jetflow(t, api, "workflow", "show", "shown")
	require.Equal(t, ExitOK, code, stderr)
	require.True(t, strings.HasPrefix(out, "# shown version 2, stored "), out)
	require.Contains(t, out, "# versions: 1, 2 (--version N shows another)\n")
	require.Contains(t, out, "description: second <b>")
	require.Contains(t, out, "duration: 1s")
	code, applied, stderr := jetflow(t, api, "workflow", "apply", "-f", writeFile(t, out))
	require.Equal(t, ExitOK, code, stderr)
	require.Equal(t, "workflow shown version 2 unchanged\n", applied, "what show prints is the same definition")

	code, out, stderr = jetflow(t, api, "workflow", "show", "shown", "--version", "1")
	require.Equal(t, ExitOK, code, stderr)
	require.Contains(t, out, "# shown version 1, stored ")
	require.Contains(t, out, "kind: noop")
	require.NotContains(t, out, "# versions:")

	code, out, stderr = jetflow(t, api, "workflow", "show", "shown", "-o", "json")
	require.Equal(t, ExitOK, code, stderr)
	var w client.Workflow
	require.NoError(t, json.Unmarshal([]byte(out), &w), out)
	require.Equal(t, []int{1, 2}, w.Versions)
	require.Equal(t, 2, w.Latest.Version)

	code, _, stderr = jetflow(t, api, "workflow", "show", "nope")
	require.Equal(t, ExitNotFound, code, stderr)
	require.Contains(t, stderr, `workflow "nope" is not registered`)
	code, _, stderr = jetflow(t, api, "workflow", "show", "shown", "--version", "7")
	require.Equal(t, ExitNotFound, code, stderr)
	require.Contains(t, stderr, `workflow "shown" has no version 7`)
	code, _, stderr = jetflow(t, api, "workflow", "show", "shown", "--version", "0")
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, "--version 0")
	code, _, stderr = jetflow(t, api, "workflow", "show")
	require.Equal(t, ExitUsage, code, stderr)
	require.Contains(t, stderr, "name the workflow")
}

// TestLsOrder: ls asks for the newest first unless it is given an order
// or a time range (whose time orders it, as the api does).
func TestLsOrder(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 7, 4, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		in   client.ListOptions
		want string
	}{
		{"Default", client.ListOptions{Workflow: "hello", Status: "failed"}, "started_desc"},
		{"Given", client.ListOptions{Sort: "id"}, "id"},
		{"StartedAfter", client.ListOptions{StartedAfter: at}, ""},
		{"StartedBefore", client.ListOptions{StartedBefore: at}, ""},
		{"EndedAfter", client.ListOptions{EndedAfter: at}, ""},
		{"EndedBefore", client.ListOptions{EndedBefore: at}, ""},
		{"GivenWithARange", client.ListOptions{Sort: "started_asc", EndedAfter: at}, "started_asc"},
	} {
		got := lsOrder(tc.in)
		require.Equal(t, tc.want, got.Sort, tc.name)
		got.Sort = tc.in.Sort
		require.Equal(t, tc.in, got, "%s: only the order is set", tc.name)
	}
}
