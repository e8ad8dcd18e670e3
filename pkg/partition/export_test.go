package partition

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// What the external tests drive of a Table without running its loop.

func (t *Table) AcquireNow(ctx context.Context, p int) { t.acquired(ctx, t.takeEach(ctx, []int{p})[0]) }
func (t *Table) RenewNow(ctx context.Context, p int)   { t.renewAndRetake(ctx, []int{p}) }
func (t *Table) LeaseRevision(p int) uint64            { return t.leases[p].rev }
func (t *Table) Adopted() int64                        { return t.adopted.Load() }
func (t *Table) WaitStarts()                           { t.starting.Wait() }

// LeaseWrite is a take's or a renewal's write of a lease.
type LeaseWrite = func(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error)

// WrapTakeWrites makes the takes write through wrap(their write).
func (t *Table) WrapTakeWrites(wrap func(LeaseWrite) LeaseWrite) { t.writeLease = wrap(t.writeLease) }

// WrapRenewalWrites makes the renewals write through wrap(their write).
func (t *Table) WrapRenewalWrites(wrap func(LeaseWrite) LeaseWrite) {
	t.writeRenewal = wrap(t.writeRenewal)
}

// LeaseRead is the read of a lease after its renewal was refused.
type LeaseRead = func(context.Context, string) (jetstream.KeyValueEntry, error)

// WrapRenewedReads makes the reads of leases after refused renewals read
// through wrap(their read).
func (t *Table) WrapRenewedReads(wrap func(LeaseRead) LeaseRead) { t.readRenewed = wrap(t.readRenewed) }

// Unanswered is how many takes of p in a row had no answer, as the
// table remembers them.
func (t *Table) Unanswered(p int) int { return len(t.unanswered[p]) }

func (t *Table) Retake(ctx context.Context, p int)    { t.retakeEach(ctx, []int{p}) }
func (t *Table) ObserveNow(e jetstream.KeyValueEntry) { t.observe(e) }
func (t *Table) ReconcileNow(ctx context.Context) {
	t.members[t.cfg.Member] = seen{}
	t.reconcile(ctx, false)
}

// TickNow is a tick's reconcile, which renews.
func (t *Table) TickNow(ctx context.Context) {
	t.members[t.cfg.Member] = seen{}
	t.reconcile(ctx, true)
}

// Epoch is p's holding number, valid or not.
func (t *Table) Epoch(p int) (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.epoch[p], t.state[p] != free
}

// SetStaleSlack sets the slack over the TTL after which a key is taken
// for a ghost, and returns a func that restores it.
func SetStaleSlack(d time.Duration) func() {
	old := staleSlack.Swap(int64(d))
	return func() { staleSlack.Store(old) }
}

// DeleteIfUnchanged is deleteIfUnchanged.
func (t *Table) DeleteIfUnchanged(ctx context.Context, key string, rev uint64) {
	t.deleteIfUnchanged(ctx, key, rev)
}

// GiveBackNow is giveBack.
func (t *Table) GiveBackNow(ctx context.Context, p int) { t.giveBack(ctx, p) }
