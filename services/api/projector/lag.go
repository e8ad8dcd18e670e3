package projector

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
)

// Backlog is how far the read models are behind the events stream, as
// the projector's consumer says: shared by every api of a namespace (one
// at a time projects), so every api sees the same.
type Backlog struct {
	// Pending counts the events not yet delivered to a projector, and
	// Unacked those delivered and not yet acknowledged (being projected).
	Pending, Unacked uint64
	// Oldest is when the oldest event not yet acknowledged was stored
	// (zero when there is none: the read models are caught up).
	Oldest time.Time
}

// Lag is how long the oldest event not yet projected has waited at now
// (0 when the read models are caught up).
func (b Backlog) Lag(now time.Time) time.Duration {
	if b.Oldest.IsZero() || now.Before(b.Oldest) {
		return 0
	}
	return now.Sub(b.Oldest)
}

// ReadBacklog asks the projector's consumer of js's events stream how
// far behind it is: its counts, and the time of the first event past its
// acknowledgement floor, read from the stream's leader. Two requests
// while events wait, one otherwise.
func ReadBacklog(ctx context.Context, js jetstream.JetStream) (Backlog, error) {
	cons, err := js.Consumer(ctx, bus.StreamEvents, Consumer)
	if err != nil {
		return Backlog{}, fmt.Errorf("projector consumer: %w", err)
	}
	info := cons.CachedInfo()
	if info == nil {
		return Backlog{}, errors.New("projector consumer: no info")
	}
	b := Backlog{Pending: info.NumPending, Unacked: uint64(max(info.NumAckPending, 0))}
	if b.Pending == 0 && b.Unacked == 0 {
		return b, nil
	}
	m, err := bus.LeaderGet(ctx, js, bus.StreamEvents,
		bus.MsgQuery{Seq: info.AckFloor.Stream + 1, NextBySubject: cmp.Or(info.Config.FilterSubject, bus.EventsPrefix+".>")})
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		// Removed since (retention) or acknowledged meanwhile: caught up
		// as far as anyone can tell.
		return Backlog{Pending: b.Pending, Unacked: b.Unacked}, nil
	case err != nil:
		return Backlog{}, err
	}
	b.Oldest = m.Time
	return b, nil
}
