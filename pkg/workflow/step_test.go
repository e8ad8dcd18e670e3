package workflow_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/workflow"
)

func TestRetryDelay(t *testing.T) {
	t.Parallel()

	backoff := func(initial, max string, factor float64) *workflow.Retry {
		return &workflow.Retry{Limit: 5, Backoff: &workflow.Backoff{Initial: initial, Max: max, Factor: factor}}
	}
	tests := []struct {
		name  string
		retry *workflow.Retry
		want  []time.Duration // the delays before attempts 2, 3, 4...
	}{
		{"NoPolicyDoublesFromASecondUpToAMinute", nil,
			[]time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute}},
		{"NoBackoff", &workflow.Retry{Limit: 3}, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}},
		{"Tripling", backoff("500ms", "10s", 3),
			[]time.Duration{500 * time.Millisecond, 1500 * time.Millisecond, 4500 * time.Millisecond, 10 * time.Second, 10 * time.Second}},
		{"Constant", backoff("2s", "", 1), []time.Duration{2 * time.Second, 2 * time.Second, 2 * time.Second}},
		{"FactorBelowOneMeansDoubling", backoff("1s", "5s", 0.5), []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 5 * time.Second}},
		{"InitialAboveTheDefaultMax", backoff("2m", "", 0), []time.Duration{time.Minute, time.Minute}},
		{"UnparsableDurationsKeepTheDefaults", backoff("soon", "later", 2), []time.Duration{time.Second, 2 * time.Second}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			for i, want := range tc.want {
				require.Equal(t, want, tc.retry.Delay(i+1), "delay after attempt %d", i+1)
			}
		})
	}

	t.Run("ManyAttemptsStayAtTheMax", func(t *testing.T) {
		t.Parallel()

		require.Equal(t, 10*time.Second, backoff("1ms", "10s", 10).Delay(1000))
		require.Equal(t, time.Minute, (*workflow.Retry)(nil).Delay(math.MaxInt32))
	})
}

func TestRetryRetries(t *testing.T) {
	t.Parallel()

	onTimeouts := &workflow.Retry{Limit: 3, On: []string{"timed out", "status 503"}}
	tests := []struct {
		name  string
		retry *workflow.Retry
		msg   string
		want  bool
	}{
		{"NoPolicy", nil, "boom", false},
		{"EveryError", &workflow.Retry{Limit: 2}, "boom", true},
		{"Listed", onTimeouts, "attempt 1 timed out after 5s", true},
		{"SecondListed", onTimeouts, "http: status 503 Service Unavailable", true},
		{"NotListed", onTimeouts, "command false: exit status 1", false},
		{"CaseMatters", onTimeouts, "Timed Out", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			require.Equal(t, tc.want, tc.retry.Retries(tc.msg))
		})
	}
}

func TestRetryOf(t *testing.T) {
	t.Parallel()

	wfRetry := &workflow.Retry{Limit: 3}
	own := &workflow.Retry{Limit: 7}
	d := workflow.Definition{Name: "wf", Retry: wfRetry}
	tests := []struct {
		name string
		step workflow.Step
		want *workflow.Retry
	}{
		{"OperationTakesTheWorkflows", workflow.Step{ID: "a", Kind: workflow.KindExec}, wfRetry},
		{"OperationsOwnReplacesIt", workflow.Step{ID: "a", Kind: workflow.KindCall, Retry: own}, own},
		{"DispatcherStepsAreNotRetried", workflow.Step{ID: "a", Kind: workflow.KindWait}, nil},
		{"ARetryStepsPolicyIsNotAnAttemptPolicy", workflow.Step{ID: "a", Kind: workflow.KindRetry, Retry: own}, nil},
		{"ContainersAreNotRetried", workflow.Step{ID: "a", Kind: workflow.KindForeach}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			require.Same(t, tc.want, d.RetryOf(tc.step))
		})
	}
	require.Nil(t, workflow.Definition{Name: "wf"}.RetryOf(workflow.Step{ID: "a", Kind: workflow.KindNoop}))
}

