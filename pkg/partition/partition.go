// Package partition splits executions among dispatchers. Every execution
// belongs to one of N partitions ([Of]); each partition is handled by one
// dispatcher at a time, the holder of its lease in the JF_DISPATCHERS
// key-value bucket. A [Table] keeps this dispatcher's membership alive,
// takes the partitions that rendezvous hashing gives it ([Owners]),
// renews their leases, and hands them over when the members change:
//
//   - a member is a key member.<id> with a time to live, renewed every
//     quarter of it; a dispatcher that dies disappears when its key expires;
//   - a lease is a key lease.<partition> holding its owner's id, created
//     with compare-and-set (only if absent) and renewed with the expected
//     last revision, so that two owners never both renew one;
//   - when a member joins, the others release the partitions it now owns
//     (after finishing what they hold of them) and it takes them; when one
//     dies, its leases expire with its key and the survivors take them;
//   - a lease that expired under its live holder (its process was starved
//     of CPU past the TTL, so its renewals came late) and that nobody else
//     took is taken back at once by the same holder, which goes on without
//     releasing anything ([Table.Retaken]).
//
// The table decides who handles what; it does not fence writes. The
// history's expected-last-sequence check stays the fence, for the moment
// in which a paused owner has not yet noticed that its lease is gone.
// See docs/adr/0003-partitioned-dispatchers.md.
package partition

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Of returns the partition of execution id among n: FNV-1a (32 bits) of
// the id, modulo n. It is the hash of nats-server's partition(n, token)
// subject transform, so a stream that partitions subjects by execution id
// puts a message where Of says (the results stream does).
func Of(id string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % uint32(n))
}

// Owners assigns each of n partitions to one of members by rendezvous
// (highest random weight) hashing: every member agrees on the result from
// the member list alone, the partitions spread about evenly, and a member
// that joins or leaves moves only the partitions it gains or loses. An
// empty list owns nothing ("" for every partition).
func Owners(members []string, n int) []string {
	out := make([]string, n)
	for p := range out {
		var best uint64
		for _, m := range members {
			h := fnv.New64a()
			_, _ = h.Write([]byte(m))
			_, _ = h.Write([]byte{0})
			_, _ = h.Write([]byte(strconv.Itoa(p)))
			w := mix(h.Sum64())
			if out[p] == "" || w > best || (w == best && m < out[p]) {
				best, out[p] = w, m
			}
		}
	}
	return out
}

// mix is a 64-bit finaliser (splitmix64): FNV's high bits change little
// between keys that differ in their last byte, and the weights must not.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// Keys of the bucket.
const (
	// CountKey holds the number of partitions, written by the bootstrap.
	CountKey = "partitions"
	// DefaultCount is the number of partitions of a new deployment.
	DefaultCount = 8
	// MaxCount bounds it (each partition has three durable consumers).
	MaxCount = 256
	// DefaultTTL is how long a member or a lease lives without renewal:
	// how long the partitions of a dispatcher that died wait for another.
	DefaultTTL = time.Second
)

// MemberKey is the key that shows a member alive.
func MemberKey(id string) string { return "member." + id }

// LeaseKey is the key of a partition's lease.
func LeaseKey(p int) string { return "lease." + strconv.Itoa(p) }

// MemberRule describes valid member names, for error messages.
const MemberRule = "use 1 to 128 letters, digits, '-' or '_'"

var memberRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// ValidMember reports whether id can name a member: a key token of the
// bucket, made of letters, digits, '-' and '_'.
func ValidMember(id string) bool { return memberRe.MatchString(id) }

// Count reads the number of partitions from the bucket.
func Count(ctx context.Context, kv jetstream.KeyValue) (int, error) {
	e, err := kv.Get(ctx, CountKey)
	if err != nil {
		return 0, fmt.Errorf("read the partition count: %w", err)
	}
	n, err := strconv.Atoi(string(e.Value()))
	if err != nil || n < 1 || n > MaxCount {
		return 0, fmt.Errorf("the partition count %q in %s is not a number from 1 to %d", e.Value(), kv.Bucket(), MaxCount)
	}
	return n, nil
}

