package operation_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/operation"
)

func TestRunTurnsAPanicIntoAnError(t *testing.T) {
	h := operation.HandlerFunc(func(context.Context, operation.Task) (any, error) { panic("boom") })
	out, err := operation.Run(t.Context(), h, operation.Task{Kind: "explode"})
	require.Nil(t, out)
	require.EqualError(t, err, "operation explode panicked: boom")
}

func TestFailedKeepsAFailuresOutputAndBoundsTheText(t *testing.T) {
	text, out := operation.Failed(&operation.Failure{Err: errors.New("exit 3"), Output: map[string]int{"code": 3}})
	require.Equal(t, "exit 3", text)
	require.JSONEq(t, `{"code":3}`, string(out))

	text, out = operation.Failed(errors.New(strings.Repeat("x", operation.MaxErrorText+10)))
	require.Nil(t, out)
	require.Equal(t, strings.Repeat("x", operation.MaxErrorText)+"…", text)
}

func TestEncodeOutputAndInputOf(t *testing.T) {
	raw, err := operation.EncodeOutput(nil)
	require.NoError(t, err)
	require.Nil(t, raw)
	_, err = operation.EncodeOutput(func() {})
	require.ErrorContains(t, err, "encode operation output")

	require.JSONEq(t, `{"n":1}`, string(operation.InputOf([]byte(`{"id":"c","input":{"n":1}}`))))
	require.Nil(t, operation.InputOf([]byte(`{"id":"c","input":null}`)))
	require.Nil(t, operation.InputOf([]byte(`{"id":"c"}`)))
	require.Nil(t, operation.InputOf([]byte(`not json`)))
}
