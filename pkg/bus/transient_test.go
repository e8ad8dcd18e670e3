package bus_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
)

func TestTransient(t *testing.T) {
	for _, err := range []error{
		context.DeadlineExceeded, nats.ErrTimeout, nats.ErrNoResponders, nats.ErrConnectionReconnecting,
		jetstream.ErrNoStreamResponse, jetstream.ErrJetStreamNotEnabled, // 503: a server still starting
		fmt.Errorf("publish start: %w", jetstream.ErrNoStreamResponse),
		&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"},
		// The same publish sent again while a replicated stream stores it.
		fmt.Errorf("append: %w", &jetstream.APIError{Code: 409, ErrorCode: 10158, Description: "duplicate message id is in process"}),
	} {
		require.True(t, bus.Transient(err), "%v", err)
	}
	require.True(t, bus.InProcess(fmt.Errorf("append: %w", &jetstream.APIError{Code: 409, ErrorCode: 10158})))
	require.False(t, bus.InProcess(&jetstream.APIError{Code: 400, ErrorCode: 10071}))
	require.False(t, bus.InProcess(nil))
	for _, err := range []error{
		nil, errors.New("boom"), context.Canceled, jetstream.ErrStreamNotFound, jetstream.ErrMsgNotFound,
		&jetstream.APIError{Code: 400, ErrorCode: 10071, Description: "wrong last sequence: 4"},
		nats.ErrMaxPayload,
	} {
		require.False(t, bus.Transient(err), "%v", err)
	}
}

// TestKeyChanged: every way a refused compare-and-set on a key comes back
// is one, including the raw 10164 nats.go returns when Create retries on a
// deleted key of a replicated bucket; other failures are not.
func TestKeyChanged(t *testing.T) {
	t.Parallel()
	for _, err := range []error{
		jetstream.ErrKeyExists,
		fmt.Errorf("create: %w", jetstream.ErrKeyExists),
		jetstream.ErrKeyRevisionMismatch,
		&jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence},
		fmt.Errorf("create: %w", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant}),
	} {
		require.True(t, bus.KeyChanged(err), "%v", err)
	}
	for _, err := range []error{
		nil,
		jetstream.ErrKeyNotFound,
		context.DeadlineExceeded,
		nats.ErrNoResponders,
		&jetstream.APIError{Code: 503, ErrorCode: 10008},
		errors.New("wrong last sequence"),
	} {
		require.False(t, bus.KeyChanged(err), "%v", err)
	}
}

// TestClosedWhileMade: the server's answer to a create of a consumer
// deleted meanwhile is made again by Bind; other create errors are not.
func TestClosedWhileMade(t *testing.T) {
	closed := &jetstream.APIError{Code: 500, ErrorCode: jetstream.JSErrCodeConsumerCreate, Description: "consumer closed"}
	require.True(t, bus.ClosedWhileMade(fmt.Errorf("create consumer x on S: %w", closed)))
	other := &jetstream.APIError{Code: 500, ErrorCode: jetstream.JSErrCodeConsumerCreate, Description: "deliver subject not valid"}
	require.False(t, bus.ClosedWhileMade(other))
	require.False(t, bus.ClosedWhileMade(errors.New("consumer closed")))
}

// noPeers is what a cluster that has just formed answers to a replicated
// stream before its meta leader counts every server online.
var noPeers = &jetstream.APIError{Code: 500, ErrorCode: 10005, Description: "no suitable peers for placement"}

func TestPlacing(t *testing.T) {
	require.True(t, bus.Placing(fmt.Errorf("ensure stream JF_EVENTS: %w", noPeers)))
	require.False(t, bus.Transient(noPeers), "not transient for every caller: only the topology's making waits for it")
	require.False(t, bus.Placing(&jetstream.APIError{Code: 400, ErrorCode: 10058, Description: "stream name already in use"}))
	require.False(t, bus.Placing(nats.ErrTimeout))
	require.False(t, bus.Placing(nil))
}

// TestTheLayoutIsMadeAgainWhileAClusterPlacesItsReplicas: the bootstrap
// tries again a placement refused, or a transient failure, within its
// patience; any other refusal ends it at once; a placement still refused
// after its patience is returned with what to check, as the same error.
func TestTheLayoutIsMadeAgainWhileAClusterPlacesItsReplicas(t *testing.T) {
	t.Parallel()
	calls, told := 0, 0
	err := bus.RetryLayout(t.Context(), time.Minute, func(error) { told++ }, func() error {
		calls++
		switch calls {
		case 1:
			return fmt.Errorf("ensure stream JF_EVENTS: %w", noPeers)
		case 2: // no meta leader yet
			return &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, 3, calls, "tried until it was made")
	require.Equal(t, 2, told, "each refusal said")

	calls = 0
	refused := &jetstream.APIError{Code: 400, ErrorCode: 10052, Description: "replicas > 1 not supported in non-clustered mode"}
	err = bus.RetryLayout(t.Context(), time.Minute, nil, func() error { calls++; return refused })
	require.ErrorIs(t, err, refused)
	require.Equal(t, 1, calls, "another refusal is not tried again")

	calls = 0
	err = bus.RetryLayout(t.Context(), 0, nil, func() error { calls++; return noPeers })
	require.Equal(t, 1, calls, "no patience left: not tried again")
	require.True(t, bus.Placing(err), "the same error")
	require.ErrorContains(t, err, "as many servers online as the replicas asked for")

	ctx, cancel := context.WithCancel(t.Context())
	calls = 0
	err = bus.RetryLayout(ctx, time.Minute, func(error) { cancel() }, func() error { calls++; return noPeers })
	require.True(t, bus.Placing(err))
	require.Equal(t, 1, calls, "a context that ends stops it")
}

// TestTheLayoutIsNotWaitedForWhereWaitingCannotHelp: an account without
// JetStream, a closed connection, or a request with no answer at all (a
// permission refused) fails the bootstrap at once, as before.
func TestTheLayoutIsNotWaitedForWhereWaitingCannotHelp(t *testing.T) {
	t.Parallel()
	for _, refused := range []error{
		jetstream.ErrJetStreamNotEnabledForAccount, jetstream.ErrJetStreamNotEnabled,
		&jetstream.APIError{Code: 503, ErrorCode: 10039, Description: "jetstream not enabled for account"},
		nats.ErrConnectionClosed, nats.ErrTimeout, context.DeadlineExceeded,
	} {
		calls := 0
		err := bus.RetryLayout(t.Context(), time.Minute, nil, func() error { calls++; return fmt.Errorf("ensure stream: %w", refused) })
		require.ErrorIs(t, err, refused)
		require.Equal(t, 1, calls, "%v: not tried again", refused)
	}
}

// TestTheLayoutWaitSaysWhyOnceAndStopsInTime: the same refusal is told
// once within 5 s; a patience of 1.2 s ends the tries after it.
func TestTheLayoutWaitSaysWhyOnceAndStopsInTime(t *testing.T) {
	t.Parallel()
	calls, told := 0, 0
	began := time.Now()
	err := bus.RetryLayout(t.Context(), 1200*time.Millisecond, func(error) { told++ }, func() error { calls++; return noPeers })
	require.True(t, bus.Placing(err))
	require.GreaterOrEqual(t, time.Since(began), 1200*time.Millisecond, "tried until its patience ran out")
	require.GreaterOrEqual(t, calls, 3, "tried every half second")
	require.LessOrEqual(t, calls, 4, "and no longer")
	require.Equal(t, 1, told, "the same refusal told once")
}