// SetCount records n partitions, once: a deployment's count never changes
// (the executions' partitions, and so their consumers, would move), so a
// different n than the one recorded is an error.
func SetCount(ctx context.Context, kv jetstream.KeyValue, n int) error {
	if n < 1 || n > MaxCount {
		return fmt.Errorf("partition count %d: use 1 to %d", n, MaxCount)
	}
	_, err := kv.Create(ctx, CountKey, []byte(strconv.Itoa(n)))
	if err == nil {
		return nil
	}
	if !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("record the partition count: %w", err)
	}
	have, err := Count(ctx, kv)
	if err != nil {
		return err
	}
	if have != n {
		return fmt.Errorf("this deployment has %d partitions; it cannot be changed to %d (drop the setting to keep %d)", have, n, have)
	}
	return nil
}

// Config configures a Table.
type Config struct {
	// Member names this process among the members: unique, a key token.
	Member string
	// Partitions is the number of partitions (see [Count]).
	Partitions int
	// TTL is how long a member and its leases live without renewal.
	// Default [DefaultTTL]; at least one second (JetStream's granularity).
	TTL time.Duration
	// Acquire starts handling partition p, whose lease this member now
	// holds, as its holding number epoch (see [Table.Holds]). It runs on
	// its own goroutine, while the table keeps renewing the leases. An
	// error gives the lease back, to be taken again later.
	Acquire func(ctx context.Context, p int, epoch uint64) error
	// Release stops handling p's holding epoch (if that holding is still
	// being handled) and returns once nothing of it is in hand, or it
	// gives up waiting. It runs on its own goroutine; when the lease was
	// given up rather than lost, the table keeps renewing it meanwhile
	// and deletes it afterwards.
	Release func(p int, epoch uint64)
	// OnError is told of failures the table retries. Optional.
	OnError func(err error, what string)
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Validate reports a setting that cannot work.
func (c Config) Validate() error {
	switch {
	case !ValidMember(c.Member):
		return fmt.Errorf("partition: member %q: %s", c.Member, MemberRule)
	case c.Partitions < 1 || c.Partitions > MaxCount:
		return fmt.Errorf("partition: %d partitions: use 1 to %d", c.Partitions, MaxCount)
	case c.TTL != 0 && (c.TTL < time.Second || c.TTL%time.Second != 0):
		return fmt.Errorf("partition: TTL %s: use whole seconds, at least 1s", c.TTL)
	case c.Acquire == nil || c.Release == nil:
		return errors.New("partition: Acquire and Release are required")
	}
	return nil
}

type lease struct {
	owner string
	rev   uint64
}

type state int

const (
	free      state = iota
	held            // handled here
	releasing       // Release is running; the lease is still renewed
)

// Table holds this member's partitions.
type Table struct {
	cfg Config
	kv  jetstream.KeyValue
	js  jetstream.JetStream

	nonce   string          // this process's value of its member key
	dupes   int             // renewals of its member key by another process seen
	members map[string]bool // seen alive in the bucket
	leases  map[int]lease   // seen in the bucket, or just written
	// owners are the partitions' owners for the members ownersOf names.
	owners   []string
	ownersOf string

	mu    sync.Mutex // guards below
	state []state
	until []time.Time // a held lease is valid until then (renewal sent + TTL)
	epoch []uint64    // incremented each time a partition is acquired

	adopted atomic.Int64 // renewals found stored after they were refused (stillMine)
	retaken atomic.Int64 // leases that expired under this holder and were taken back (retake)
	// lapsed are held partitions whose lease expired under this member
	// (its renewals came late) and that it has not taken back yet.
	lapsed map[int]bool

	released chan holding   // a Release of a lease given up finished
	failed   chan holding   // an Acquire failed
	quit     chan struct{}  // closed when Run has returned
	starting sync.WaitGroup // Acquire and Release goroutines
}

// holding names one holding of a partition: the partition and its epoch.
type holding struct {
	p     int
	epoch uint64
}

// epochs numbers holdings for the whole process: a Table made again (a
// dispatcher run again) never reuses the epoch of an earlier holding, so
// nothing cached under it is taken for current.
var epochs atomic.Uint64

// New returns a table over the bucket kv; call Run.
func New(js jetstream.JetStream, kv jetstream.KeyValue, cfg Config) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.OnError == nil {
		cfg.OnError = func(error, string) {}
	}
	n := cfg.Partitions
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	return &Table{cfg: cfg, kv: kv, js: js, nonce: hex.EncodeToString(nonce), members: map[string]bool{}, leases: map[int]lease{}, lapsed: map[int]bool{},
		state: make([]state, n), until: make([]time.Time, n), epoch: make([]uint64, n), released: make(chan holding, n), failed: make(chan holding, n), quit: make(chan struct{})}, nil
}

