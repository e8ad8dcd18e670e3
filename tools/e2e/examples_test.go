package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/tools/internal/devstack"
)

// exampleRun is one execution of an example: its input, the signals sent
// to it after it started, the status it must end in, and what else to check.
type exampleRun struct {
	input map[string]any
	// version is the version to start (0: the latest).
	version int
	signals []exampleSignal
	want    projections.Status
	// resume, if set, resumes the execution, once it ended in status
	// first, on that version; want and check then apply to the end of
	// the resumed run.
	resume events.TargetVersion
	first  projections.Status
	// runs, if over 1, is how many runs a continue-as-new chain makes:
	// each run must end succeeded, continued as the next; want and check
	// apply to the last.
	runs  int
	check func(t *testing.T, x projections.Execution)
	// listedBy are search attribute filters (name:value) that must list
	// the execution, once it ended.
	listedBy [][]string
}

type exampleSignal struct {
	name string
	data string // JSON, "" for none
}

// exampleRuns lists, per file of examples/, how to run it. Every file must
// have an entry: a new example without one fails the test.
var exampleRuns = map[string][]exampleRun{
	"hello.yaml": {{
		want: projections.StatusSucceeded,
		check: func(t *testing.T, x projections.Execution) {
			require.JSONEq(t, `"ok"`, jsonField(t, stepByID(t, x, "health").Output, "json", "status"))
		},
	}},
	"slow.yaml": {{want: projections.StatusSucceeded}},
	"local.yaml": {{
		input: map[string]any{"who": "ada"},
		want:  projections.StatusSucceeded,
		check: func(t *testing.T, x projections.Execution) {
			// The log steps ran in the dispatcher, the exec on an agent.
			require.Equal(t, workflow.LocalQueue, stepByID(t, x, "begin").Queue)
			require.Equal(t, workflow.DefaultQueue, stepByID(t, x, "work").Queue)
			require.JSONEq(t, `"starting for ada"`, jsonField(t, stepByID(t, x, "begin").Output, "message"))
			require.JSONEq(t, `"done: working for ada\n"`, string(stepByID(t, x, "end").Output))
		},
	}},
	"invoice.yaml": {
		{input: map[string]any{"customer": "acme", "amount": 120}, want: projections.StatusSucceeded,
			listedBy: [][]string{{"customer:acme"}, {"customer:acme", "tier:gold"}}},
		{input: map[string]any{"customer": "acme", "amount": 30}, want: projections.StatusSucceeded,
			check: func(t *testing.T, x projections.Execution) {
				require.JSONEq(t, `"standard"`, string(x.Vars["tier"]))
			},
			listedBy: [][]string{{"customer:acme", "tier:standard"}}},
	},
	"watchdog.yaml": {{
		want: projections.StatusSucceeded,
		check: func(t *testing.T, x projections.Execution) {
			require.GreaterOrEqual(t, stepByID(t, x, "fetch").Attempt, 2, "the hung first attempt was retried")
			require.JSONEq(t, `"fetched"`, string(x.Output))
		},
	}},
	"ping.yaml": {{want: projections.StatusSucceeded}},
	"chain.yaml": {{
		// The api authenticates its callers: the step sends the token the
		// development agent holds as a secret (scoped to start and read).
		want: projections.StatusSucceeded,
		check: func(t *testing.T, x projections.Execution) {
			require.JSONEq(t, `201`, jsonField(t, stepByID(t, x, "start-hello").Output, "status"))
		},
	}},
	"fails.yaml": {{
		want: projections.StatusFailed,
		check: func(t *testing.T, x projections.Execution) {
			require.Contains(t, x.Error, "exit status 3")
			require.Equal(t, projections.OpNone, stepByID(t, x, "never").Status)
		},
	}},
	"provision.yaml": {
		{
			input: map[string]any{"host": "web-1", "size": "large", "replicas": 2},
			want:  projections.StatusSucceeded,
			check: func(t *testing.T, x projections.Execution) {
				require.JSONEq(t, `{"host":"web-1.example.internal","replicas":2,"setup":"configured web-1.example.internal x2",
					"setup_attempts":2,"registered":false,"health":"ok"}`, string(x.Output))
				require.Equal(t, projections.OpSucceeded, stepByID(t, x, "reserve").Status)
				// The inventory answers 404, which its retry policy does not
				// retry: on-error recovers the step, whose failure stays recorded.
				reg := stepByID(t, x, "register")
				require.Equal(t, projections.OpFailed, reg.Status)
				require.Equal(t, 1, reg.Attempt)
				require.Contains(t, reg.Error, "status 404")
				warn := stepByID(t, x, "register/on-error1/warn")
				require.Equal(t, projections.OpSucceeded, warn.Status)
				require.Contains(t, jsonField(t, warn.Output, "message"), "web-1.example.internal is not in the inventory")
				require.Equal(t, projections.OpSucceeded, stepByID(t, x, "health").Status)
			},
		},
		{
			input: map[string]any{"host": "web-2", "dry_run": true},
			want:  projections.StatusSucceeded,
			check: func(t *testing.T, x projections.Execution) {
				require.Equal(t, projections.OpSkipped, stepByID(t, x, "reserve").Status)
				require.Equal(t, projections.OpSkipped, stepByID(t, x, "setup").Status)
				require.Equal(t, projections.OpSkipped, stepByID(t, x, "register").Status)
				require.JSONEq(t, `{"host":"web-2.example.internal","replicas":1,"setup":null,"setup_attempts":0,"registered":false,"health":"ok"}`, string(x.Output))
			},
		},
	},
	"fanout.yaml": {
		{
			input: map[string]any{"hosts": []string{"web-1", "web-2", "web-3", "web-4", "web-5"}, "release": "v2"},
			want:  projections.StatusSucceeded,
			check: func(t *testing.T, x projections.Execution) {
				require.JSONEq(t, `{"deployed":[
					{"host":"web-1","slot":0,"release":"v2"},{"host":"web-2","slot":1,"release":"v2"},
					{"host":"web-3","slot":2,"release":"v2"},{"host":"web-4","slot":3,"release":"v2"},
					{"host":"web-5","slot":4,"release":"v2"}],
					"hosts":5,"health":"ok","announced":"info"}`, string(x.Output))
				for i := range 5 {
					require.Equal(t, projections.OpSucceeded, stepByID(t, x, fmt.Sprintf("deploy[%d]/push", i)).Status)
					require.JSONEq(t, fmt.Sprintf(`"pushed v2 to web-%d"`, i+1), string(stepByID(t, x, fmt.Sprintf("deploy[%d]/push", i)).Output))
				}
				require.Equal(t, projections.OpSucceeded, stepByID(t, x, "announce/default/note").Status)
				// At most two hosts at a time (concurrency 2): when an item
				// starts, at most one other item is between its start and its end.
				for k := range 5 {
					start, busy := stepByID(t, x, fmt.Sprintf("deploy[%d]/push", k)).ScheduledAt, 0
					for j := range 5 {
						from, to := stepByID(t, x, fmt.Sprintf("deploy[%d]/push", j)).ScheduledAt, stepByID(t, x, fmt.Sprintf("deploy[%d]/verify", j)).EndedAt
						if j != k && !start.Before(from) && start.Before(to) {
							busy++
						}
					}
					require.LessOrEqual(t, busy, 1, "item %d started while %d other items ran", k, busy)
				}
			},
		},
		{
			input: map[string]any{"hosts": []string{"db-1"}, "env": "production"},
			want:  projections.StatusSucceeded,
			check: func(t *testing.T, x projections.Execution) {
				require.JSONEq(t, `{"deployed":[{"host":"db-1","slot":0,"release":"v1"}],"hosts":1,"health":"ok","announced":"warn"}`, string(x.Output))
				require.Equal(t, projections.OpSucceeded, stepByID(t, x, "announce/case0/page").Status)
			},
		},
	},
	"increment.yaml": {{
		input: map[string]any{"file": exampleCounter},
		want:  projections.StatusSucceeded,
		check: func(t *testing.T, x projections.Execution) {
			b, err := os.ReadFile(exampleCounter)
			require.NoError(t, err)
			require.NoError(t, os.Remove(exampleCounter))
			require.Equal(t, "1", strings.TrimSpace(string(b)))
			require.JSONEq(t, `1`, string(x.Output))
		},
	}},
	"retention.yaml": {
		{
			input: map[string]any{"host": "web-1"},
			want:  projections.StatusSucceeded,
			check: func(t *testing.T, x projections.Execution) {
				require.JSONEq(t, `{"host":"web-1","result":"provisioned web-1"}`, string(x.Output))
				require.Equal(t, "parent", x.Retention, "the last step restored the default")
				require.Equal(t, "provision-vm", x.RetentionKey)
			},
		},
		{
			input: map[string]any{"host": "web-2", "fail": true},
			want:  projections.StatusFailed,
			check: func(t *testing.T, x projections.Execution) {
				require.Equal(t, "forever", x.Retention)
				require.Equal(t, "provision-vm failed", x.RetentionKey)
			},
		},
	},
	"lock-checking.yaml": {{
		// Nobody holds the lock: claim gets it at once (TestLockCheckingSeedExample clears a holder).
		want: projections.StatusSucceeded,
		check: func(t *testing.T, x projections.Execution) {
			require.Equal(t, projections.OpSucceeded, stepByID(t, x, "claim/got-it").Status)
			require.Equal(t, projections.OpNone, stepByID(t, x, "clear").Status)
		},
	}},
	"trip.yaml": {
		{
			input: map[string]any{"city": "Lyon", "fail": true}, want: projections.StatusFailed,
			check: func(t *testing.T, x projections.Execution) {
				require.Equal(t, "step pay failed: command sh: exit status 2", x.Error)
				require.NotNil(t, x.Compensation)
				require.Equal(t, projections.CompensationFinished, x.Compensation.Status)
				require.Equal(t, []string{"car", "hotel"}, x.Compensation.Steps, "the latest booking first")
				hotel, car := stepByID(t, x, "hotel/compensate/cancel-hotel"), stepByID(t, x, "car/compensate/cancel-car")
				require.True(t, car.EndedAt.Before(hotel.StartedAt) || car.EndedAt.Equal(hotel.StartedAt), "car is cancelled before the hotel")
				require.Contains(t, string(hotel.Output), "in Lyon")
			},
		},
		{
			input: map[string]any{"city": "Lyon"}, want: projections.StatusSucceeded,
			check: func(t *testing.T, x projections.Execution) { require.Nil(t, x.Compensation) },
		},
	},
	"countdown.yaml": {{
		input: map[string]any{"n": 2}, runs: 3, want: projections.StatusSucceeded,
		check: func(t *testing.T, x projections.Execution) {
			require.JSONEq(t, `"reached zero in run 3"`, string(x.Output))
			require.Equal(t, "example-countdown-1", x.Chain)
			require.Equal(t, "example-countdown-1-run2", x.ContinuedFrom)
			require.Empty(t, x.ContinuedAs)
		},
	}},
	"upgrade-v1.yaml": {{
		// Fails on version 1; resumed on version 2, fetch is kept.
		version: 1, first: projections.StatusFailed, resume: 2, want: projections.StatusSucceeded,
		check: func(t *testing.T, x projections.Execution) {
			require.Equal(t, 2, x.Version)
			require.Equal(t, 1, stepByID(t, x, "fetch").Attempt, "fetch was not run again")
			require.Len(t, x.RetiredSteps, 1)
			require.Equal(t, "convert", x.RetiredSteps[0].ID)
			var out map[string]string
			require.NoError(t, json.Unmarshal(x.Output, &out))
			require.Equal(t, "converted "+out["fetched"], out["converted"])
		},
	}},
	"upgrade-v2.yaml": {{want: projections.StatusSucceeded}},
	"shipping.yaml": {{
		input: map[string]any{"order": "s-1"}, want: projections.StatusSucceeded,
		check: func(t *testing.T, x projections.Execution) {
			require.JSONEq(t, `{"packed":"packed 1 parcels of s-1","label":"label-s-1"}`, string(x.Output))
			require.Nil(t, x.Parent)
		},
	}},
	"order.yaml": {
		{
			input: map[string]any{"order": "o-1"}, want: projections.StatusSucceeded,
			check: func(t *testing.T, x projections.Execution) {
				require.JSONEq(t, `"o-1 shipped with label-o-1"`, string(x.Output))
				ship := stepByID(t, x, "ship")
				require.Regexp(t, `^example-order-1-ship-[0-9a-f]{16}$`, ship.Child)
				require.Equal(t, "shipping", ship.ChildWorkflow)
			},
		},
		{
			input: map[string]any{"order": "o-2", "fail": true}, want: projections.StatusFailed,
			check: func(t *testing.T, x projections.Execution) {
				ship := stepByID(t, x, "ship")
				require.Equal(t, projections.OpFailed, ship.Status)
				require.Equal(t, "child execution "+ship.Child+" failed: step broken failed: no label printer for o-2", ship.Error)
			},
		},
	},
	"locks.yaml": {
		{
			input: map[string]any{"host": "web-1"},
			want:  projections.StatusSucceeded,
			check: func(t *testing.T, x projections.Execution) {
				require.Len(t, x.Locks, 2)
				for _, l := range x.Locks {
					require.Equal(t, projections.LockReleased, l.Status, l.Name)
				}
				require.Equal(t, "apt-web-1", x.Locks[0].Name)
				require.Equal(t, "shared-db", x.Locks[1].Name)
				require.Equal(t, 2, x.Locks[1].Limit)
				require.Contains(t, string(stepByID(t, x, "install/upgrade").Output), "apt-get upgrade on web-1")
			},
		},
		{input: map[string]any{"host": "web-1"}, want: projections.StatusSucceeded},
		{input: map[string]any{"host": "web-2"}, want: projections.StatusSucceeded},
	},
	"secrets.yaml": {{
		input: map[string]any{"user": "alice", "password": "hunter2-in-the-example"},
		want:  projections.StatusSucceeded,
		check: func(t *testing.T, x projections.Execution) {
			require.JSONEq(t, fmt.Sprintf(`{"said":"alice has a token of %d characters: [secret API_TOKEN]","status":200}`, len(exampleToken)),
				string(x.Output), "the agent had the secret; what it reported masks it")
			require.JSONEq(t, `{"user":"alice","password":"[redacted]"}`, string(x.Input))
			b, err := json.Marshal(x)
			require.NoError(t, err)
			require.NotContains(t, string(b), exampleToken)
			require.NotContains(t, string(b), "hunter2-in-the-example")
		},
	}},
	"approval.yaml": {
		{
			input: map[string]any{"change": "resize db-1", "amount": 120, "window": "10ms"},
			signals: []exampleSignal{
				{"approve", `{"by":"mallory"}`}, // not an approver: kept, never taken
				{"approve", `{"by":"alice","note":"go ahead"}`},
			},
			want: projections.StatusSucceeded,
			check: func(t *testing.T, x projections.Execution) {
				require.JSONEq(t, `{"change":"resize db-1","approved_by":"alice","note":"go ahead","result":"applied: resize db-1"}`, string(x.Output))
				require.Len(t, x.Signals, 2)
				require.Empty(t, x.Signals[0].TakenBy)
				require.Equal(t, "decision", x.Signals[1].TakenBy)
			},
		},
		{
			input:   map[string]any{"change": "drop table", "amount": 5, "approvers": []string{"carol"}},
			signals: []exampleSignal{{"reject", `{"by":"carol","note":"not on a Friday"}`}},
			want:    projections.StatusFailed,
			check: func(t *testing.T, x projections.Execution) {
				require.Contains(t, x.Error, "drop table was rejected by carol: not on a Friday")
				require.Equal(t, projections.OpNone, stepByID(t, x, "apply").Status)
			},
		},
	},
}

