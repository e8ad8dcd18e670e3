package redact_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/redact"
)

func TestReplacer(t *testing.T) {
	t.Parallel()
	r := redact.New(map[string]string{"s3cr3t": "[secret T]", "s3cr3t-long": "[secret L]", "4242": "[secret N]", "": "[never]"})

	tests := []struct {
		name, in, want string
	}{
		{"Plain", "token=s3cr3t;", "token=[secret T];"},
		{"Twice", "s3cr3ts3cr3t", "[secret T][secret T]"},
		{"LongerWins", "a s3cr3t-long b", "a [secret L] b"},
		{"Nothing", "nothing here", "nothing here"},
		{"Empty", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, r.String(tc.in))
		})
	}

	t.Run("Tail", func(t *testing.T) {
		t.Parallel()
		r := redact.New(map[string]string{"s3cr3t": "[secret T]"})
		require.Equal(t, "out: [secret T]", r.Tail("out: s3cr"), "a value cut by a size limit")
		require.Equal(t, "[secret T] and [secret T]", r.Tail("s3cr3t and s3"))
		require.Equal(t, "no value", r.Tail("no value"))
	})
	t.Run("JSON", func(t *testing.T) {
		t.Parallel()
		require.JSONEq(t, `{"stdout":"x [secret T]\n","n":"[secret N]","m":42,"[secret T]":["[secret T]",1],"html":"<&>"}`,
			string(r.JSON(json.RawMessage(`{"stdout":"x s3cr3t\n","n":4242,"m":42,"s3cr3t":["s3cr3t",1],"html":"<&>"}`))))
		unchanged := json.RawMessage(`{"b": 1,  "a": "x"}`)
		require.Equal(t, string(unchanged), string(r.JSON(unchanged)), "nothing masked: the bytes are kept")
		require.Equal(t, "not json [secret T]", string(r.JSON(json.RawMessage("not json s3cr3t"))))
		require.Nil(t, r.JSON(nil))
	})
	t.Run("Idempotent", func(t *testing.T) {
		t.Parallel()
		r := redact.New(map[string]string{"red": redact.Mask, "secret": "[secret X]", "ac": redact.Mask})
		once := r.String("red tape, a secret, an act")
		require.Equal(t, "[redacted] tape, a [secret X], an [redacted]t", once)
		require.Equal(t, once, r.String(once), "masking again changes nothing")
		raw := r.JSON(json.RawMessage(`{"a":"red"}`))
		require.Equal(t, string(raw), string(r.JSON(raw)))
	})
	t.Run("Nil", func(t *testing.T) {
		t.Parallel()
		var none *redact.Replacer
		require.Nil(t, redact.New(map[string]string{"": "x"}))
		require.Equal(t, "s3cr3t", none.String("s3cr3t"))
		require.Equal(t, "s3", none.Tail("s3"))
		require.Equal(t, `"s3cr3t"`, string(none.JSON(json.RawMessage(`"s3cr3t"`))))
		require.Equal(t, "s3cr3t", none.Value("s3cr3t"))
	})
}

func TestInput(t *testing.T) {
	t.Parallel()
	in := json.RawMessage(`{"user":"bob","password":"hunter2","pin":1234,"db":{"pass":"p@ss","host":"db1"},` +
		`"keys":["k1","k2"],"tokens":{"a":"ta","b":{"deep":"tb"}},"flag":true,"missing_is_fine":null}`)

	tests := []struct {
		name   string
		paths  [][]string
		want   string
		values []string
	}{
		{"None", nil, string(in), nil},
		{"Member", [][]string{{"password"}}, `"password":"[redacted]"`, []string{"hunter2"}},
		{"Number", [][]string{{"pin"}}, `"pin":"[redacted]"`, []string{"1234"}},
		{"Nested", [][]string{{"db", "pass"}}, `"db":{"host":"db1","pass":"[redacted]"}`, []string{"p@ss"}},
		{"Items", [][]string{{"keys", "*"}}, `"keys":["[redacted]","[redacted]"]`, []string{"k1", "k2"}},
		{"AnyMemberObject", [][]string{{"tokens", "*"}}, `"tokens":{"a":"[redacted]","b":"[redacted]"}`, []string{"ta", "tb"}},
		{"Boolean", [][]string{{"flag"}}, `"flag":"[redacted]"`, nil},
		{"NullIsLeft", [][]string{{"missing_is_fine"}}, `"missing_is_fine":null`, nil},
		{"Absent", [][]string{{"nope"}, {"db", "nope"}, {"user", "x"}}, string(in), nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, values := redact.Input(in, tc.paths)
			require.Contains(t, string(out), tc.want)
			require.ElementsMatch(t, tc.values, values)
		})
	}
	out, values := redact.Input(in, [][]string{{}})
	require.Equal(t, `"[redacted]"`, string(out))
	require.Contains(t, values, "hunter2")
	require.Contains(t, values, "1234")
}