// Holds reports whether this member handles partition p now, and the
// epoch of its holding: a state cached in an earlier epoch may be behind
// what another owner wrote in between.
func (t *Table) Holds(p int) (epoch uint64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p < 0 || p >= len(t.state) || t.state[p] != held || !t.cfg.Now().Before(t.until[p]) {
		return 0, false
	}
	return t.epoch[p], true
}

// Await waits, at most within, until this member handles partition p
// again in holding epoch, and reports whether it does. A holding whose
// renewal is late, or whose lease expired under it and is being taken
// back (retake), is valid again within moments; one lost, released or
// replaced by a later holding is not, and Await returns false at once.
func (t *Table) Await(ctx context.Context, p int, epoch uint64, within time.Duration) bool {
	if p < 0 || p >= len(t.state) {
		return false
	}
	deadline := time.Now().Add(within)
	for {
		t.mu.Lock()
		st, e, valid := t.state[p], t.epoch[p], t.cfg.Now().Before(t.until[p])
		t.mu.Unlock()
		switch {
		case st != held || e != epoch:
			return false
		case valid:
			return true
		case !time.Now().Before(deadline):
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Run keeps the membership and the leases until ctx ends, then releases
// every partition (Release, then the lease is deleted) and leaves, so
// that the others take over at once.
func (t *Table) Run(ctx context.Context) error {
	tick := time.NewTicker(t.cfg.TTL / 4)
	defer tick.Stop()
	defer t.leave()
	defer close(t.quit) // first: nothing waits on the loop any more
	for ctx.Err() == nil {
		// Alive before looking: the watch's first values then include this
		// member, whatever an earlier run with the same name left.
		t.heartbeat(ctx)
		w, err := t.kv.WatchAll(ctx)
		if err != nil {
			t.cfg.OnError(err, "watch the dispatchers bucket")
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(t.cfg.TTL / 4):
			}
			continue
		}
		t.forget()
		t.loop(ctx, w, tick)
		_ = w.Stop()
		if t.dupes > 1 {
			return fmt.Errorf("%w: another process renews member %q: give each dispatcher its own name", ErrDuplicateMember, t.cfg.Member)
		}
	}
	return nil
}

// ErrDuplicateMember means another running process uses this member's name.
var ErrDuplicateMember = errors.New("partition: duplicate member")

func (t *Table) loop(ctx context.Context, w jetstream.KeyWatcher, tick *time.Ticker) {
	ready := false // the watch delivered the bucket's current keys
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				ready = true
			} else {
				t.observe(e)
			}
			if t.dupes > 1 {
				return
			}
		case h := <-t.released:
			t.finishRelease(ctx, h)
		case h := <-t.failed:
			t.mu.Lock()
			current := t.state[h.p] == held && t.epoch[h.p] == h.epoch
			t.mu.Unlock()
			if current { // not a failure of an earlier holding
				t.startRelease(h.p)
			}
		case <-tick.C:
			t.heartbeat(ctx)
			if ready {
				t.reconcile(ctx, true)
			} else {
				t.renewAll(ctx) // deciding waits for the whole view; renewing does not
			}
			continue
		}
		if ready {
			t.reconcile(ctx, false)
		}
	}
}

// forget drops what an earlier watch showed (a new watch shows the bucket
// again), except the leases this member holds.
func (t *Table) forget() {
	t.members = map[string]bool{t.cfg.Member: true}
	for p, l := range t.leases {
		if l.owner != t.cfg.Member {
			delete(t.leases, p)
		}
	}
	t.ownersOf = ""
}