func TestKindClasses(t *testing.T) {
	t.Parallel()

	operations := map[string]bool{workflow.KindNoop: true, workflow.KindLog: true, workflow.KindExec: true, workflow.KindHTTP: true, workflow.KindCall: true}
	containers := map[string]bool{workflow.KindWorkflow: true, workflow.KindForeach: true, workflow.KindParallel: true, workflow.KindSwitch: true}
	require.Len(t, workflow.Kinds, 19)
	for _, k := range workflow.Kinds {
		require.Equal(t, operations[k], workflow.IsOperation(k), k)
		require.Equal(t, containers[k], workflow.IsContainer(k), k)
	}
	require.False(t, workflow.IsOperation("teleport"))
	require.False(t, workflow.IsContainer(""))
}

func TestStepAccessors(t *testing.T) {
	t.Parallel()

	t.Run("OperationKind", func(t *testing.T) {
		t.Parallel()

		require.Equal(t, "resize", workflow.Step{Kind: workflow.KindCall, Operation: "resize"}.OperationKind())
		require.Equal(t, workflow.KindExec, workflow.Step{Kind: workflow.KindExec, Operation: "ignored"}.OperationKind())
	})
	t.Run("WaitSignals", func(t *testing.T) {
		t.Parallel()

		require.Equal(t, []string{"go"}, workflow.Step{Kind: workflow.KindWait, Signal: "go"}.WaitSignals())
		require.Equal(t, []string{"approve", "reject"}, workflow.Step{Kind: workflow.KindWait, Signals: []string{"approve", "reject"}}.WaitSignals())
		require.Empty(t, workflow.Step{Kind: workflow.KindWait}.WaitSignals())
	})
	t.Run("HTTPMethod", func(t *testing.T) {
		t.Parallel()

		require.Equal(t, "GET", workflow.Step{Kind: workflow.KindHTTP}.HTTPMethod())
		require.Equal(t, "PATCH", workflow.Step{Kind: workflow.KindHTTP, Method: "patch"}.HTTPMethod())
	})
	t.Run("QueueName", func(t *testing.T) {
		t.Parallel()

		require.Equal(t, workflow.DefaultQueue, workflow.Step{}.QueueName())
		require.Equal(t, "gpu", workflow.Step{Queue: "gpu"}.QueueName())
	})
}

func TestReplayPolicy(t *testing.T) {
	t.Parallel()

	tests := []struct {
		value string
		want  workflow.ReplayPolicy
	}{
		{"", workflow.ReplayPolicy{}},
		{"enabled", workflow.ReplayPolicy{}},
		{"disabled", workflow.ReplayPolicy{Disabled: true}},
		{"from start", workflow.ReplayPolicy{FromStart: true}},
		{"automatically", workflow.ReplayPolicy{Automatically: true}},
		{"automatically from start", workflow.ReplayPolicy{FromStart: true, Automatically: true}},
		{"from start automatically", workflow.ReplayPolicy{FromStart: true, Automatically: true}},
		{"  Automatically   From  Start ", workflow.ReplayPolicy{FromStart: true, Automatically: true}},
	}
	for _, tc := range tests {
		d := workflow.Definition{Name: "wf", Replayable: tc.value, Steps: []workflow.Step{{ID: "a", Kind: workflow.KindNoop}}}
		require.NoError(t, d.Validate(), "%q", tc.value)
		require.Equal(t, tc.want, d.ReplayPolicy(), "%q", tc.value)
	}
}

func TestReplayMarks(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name     string
		step     workflow.Step
		mark     string
		disabled bool
	}{
		{"None", workflow.Step{Kind: workflow.KindNoop}, "", false},
		{"FromHere", workflow.Step{Kind: workflow.KindExec, Replayable: "From  Here"}, workflow.ReplayFromHere, false},
		{"FromHereOnly", workflow.Step{Kind: workflow.KindLet, Replayable: "from here only"}, workflow.ReplayFromHereOnly, false},
		{"Reset", workflow.Step{Kind: workflow.KindReplayable, Replayable: "reset"}, workflow.ReplayReset, false},
		{"BlockFromStartIsAPoint", workflow.Step{Kind: workflow.KindWorkflow, Replayable: "from start"}, workflow.ReplayFromHere, false},
		{"FromStartOnlyOnABlock", workflow.Step{Kind: workflow.KindNoop, Replayable: "from start"}, "", false},
		{"DisabledBlock", workflow.Step{Kind: workflow.KindWorkflow, Replayable: " Disabled"}, "", true},
		{"DisabledOnlyOnABlock", workflow.Step{Kind: workflow.KindExec, Replayable: "disabled"}, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			require.Equal(t, tc.mark, tc.step.ReplayMark())
			require.Equal(t, tc.disabled, tc.step.ReplayDisabled())
		})
	}
}