// TestInputsHideWriteOnlyValues: an execution's read model and events show
// a writeOnly input member masked in the input and its value masked
// wherever else it appears.
func TestInputsHideWriteOnlyValues(t *testing.T) {
	t.Parallel()
	start := &events.ExecutionStarted{Workflow: "login", Version: 1,
		Definition: json.RawMessage(`{"name":"login","input":{"type":"object","properties":{"user":{"type":"string"},` +
			`"password":{"type":"string","writeOnly":true}}},"steps":[{"id":"a","kind":"noop"}]}`),
		Input: json.RawMessage(`{"user":"bob","password":"hunter2"}`)}
	in := redact.ForStart(start)
	require.False(t, in.Empty())

	x := projections.Execution{ID: "x1", Input: start.Input, Output: json.RawMessage(`"logged in with hunter2"`),
		Error: "step a: hunter2 refused",
		Steps: []projections.Step{{ID: "a", Input: json.RawMessage(`{"args":["--password","hunter2"]}`),
			Output: json.RawMessage(`{"stdout":"hunter2\n"}`), Error: "exit 1: hunter2"}},
		Vars:         map[string]json.RawMessage{"pw": json.RawMessage(`"hunter2"`), "user": json.RawMessage(`"bob"`)},
		Signals:      []projections.Signal{{ID: "s", Data: json.RawMessage(`{"echo":"hunter2"}`)}},
		Cancellation: &projections.Cancellation{Reason: "hunter2 leaked"},
		Replays:      []projections.Replay{{Reason: "again hunter2"}},
		// Left behind by a move to another version, with their values.
		RetiredSteps:   []projections.Step{{ID: "old", Input: json.RawMessage(`{"args":["--password","hunter2"]}`), Error: "hunter2 refused"}},
		VersionChanges: []projections.VersionChange{{From: 1, To: 2, Reason: "hunter2 fixed"}},
	}
	before, err := json.Marshal(x)
	require.NoError(t, err)
	shown := in.Execution(x)
	b, err := json.Marshal(shown)
	require.NoError(t, err)
	require.NotContains(t, string(b), "hunter2")
	require.JSONEq(t, `{"user":"bob","password":"[redacted]"}`, string(shown.Input))
	require.True(t, shown.Redacted)
	require.JSONEq(t, `"bob"`, string(shown.Vars["user"]))
	after, err := json.Marshal(x)
	require.NoError(t, err)
	require.Equal(t, string(before), string(after), "the execution given is not modified")

	data, err := json.Marshal(start)
	require.NoError(t, err)
	shownData := in.EventData(events.TypeExecutionStarted, data)
	require.NotContains(t, string(shownData), "hunter2")
	require.Contains(t, string(shownData), `"password":"[redacted]"`)
	require.Contains(t, string(in.EventData(events.TypeStepSucceeded, json.RawMessage(`{"output":"hunter2!"}`))), `[redacted]!`)

	// A workflow without writeOnly members hides nothing, and costs nothing.
	plain := redact.ForStart(&events.ExecutionStarted{Definition: json.RawMessage(`{"name":"p","input":{"type":"object"}}`),
		Input: json.RawMessage(`{"password":"hunter2"}`)})
	require.True(t, plain.Empty())
	require.Equal(t, x, plain.Execution(x))
	require.True(t, redact.ForStart(nil).Empty())
}