// renewAll renews the leases held or being given back.
func (t *Table) renewAll(ctx context.Context) {
	for p := range t.cfg.Partitions {
		t.mu.Lock()
		st := t.state[p]
		t.mu.Unlock()
		if st != free {
			t.renew(ctx, p, t.leases[p])
		}
	}
}

// observe records a change of the bucket.
func (t *Table) observe(e jetstream.KeyValueEntry) {
	gone := e.Operation() != jetstream.KeyValuePut
	switch key := e.Key(); {
	case strings.HasPrefix(key, "member."):
		id := strings.TrimPrefix(key, "member.")
		if gone && id == t.cfg.Member {
			return // this member is alive: an old marker, or its key expired and the next heartbeat puts it back
		}
		if id == t.cfg.Member && string(e.Value()) != t.nonce {
			t.dupes++ // once may be this name's previous run; more is another process
		}
		if gone {
			delete(t.members, id)
		} else {
			t.members[id] = true
		}
	case strings.HasPrefix(key, "lease."):
		p, err := strconv.Atoi(strings.TrimPrefix(key, "lease."))
		if err != nil || p < 0 || p >= t.cfg.Partitions {
			return
		}
		if have, ok := t.leases[p]; ok && have.rev > e.Revision() {
			// A change older than what is known (the watcher lags behind
			// this member's own writes): a later one superseded it.
			return
		}
		if gone {
			had := t.leases[p]
			delete(t.leases, p)
			if e.Operation() == jetstream.KeyValuePurge && had.owner == t.cfg.Member && t.holding(p) {
				// Expired (a MaxAge marker), not given back, while this
				// member held it: its renewals came late. reconcile takes
				// it back if nobody else has (retake).
				t.lapsed[p] = true
				return
			}
			t.lost(p, "its lease expired or was deleted")
			return
		}
		l := lease{owner: string(e.Value()), rev: e.Revision()}
		t.leases[p] = l
		if l.owner != t.cfg.Member {
			delete(t.lapsed, p)
			t.lost(p, "another member holds its lease")
		}
	}
}

// holding reports whether this member handles p (not free, not being
// given back), whatever its lease's validity.
func (t *Table) holding(p int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state[p] == held
}

// lost stops handling p at once if this member handled it: the lease is
// gone (it was not renewed in time) or someone else holds it.
func (t *Table) lost(p int, why string) {
	delete(t.lapsed, p)
	t.mu.Lock()
	st := t.state[p]
	if st == free {
		t.mu.Unlock()
		return
	}
	t.state[p] = free
	epoch := t.epoch[p]
	t.mu.Unlock()
	t.cfg.OnError(fmt.Errorf("partition %d lost: %s", p, why), "lease")
	if st == held {
		t.starting.Add(1)
		go func() { defer t.starting.Done(); t.cfg.Release(p, epoch) }()
	}
}

// opCtx bounds one request of the table's loop: a slow one must not hold
// up the renewals behind it past the leases' time to live.
func (t *Table) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, t.cfg.TTL/2)
}

func (t *Table) heartbeat(ctx context.Context) {
	ctx, cancel := t.opCtx(ctx)
	defer cancel()
	_, err := t.js.Publish(ctx, "$KV."+t.kv.Bucket()+"."+MemberKey(t.cfg.Member), []byte(t.nonce), jetstream.WithMsgTTL(t.cfg.TTL))
	if err != nil {
		t.cfg.OnError(err, "renew membership")
		return
	}
	t.members[t.cfg.Member] = true
}

// reconcile takes and gives back leases as the members decide, and
// renews those held if renewing (on the ticks: a renewal is a change
// every member sees, so renewing on every change would never stop).
func (t *Table) reconcile(ctx context.Context, renewing bool) {
	members := make([]string, 0, len(t.members))
	for m := range t.members {
		members = append(members, m)
	}
	slices.Sort(members)
	if key := strings.Join(members, " "); key != t.ownersOf || t.owners == nil {
		t.owners, t.ownersOf = Owners(members, t.cfg.Partitions), key
	}
	owners := t.owners
	for p, owner := range owners {
		t.mu.Lock()
		st := t.state[p]
		t.mu.Unlock()
		l, leased := t.leases[p]
		switch {
		case t.lapsed[p] && (st != held || owner != t.cfg.Member):
			t.lost(p, "its lease expired")
		case t.lapsed[p]:
			t.retake(ctx, p)
		case st == held && owner != t.cfg.Member:
			t.startRelease(p)
		case st != free && renewing: // every tick: three chances before the lease expires
			t.renew(ctx, p, l)
		case st == free && !leased && owner == t.cfg.Member:
			t.acquire(ctx, p)
		}
	}
}

