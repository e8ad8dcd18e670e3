package events_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/events/eventstest"
)

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestSamplesCoverEveryType(t *testing.T) {
	t.Parallel()

	seen := map[events.Type]bool{}
	for _, p := range eventstest.Samples() {
		require.False(t, seen[p.EventType()], "two samples of %s", p.EventType())
		seen[p.EventType()] = true
	}
	for _, typ := range eventstest.Types() {
		require.True(t, seen[typ], "no sample of %s", typ)
	}
	require.Len(t, seen, len(eventstest.Types()))
}

func TestNew(t *testing.T) {
	t.Parallel()

	local := eventstest.At.In(time.FixedZone("X", 3600))
	a := events.New("s", "x1", "wf", local, &events.StepStarted{StepID: "a"})
	b := events.New("s", "x1", "wf", local, &events.StepStarted{StepID: "a"})
	require.NotEqual(t, a.ID, b.ID)
	require.NotEmpty(t, a.ID)
	require.Equal(t, events.TypeStepStarted, a.Type)
	require.Equal(t, time.UTC, a.Time.Location())
	require.True(t, eventstest.At.Equal(a.Time))
}

// TestEncodeStructuredInvalid: an event that is no CloudEvent does not
// encode (the NATS codec's binary mode is tested in pkg/bus).
func TestEncodeStructuredInvalid(t *testing.T) {
	t.Parallel()

	_, err := events.EncodeStructured(events.Event{ID: "1", Type: events.TypeStepStarted, Data: &events.StepStarted{}})
	require.ErrorIs(t, err, events.ErrMalformed, "an event without source is not a CloudEvent")
	_, err = events.EncodeStructured(events.Event{Type: events.TypeStepStarted, Source: "s", Data: &events.StepStarted{}})
	require.ErrorIs(t, err, events.ErrMalformed, "an event without id is not a CloudEvent")
}

func TestIsTerminal(t *testing.T) {
	t.Parallel()

	for _, typ := range eventstest.Types() {
		want := typ == events.TypeExecutionSucceeded || typ == events.TypeExecutionFailed || typ == events.TypeExecutionCancelled
		require.Equal(t, want, typ.IsTerminal(), string(typ))
	}
}

func TestValidWorkflowName(t *testing.T) {
	t.Parallel()

	for name, want := range map[string]bool{
		"a":                           true,
		"deploy":                      true,
		"Deploy-prod_2":               true,
		"a" + strings.Repeat("b", 63): true,
		"a" + strings.Repeat("b", 64): false,
		"":                            false,
		"2deploy":                     false,
		"-deploy":                     false,
		"_deploy":                     false,
		"de.ploy":                     false,
		"de*":                         false,
		"de>":                         false,
		"de ploy":                     false,
		"deploy\n":                    false,
		"\ndeploy":                    false,
		"déploy":                      false,
	} {
		require.Equal(t, want, events.ValidWorkflowName(name), "%q", name)
	}
}

func TestValidExecutionID(t *testing.T) {
	t.Parallel()

	for id, want := range map[string]bool{
		"a":                            true,
		"1":                            true,
		"0abc":                         true,
		"x1-build_2":                   true,
		strings.Repeat("a", 128):       true,
		strings.Repeat("a", 129):       false,
		"":                             false,
		"-x":                           false,
		"_x":                           false,
		"x.y":                          false,
		"x*":                           false,
		">":                            false,
		"x y":                          false,
		"x\n":                          false,
		"x\x00":                        false,
		"ñ":                            false,
		events.DerivedExecutionID("k"): true,
	} {
		require.Equal(t, want, events.ValidExecutionID(id), "%q", id)
	}
}

func TestDerivedExecutionID(t *testing.T) {
	t.Parallel()

	key := events.CommandKey("cli/alice", "42")
	require.Equal(t, "cli/alice#42", key)
	id := events.DerivedExecutionID(key)
	require.Equal(t, id, events.DerivedExecutionID(key))
	require.True(t, strings.HasPrefix(id, "ce-"))
	require.Len(t, id, len("ce-")+24)
	require.True(t, events.ValidExecutionID(id))
	require.NotEqual(t, id, events.DerivedExecutionID(events.CommandKey("cli/alice", "43")))
	require.NotEqual(t, id, events.DerivedExecutionID(events.CommandKey("cli/bob", "42")))
	// Pinned: derived ids are stored forever, so the derivation must never change.
	require.Equal(t, "ce-"+"b5bb9d8014a0f9b1d61e21e7", events.DerivedExecutionID("foo\n"))
}

func TestTaskID(t *testing.T) {
	t.Parallel()

	require.Equal(t, "x1.build.3", events.TaskID("x1", "build", 3))
}

func TestTaskRef(t *testing.T) {
	t.Parallel()

	task := events.Task{TaskID: "x1.a.1", ExecutionID: "x1", Workflow: "wf", StepID: "a", Attempt: 1, Token: "t", Kind: "noop", Queue: "q"}
	require.Equal(t, events.TaskRef{TaskID: "x1.a.1", ExecutionID: "x1", Workflow: "wf", StepID: "a", Attempt: 1,
		Token: "t", Queue: "q", Agent: "ag", Delivery: 2}, task.Ref("ag", 2))
}