// exampleToken is the secret API_TOKEN of secrets.yaml's run, written
// into the stack's secrets directory as a user would.
const exampleToken = "tok-3f9a1c7e-example"

// exampleCounter is the counter file of increment.yaml's run.
var exampleCounter = filepath.Join(os.TempDir(), fmt.Sprintf("jetflow-example-count-%d", os.Getpid()))

// jsonField returns the JSON of the member at path in doc.
func jsonField(t *testing.T, doc json.RawMessage, path ...string) string {
	t.Helper()
	var v any
	require.NoError(t, json.Unmarshal(doc, &v), "%s", doc)
	for _, p := range path {
		m, ok := v.(map[string]any)
		require.True(t, ok, "no %q in %s", p, doc)
		v = m[p]
	}
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// TestExamplesRunToCompletion applies every file of examples/ as it is,
// on a stack whose ports are not the defaults (the examples reach the api
// through workflow.api_url, never a fixed address), runs each as its table
// entry says, and checks how it ends.
func TestExamplesRunToCompletion(t *testing.T) {
	t.Parallel()
	const dir = "../../examples"
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var files []string
	for _, e := range entries {
		if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
			files = append(files, e.Name())
		}
	}
	require.NotEmpty(t, files)
	for f := range exampleRuns {
		require.Contains(t, files, f, "exampleRuns names a file that is not in examples/")
	}

	s := startStack(t, func(cfg *devstack.Config) {
		dir := devstack.SecretsDir(cfg.DataDir)
		require.NoError(t, os.MkdirAll(dir, 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "API_TOKEN"), []byte(exampleToken+"\n"), 0o600))
	})
	require.NotContains(t, s.info.APIURL, ":8080")
	ctx := context.Background()
	names := map[string]string{}
	for _, f := range files { // apply them all first: chain.yaml starts hello
		b, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		a, err := s.c.ApplyWorkflow(ctx, b)
		require.NoError(t, err, "examples/%s is not a valid definition", f)
		names[f] = a.Name
	}

	for _, f := range files {
		runs, ok := exampleRuns[f]
		if !ok {
			t.Errorf("examples/%s has no entry in exampleRuns (tools/e2e/examples_test.go): add how to run it and how it ends", f)
			continue
		}
		for i, r := range runs {
			id := fmt.Sprintf("example-%s-%d", strings.TrimSuffix(f, filepath.Ext(f)), i+1)
			t.Run(id, func(t *testing.T) {
				t.Parallel()
				_, err := s.c.Start(ctx, client.StartRequest{Workflow: names[f], Version: r.version, ID: id, Input: r.input})
				require.NoError(t, err)
				for _, sig := range r.signals {
					var data json.RawMessage
					if sig.data != "" {
						data = json.RawMessage(sig.data)
					}
					_, err := s.c.Signal(ctx, id, sig.name, data)
					require.NoError(t, err, "signal %s", sig.name)
				}
				x := s.waitDone(t, id, 30*time.Second)
				if r.resume != 0 {
					require.Equal(t, r.first, x.Status, "examples/%s before the resume: %s", f, x.Error)
					_, err := s.c.Act(ctx, id, client.ActionRequest{Action: events.ActionResume, Version: r.resume})
					require.NoError(t, err)
					poll(t, doneAtLeast, id+" resumed runs to its end", func() (bool, string) {
						x, err = s.c.Execution(ctx, id)
						if err != nil {
							return false, err.Error()
						}
						return x.Resumes > 0 && x.Status.Terminal(), describe(x)
					})
				}
				for run := 2; run <= r.runs; run++ {
					require.Equal(t, projections.StatusSucceeded, x.Status, "examples/%s run %d: %s", f, run-1, x.Error)
					require.Equal(t, fmt.Sprintf("%s-run%d", id, run), x.ContinuedAs, "examples/%s run %d", f, run-1)
					x = s.waitDone(t, x.ContinuedAs, 30*time.Second)
					require.Equal(t, run, x.Run)
				}
				require.Equal(t, r.want, x.Status, "examples/%s: %s", f, x.Error)
				if r.check != nil {
					r.check(t, x)
				}
				for _, attrs := range r.listedBy {
					poll(t, 30*time.Second, fmt.Sprintf("%s listed by %v", x.ID, attrs), func() (bool, string) {
						list, _, err := s.c.ListExecutions(ctx, client.ListOptions{Attrs: attrs, Status: string(r.want), Limit: 1000})
						if err != nil {
							return false, err.Error()
						}
						return slices.Contains(listIDs(list), x.ID), fmt.Sprint(listIDs(list))
					})
				}
			})
		}
	}
}
