package dispatch

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// commitFailures logs the group commit's failed batches (-group-commit,
// docs/adr/0020) at most once a minute: each has its messages made again
// one by one, which decides them, so a failure loses nothing, but a
// steady share costs the batches' gain, and the operator should know why.
// A conflict or a duplicate fails a batch now and then; a stream that no
// longer allows atomic batches (an older release's bootstrap made it
// again, or a rollback) fails every one.
type commitFailures struct {
	log    zerolog.Logger
	warned atomic.Int64 // unix nanoseconds of the last warning
}

// errAtomicDisabled is nats-server's refusal of a batch to a stream that
// does not allow atomic batches.
const errAtomicDisabled = 10174

// of returns the Failed hook of stream's committer.
func (c *commitFailures) of(stream string) func(error, int) {
	return func(err error, messages int) {
		last := c.warned.Load()
		if time.Since(time.Unix(0, last)) < time.Minute || !c.warned.CompareAndSwap(last, time.Now().UnixNano()) {
			return
		}
		msg := "a group commit's batch failed: its messages were made again one by one (logged at most once a minute; jetflow_dispatcher_group_commit_failed_total counts them)"
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == errAtomicDisabled {
			msg = "the stream no longer allows atomic batches (an older release's bootstrap, or a rollback?): every batch fails and its messages are made one by one; run this release's jetflow bootstrap, or drop -group-commit"
		}
		c.log.Warn().Err(err).Str("stream", stream).Int("messages", messages).Msg(msg)
	}
}
