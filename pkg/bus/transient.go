package bus

import (
	"context"
	"errors"
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