func TestIsIdempotent(t *testing.T) {
	t.Parallel()

	tests := []struct {
		kind, idempotent string
		all              bool
		want             bool
	}{
		// External steps are not, unless they or the workflow around them say so.
		{workflow.KindExec, "", false, false},
		{workflow.KindHTTP, "default", false, false},
		{workflow.KindCall, "", true, true},
		{workflow.KindExec, "yes", false, true},
		{workflow.KindExec, "true", false, true},
		{workflow.KindHTTP, "no", true, false},
		{workflow.KindCall, "False", true, false},
		// A fail step never is, unless it says so.
		{workflow.KindFail, "", true, false},
		{workflow.KindFail, "yes", false, true},
		// The others are, unless they say no.
		{workflow.KindNoop, "", false, true},
		{workflow.KindLog, "", false, true},
		{workflow.KindLet, "", false, true},
		{workflow.KindWait, " NO ", false, false},
		{workflow.KindWorkflow, "all", false, true},
	}
	for _, tc := range tests {
		s := workflow.Step{Kind: tc.kind, Idempotent: tc.idempotent}
		require.Equal(t, tc.want, s.IsIdempotent(tc.all), "%s idempotent %q all %v", tc.kind, tc.idempotent, tc.all)
	}
}

func TestIdempotentAll(t *testing.T) {
	t.Parallel()

	require.True(t, workflow.Definition{Idempotent: "all"}.IdempotentAll())
	require.True(t, workflow.Definition{Idempotent: " ALL "}.IdempotentAll())
	require.False(t, workflow.Definition{}.IdempotentAll())
	require.False(t, workflow.Definition{Idempotent: "default"}.IdempotentAll())

	require.True(t, workflow.Step{Kind: workflow.KindWorkflow, Idempotent: "all"}.IdempotentAll())
	require.False(t, workflow.Step{Kind: workflow.KindWorkflow, Idempotent: "yes"}.IdempotentAll())
	require.False(t, workflow.Step{Kind: workflow.KindExec, Idempotent: "all"}.IdempotentAll(), "all applies to blocks only")
}

func TestRetentionNullIsUnset(t *testing.T) {
	t.Parallel()

	d, err := workflow.Parse([]byte(yml(
		"name: wf",
		"retention: ~",
		"steps:",
		"  - {id: a, kind: noop, retention: null}",
		"  - {id: b, kind: noop, retention: 2.5}",
	)))
	var ve *workflow.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Empty(t, d.Retention)
	require.Empty(t, d.Steps[0].Retention)
	require.Equal(t, workflow.Retention("2.5"), d.Steps[1].Retention, "a number is kept as its text")
	require.Len(t, ve.Problems, 1)
	require.Equal(t, "steps[1].retention", ve.Problems[0].Field)
	require.Equal(t, 5, ve.Problems[0].Line)
}

func TestDigestOfAnUnencodableDefinition(t *testing.T) {
	t.Parallel()

	d := workflow.Definition{Name: "wf", Output: math.NaN(), Steps: []workflow.Step{{ID: "a", Kind: workflow.KindNoop}}}
	_, err := d.Canonical()
	require.Error(t, err)
	digest, err := d.Digest()
	require.Error(t, err)
	require.Empty(t, digest)

	var ve *workflow.ValidationError
	require.ErrorAs(t, d.Validate(), &ve, "validation refuses what cannot be stored")
	require.Equal(t, "output", ve.Problems[0].Field)
}