func (t *Table) acquire(ctx context.Context, p int) {
	sent := t.cfg.Now()
	opCtx, cancel := t.opCtx(ctx)
	rev, err := t.kv.Create(opCtx, LeaseKey(p), []byte(t.cfg.Member), jetstream.KeyTTL(t.cfg.TTL))
	cancel()
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) && ctx.Err() == nil {
			t.cfg.OnError(err, fmt.Sprintf("take partition %d", p))
		}
		return
	}
	t.leases[p] = lease{owner: t.cfg.Member, rev: rev}
	t.mu.Lock()
	t.state[p], t.until[p] = held, sent.Add(t.cfg.TTL)
	t.epoch[p] = epochs.Add(1)
	epoch := t.epoch[p]
	t.mu.Unlock()
	// Starting takes a few requests: never hold up the renewals for it.
	t.starting.Add(1)
	go func() {
		defer t.starting.Done()
		if err := t.cfg.Acquire(ctx, p, epoch); err != nil {
			if ctx.Err() == nil {
				t.cfg.OnError(err, fmt.Sprintf("start partition %d", p))
			}
			select {
			case t.failed <- holding{p, epoch}:
			case <-t.quit:
			}
		}
	}()
}

func (t *Table) renew(ctx context.Context, p int, l lease) {
	ctx, cancel := t.opCtx(ctx)
	defer cancel()
	if t.renewOnce(ctx, p, l) {
		// An earlier renewal was stored after all (stillMine): renew from
		// the revision found, so that the holding does not lapse here.
		t.renewOnce(ctx, p, t.leases[p])
	}
}

// renewOnce renews p's lease l; again reports that it should be renewed
// once more from the revision now in t.leases (stillMine).
func (t *Table) renewOnce(ctx context.Context, p int, l lease) (again bool) {
	sent := t.cfg.Now()
	ack, err := t.js.Publish(ctx, "$KV."+t.kv.Bucket()+"."+LeaseKey(p), []byte(t.cfg.Member),
		jetstream.WithMsgTTL(t.cfg.TTL), jetstream.WithExpectLastSequencePerSubject(l.rev))
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			if t.stillMine(ctx, p) {
				return true
			}
			if t.lapsed[p] { // expired, and nobody else holds it: take it back
				t.retake(ctx, p)
				return false
			}
			delete(t.leases, p)
			t.lost(p, "its lease changed underneath")
			return false
		}
		t.cfg.OnError(err, fmt.Sprintf("renew partition %d", p))
		return false
	}
	t.leases[p] = lease{owner: t.cfg.Member, rev: ack.Sequence}
	t.mu.Lock()
	if t.state[p] != free {
		t.until[p] = sent.Add(t.cfg.TTL)
	}
	t.mu.Unlock()
	return false
}

// stillMine looks at p's lease after a renewal was refused for its
// expected revision. On a busy machine a renewal can time out here and be
// stored all the same (its acknowledgement came too late), and the next
// one, still expecting the older revision, is refused: the lease then
// holds this member's name at a newer revision, which it takes as its
// own. Nobody else writes this member's name (a second process with it is
// ErrDuplicateMember). Any other value, or no lease, is a loss.
//
// A lease that expired (no value: a renewal came after the TTL) and that
// this member still holds is marked lapsed, for retake.
func (t *Table) stillMine(ctx context.Context, p int) bool {
	e, err := t.kv.Get(ctx, LeaseKey(p))
	if errors.Is(err, jetstream.ErrKeyNotFound) && t.holding(p) {
		t.lapsed[p] = true
	}
	if err != nil || string(e.Value()) != t.cfg.Member {
		return false
	}
	t.leases[p] = lease{owner: t.cfg.Member, rev: e.Revision()}
	t.adopted.Add(1)
	return true
}

