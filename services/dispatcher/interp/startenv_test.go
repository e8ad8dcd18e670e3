package interp

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/startcheck"
)

// TestStartEnvIsTheDispatchers: a start's retention hash is rendered over
// startcheck.Env, by the api and by the dispatcher: it must be what the
// dispatcher's expressions see of an execution that has just started.
func TestStartEnvIsTheDispatchers(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 14, 10, 0, 0, 123000000, time.FixedZone("CET", 3600))
	for _, input := range []string{`{}`, `{"team":"ops","n":2,"tags":["a"],"deep":{"x":null}}`} {
		x := projections.Execution{ID: "x-1", Workflow: "grouped", Version: 4, Input: json.RawMessage(input), StartedAt: at}
		require.Equal(t, envOf(x), startcheck.Env("x-1", "grouped", 4, json.RawMessage(input), at), input)
	}
}
