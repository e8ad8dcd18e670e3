package bus

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// PullExpiry is how long a consumer's pull request waits on the server,
// and PullHeartbeat how often the server says it still holds it. A
// consumer whose leader moved (the node that led it died) notices after
// two missed heartbeats and asks the new leader: about 2 s. nats.go's
// defaults (30 s and 15 s) made it 30 s, a stall of every execution when
// such a node died.
const (
	PullExpiry    = 5 * time.Second
	PullHeartbeat = time.Second
)

// Consume returns the options of a long-lived consumer's Consume: the
// expiry and heartbeat above, then opts.
func Consume(opts ...jetstream.PullConsumeOpt) []jetstream.PullConsumeOpt {
	return append([]jetstream.PullConsumeOpt{jetstream.PullExpiry(PullExpiry), jetstream.PullHeartbeat(PullHeartbeat)}, opts...)
}

// Messages returns the options of a consumer's Messages iterator: the
// expiry and heartbeat above, then opts.
func Messages(opts ...jetstream.PullMessagesOpt) []jetstream.PullMessagesOpt {
	return append([]jetstream.PullMessagesOpt{jetstream.PullExpiry(PullExpiry), jetstream.PullHeartbeat(PullHeartbeat)}, opts...)
}