// retake takes back the lease of p, which expired under this member while
// it still handled p (its process was starved of CPU past the TTL, or its
// connection stalled): if the lease is still absent, nobody else took it,
// and this member creates it again and goes on with the same holding,
// releasing nothing, with no pause beyond the stall itself. Another
// member that took it meanwhile wins the create: p is lost as usual. Had
// another member taken p and let it go in the stall, states cached in
// this holding may be behind what it wrote; the history's expected
// sequence refuses such a write, and the dispatcher reads the history
// again, as after any conflict.
func (t *Table) retake(ctx context.Context, p int) {
	sent := t.cfg.Now()
	opCtx, cancel := t.opCtx(ctx)
	rev, err := t.kv.Create(opCtx, LeaseKey(p), []byte(t.cfg.Member), jetstream.KeyTTL(t.cfg.TTL))
	cancel()
	switch {
	case errors.Is(err, jetstream.ErrKeyExists):
		t.lost(p, "its lease expired and another member took it")
		return
	case err != nil:
		if ctx.Err() == nil {
			t.cfg.OnError(err, fmt.Sprintf("take back partition %d", p))
		}
		return // lapsed still: the next tick tries again
	}
	delete(t.lapsed, p)
	t.leases[p] = lease{owner: t.cfg.Member, rev: rev}
	t.mu.Lock()
	if t.state[p] == held {
		t.until[p] = sent.Add(t.cfg.TTL)
	}
	t.mu.Unlock()
	t.retaken.Add(1)
	t.cfg.OnError(fmt.Errorf("partition %d: its lease expired (renewals came late) and nobody took it: taken back, nothing released", p), "lease")
}

// Retaken counts the leases that expired under this member while it held
// them and that it took back (nobody else had), without a release.
func (t *Table) Retaken() int64 { return t.retaken.Load() }

// startRelease stops handling p in the background; the lease is deleted
// when that is done (finishRelease), and renewed meanwhile.
func (t *Table) startRelease(p int) {
	t.mu.Lock()
	t.state[p] = releasing
	epoch := t.epoch[p]
	t.mu.Unlock()
	t.starting.Add(1)
	go func() {
		defer t.starting.Done()
		t.cfg.Release(p, epoch)
		select {
		case t.released <- holding{p, epoch}:
		case <-t.quit:
		}
	}()
}

func (t *Table) finishRelease(ctx context.Context, h holding) {
	t.mu.Lock()
	done := t.state[h.p] == releasing && t.epoch[h.p] == h.epoch
	if done {
		t.state[h.p] = free
	}
	t.mu.Unlock()
	if done {
		t.deleteLease(ctx, h.p)
	}
}

func (t *Table) deleteLease(ctx context.Context, p int) {
	l, ok := t.leases[p]
	if !ok || l.owner != t.cfg.Member {
		return
	}
	ctx, cancel := t.opCtx(ctx)
	defer cancel()
	if err := t.kv.Delete(ctx, LeaseKey(p), jetstream.LastRevision(l.rev)); err != nil {
		t.cfg.OnError(err, fmt.Sprintf("give back partition %d", p))
		return // it expires
	}
	delete(t.leases, p)
}

// leave releases everything and deletes the member key, so that the
// others need not wait for the keys to expire.
func (t *Table) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	t.mu.Lock()
	var mine, holding []int
	epochOf := slices.Clone(t.epoch)
	for p, st := range t.state {
		if st != free {
			mine = append(mine, p)
		}
		if st == held {
			holding = append(holding, p)
		}
		t.state[p] = free
	}
	t.mu.Unlock()
	for _, p := range holding { // those releasing are being released already
		wg.Add(1)
		go func() { defer wg.Done(); t.cfg.Release(p, epochOf[p]) }()
	}
	wg.Wait()
	t.starting.Wait() // starts that were under way, and releases begun before
	for _, p := range holding {
		t.cfg.Release(p, epochOf[p]) // a start that finished after the release above
	}
	for _, p := range mine {
		t.deleteLease(ctx, p)
	}
	if err := t.kv.Delete(ctx, MemberKey(t.cfg.Member)); err != nil {
		t.cfg.OnError(err, "leave")
	}
}
