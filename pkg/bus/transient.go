package bus

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// PublishAttempt bounds one attempt of a publish that is sent again when
// it fails (same message id, so an attempt stored after all is not stored
// twice). A publish sent to a stream whose leader just stopped answering
// gets no answer at all; unbounded, it waits the client's whole timeout
// (5 s) and may miss the new leader by that much.
const PublishAttempt = 1500 * time.Millisecond

// ErrBehind: a stream's replica that answered a direct get has not stored
// yet what its leader said is there (history reads, docs/adr/0006). It is
// Transient: asked again, another replica, or the same one a moment
// later, has it.
var ErrBehind = errors.New("the replica that answered has not stored the latest messages yet")

// Transient reports whether err is NATS or JetStream being away, slow or
// between leaders: the same request can succeed a moment later (a
// timeout, no responders, no response from a stream, a connection being
// re-established, a leader being elected, JetStream answering 503, a
// replica behind its leader: ErrBehind). A
// request that failed so is retried, with the same idempotency key, never
// reported as an internal error.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, nats.ErrConnectionClosed),
		errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, nats.ErrDisconnected),
		errors.Is(err, nats.ErrNoServers),
		errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, jetstream.ErrConsumerLeadershipChanged),
		errors.Is(err, jetstream.ErrNoHeartbeat),
		errors.Is(err, ErrBehind):
		return true
	}
	var jerr jetstream.JetStreamError
	if errors.As(err, &jerr) && jerr.APIError() != nil {
		return jerr.APIError().Code == http.StatusServiceUnavailable || InProcess(err)
	}
	var aerr *jetstream.APIError
	return errors.As(err, &aerr) && (aerr.Code == http.StatusServiceUnavailable || InProcess(err))
}

// errCodeInProcess is JetStream's "duplicate message id is in process": a
// replicated stream is still storing a message with the same id (an
// earlier attempt of the same publish), which may yet be stored.
const errCodeInProcess = 10158

// InProcess reports whether err says a publish with the same message id
// is still being stored: the same publish sent again a little later gets
// the stored message's answer (a duplicate), or its refusal.
func InProcess(err error) bool { return apiErrorCode(err) == errCodeInProcess }

// apiErrorCode is the JetStream error code err carries (0 for none), as a
// jetstream.JetStreamError or a *jetstream.APIError.
func apiErrorCode(err error) jetstream.ErrorCode {
	var jerr jetstream.JetStreamError
	if errors.As(err, &jerr) && jerr.APIError() != nil {
		return jerr.APIError().ErrorCode
	}
	var aerr *jetstream.APIError
	if errors.As(err, &aerr) {
		return aerr.ErrorCode
	}
	return 0
}

// SubjectInFlight reports whether err is a replicated stream's "wrong last
// sequence" without a sequence (10164): it could not check the expected
// last subject sequence because an append to the same subject was still
// being applied. That append may be the caller's own previous one: the
// stream's leader acknowledges an append before it forgets the subject
// was in flight, so a sole writer that appends again at once is refused
// now and then (about one append in a thousand, more on a loaded
// machine). The same append sent again a moment later is checked for
// real: stored, or refused with the subject's last sequence (10071).
func SubjectInFlight(err error) bool {
	return apiErrorCode(err) == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// errCodeNoPeers is JetStream's "no suitable peers for placement": a
// replicated stream or consumer that the meta leader cannot place on as
// many servers as its replicas, because it does not count enough of them
// online.
const errCodeNoPeers = 10005

// Placing reports whether err is JetStream refusing to place a
// replicated stream or consumer for want of servers online (10005). A
// cluster that has just formed answers so until its meta leader counts
// every server: the same request succeeds a moment later. A cluster with
// fewer servers than the replicas answers so for ever.
func Placing(err error) bool { return apiErrorCode(err) == errCodeNoPeers }

// LayoutPatience is how long Bootstrap tries again a refusal of a cluster
// that has just formed (layoutRetryable), and Open a Placing one: long
// enough for a cluster that has just formed to count every server, and
// not for ever, since a cluster short of servers never will.
var LayoutPatience = time.Minute

// layoutRetryable reports whether the making of the topology is tried
// again after err: a placement refused (Placing), or JetStream away or
// between leaders (Transient). Not a request that got no answer (a
// timeout: a permission refused gets none, and a server gone is waited
// for by the caller's connection), a closed connection, or an account
// without JetStream: those failed at once before, and still do.
func layoutRetryable(err error) bool {
	switch {
	case Placing(err):
		return true
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout), errors.Is(err, nats.ErrConnectionClosed),
		apiErrorCode(err) == jetstream.JSErrCodeJetStreamNotEnabled, apiErrorCode(err) == jetstream.JSErrCodeJetStreamNotEnabledForAccount:
		return false
	}
	return Transient(err)
}

// placementHint says what to check of a placement still refused after
// patience.
func placementHint(err error, patience time.Duration) error {
	return fmt.Errorf("%w (tried for %s: does the cluster have as many servers online as the replicas asked for?)",
		err, patience.Round(time.Second))
}

// retryLayout calls try until it succeeds, fails in a way not
// layoutRetryable, ctx ends, or patience has passed since the first call
// (checked after each call: the last may end past it); onRetry (if set)
// is told a refusal tried again at once, then when it changes or every
// 5 s. A placement still refused at the end says what to check.
func retryLayout(ctx context.Context, patience time.Duration, onRetry func(error), try func() error) error {
	began := time.Now()
	var said string
	var saidAt time.Time
	for {
		err := try()
		switch {
		case err == nil:
			return nil
		case !layoutRetryable(err), ctx.Err() != nil:
			return err
		case time.Since(began) >= patience:
			if Placing(err) {
				return placementHint(err, patience)
			}
			return err
		}
		if onRetry != nil && (err.Error() != said || time.Since(saidAt) >= 5*time.Second) {
			onRetry(err)
			said, saidAt = err.Error(), time.Now()
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}
