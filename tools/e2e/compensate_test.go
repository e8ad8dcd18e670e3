package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// TestCompensateAnExecution: an operator compensates a trip that
// succeeded (examples/trip.yaml), with the CLI: its bookings are cancelled,
// the car first, and it ends succeeded again, the compensation in its
// history and in jetflow show; it is not compensated twice nor resumed,
// and a running execution is refused over HTTP.
func TestCompensateAnExecution(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	def, err := os.ReadFile(filepath.Join("..", "..", "examples", "trip.yaml"))
	require.NoError(t, err)
	s.apply(t, string(def))
	x := s.runToEnd(t, client.StartRequest{Workflow: "trip", ID: "trip-1", Input: map[string]any{"city": "Lyon"}})
	require.Equal(t, projections.StatusSucceeded, x.Status, describe(x))

	cli := buildJetflow(t)
	out, err := runCmd(ctx, cli, "--api", s.info.APIURL, "--token", s.info.AdminToken, "compensate", "trip-1", "--reason", "trip called off")
	require.NoError(t, err, out)
	require.Contains(t, out, "compensate of execution trip-1")
	poll(t, doneAtLeast, "trip-1 compensated", func() (bool, string) {
		x, err = s.c.Execution(ctx, "trip-1")
		if err != nil {
			return false, err.Error()
		}
		return x.Compensation != nil && x.Compensation.Status != projections.CompensationRunning && x.Status.Terminal(), describe(x)
	})
	require.Equal(t, projections.StatusSucceeded, x.Status, "it ends as it was")
	require.Equal(t, projections.CompensationFinished, x.Compensation.Status)
	require.Equal(t, events.CompensateForOperator, x.Compensation.Cause)
	require.Equal(t, "trip called off", x.Compensation.Reason)
	require.Equal(t, []string{"car", "hotel"}, x.Compensation.Steps)
	car, hotel := stepByID(t, x, "car/compensate/cancel-car"), stepByID(t, x, "hotel/compensate/cancel-hotel")
	require.Equal(t, projections.OpSucceeded, car.Status)
	require.Equal(t, projections.OpSucceeded, hotel.Status)
	require.False(t, hotel.StartedAt.Before(car.EndedAt), "the car first")
	n := countTypes(s.history(t, "trip-1"))
	require.Equal(t, 1, n[string(events.TypeCompensationStarted)])
	require.Equal(t, 1, n[string(events.TypeCompensationFinished)])

	out, err = runCmd(ctx, cli, "--api", s.info.APIURL, "--token", s.info.AdminToken, "show", "trip-1")
	require.NoError(t, err, out)
	require.Regexp(t, `compensation\s+finished \(on operator by `, out)

	for _, action := range []string{events.ActionCompensate, events.ActionResume} {
		_, err = s.c.Act(ctx, "trip-1", client.ActionRequest{Action: action})
		var apiErr *client.Error
		require.True(t, errors.As(err, &apiErr), "%s: %v", action, err)
		require.Equal(t, http.StatusConflict, apiErr.Status, apiErr.Message)
	}

	s.apply(t, `name: napper
steps:
  - {id: nap, kind: sleep, duration: 1h, compensate: [{id: wake, kind: noop}]}
`)
	_, err = s.c.Start(ctx, client.StartRequest{Workflow: "napper", ID: "nap-1"})
	require.NoError(t, err)
	poll(t, doneAtLeast, "nap-1 sleeps", func() (bool, string) {
		x, err := s.c.Execution(ctx, "nap-1")
		if err != nil {
			return false, err.Error()
		}
		st, ok := findStep(x, "nap")
		return ok && st.Status == projections.OpWaiting, describe(x)
	})
	_, err = s.c.Act(ctx, "nap-1", client.ActionRequest{Action: events.ActionCompensate})
	var apiErr *client.Error
	require.True(t, errors.As(err, &apiErr), "%v", err)
	require.Equal(t, http.StatusConflict, apiErr.Status)
	require.Contains(t, apiErr.Message, "compensate applies to an execution that is over")
}
