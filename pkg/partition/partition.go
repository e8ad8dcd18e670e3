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
//     of CPU past the TTL, so its renewals came late) and that nobody holds
//     is taken back at once by the same holder ([Table.Retaken]): without
//     a release or its pause, but as a new holding (a new epoch, told by
//     [Config.Retook]), since another member may have taken the partition
//     and let it go during the stall; if the watch shows later that one
//     did, [Config.HeldMeanwhile] says so.
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

	"github.com/nats-io/nats.go"
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
	// and deletes it afterwards. handedOver says that nothing of the
	// holding is left for the next holder to look for (see [Vacancy]):
	// false, and the lease is purged instead of deleted, so that the next
	// holder takes it for one whose holder died.
	Release func(p int, epoch uint64) (handedOver bool)
	// Retook tells that this member took back partition p's lease, which
	// had expired under it while it handled p (see [Table.Retaken]):
	// holding old ends and holding new begins at once, with no Release of
	// old and no pause. Whatever was cached in old may be behind what
	// another member wrote in between (it may have taken p and let it go
	// during the stall, and the watch may never show it); what old has
	// in hand may still be handled
	// ([Table.Await] accepts old until p is lost or released). It runs on
	// the table's loop, before any Release of new: it must be quick.
	// Optional.
	Retook func(p int, old, new uint64)
	// HeldMeanwhile tells that the watch showed, after a retake began
	// holding epoch, that another member held p between the expiry and the
	// retake (the watch lagged behind the retake). The retake's new epoch
	// already covers what it wrote; what it had taken from p's queues and
	// not handed back is what this is for. It runs on its own goroutine.
	// Optional.
	HeldMeanwhile func(p int, epoch uint64)
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
	seen  time.Time // when the server stored it (zero: written by this member)
}

// seen is a member key as the watch last showed it.
type seen struct {
	at  time.Time // when the server stored it
	rev uint64
}

// staleAfter is how long before this member's latest renewal (both as
// the server stamped them: no clock of this process is involved) a
// member key or another member's lease was stored for it to be taken for
// a ghost, whatever the bucket says: both live for the TTL and are
// renewed every quarter of it, so one older than the TTL should have
// expired. nats-server 2.15 can bring a key whose TTL ran out back to
// life, for good, when it rebuilds a single-replica stream after an
// unclean stop (nats-io/nats-server#8505): the ghost of a dispatcher
// killed twice kept its partitions unheld for ever. The slack over the
// TTL leaves room for a watch that delivers late.
func (t *Table) staleAfter() time.Duration { return t.cfg.TTL + time.Duration(staleSlack.Load()) }

// staleSlack is staleAfter's slack (a variable for tests).
var staleSlack atomic.Int64

func init() { staleSlack.Store(int64(5 * time.Second)) }

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
	members map[string]seen // seen alive in the bucket
	// serverNow is when the server stored this member's latest renewal
	// the watch showed: the server's clock, against which ghosts are told.
	serverNow time.Time
	leases    map[int]lease // seen in the bucket, or just written
	// leaseStream is the bucket's stream, for a take's read of a lease's
	// last message (sendTake; set by the first takeEach).
	leaseStream jetstream.Stream
	// owners are the partitions' owners for the members ownersOf names.
	owners   []string
	ownersOf string

	mu    sync.Mutex // guards below
	state []state
	until []time.Time // a held lease is valid until then (renewal sent + TTL)
	epoch []uint64    // the holding's number: new at each acquire and retake
	since []uint64    // the epoch of the acquire that the retakes since go on from
	found []found     // how the lease was found by the last acquire (Vacancy)
	// left: the last Release of the partition's holding said something
	// was left for the next holder (giveBack purges the lease).
	left []bool
	// change is closed (and replaced) whenever a holding changes: its
	// state, epoch or validity (Await waits on it).
	change chan struct{}

	adopted atomic.Int64 // writes of this member found stored after they were refused (stillMine, sendTake)
	retaken atomic.Int64 // leases that expired under this holder and were taken back (tookBack)
	// lapsed are held partitions whose lease expired under this member
	// (its renewals came late) and that it has not taken back yet, with
	// the last revision of the lease known to be this member's (0 if none).
	lapsed map[int]uint64
	// unanswered are, per partition, the takes that wrote its lease and
	// had no answer (a timeout) since the last answered one, each with
	// how the message it was written after left the lease. A write may
	// have been stored all the same; a later take tells (TakeHeader).
	unanswered map[int]unansweredTakes
	// writeLease is the take's write (js.PublishMsg; a test's answers it may lose).
	writeLease func(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error)
	// writeRenewal is a renewal's write (js.PublishMsg; a test's answers
	// it may slow down).
	writeRenewal func(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error)
	// readRenewed is the read of a lease after its renewal was refused
	// (kv.Get; a test's may fail).
	readRenewed func(context.Context, string) (jetstream.KeyValueEntry, error)
	takes       uint64 // takes sent so far, each one's number in its TakeHeader
	// retook are the partitions taken back whose watch has not yet shown
	// the retake's own create: a change by another member older than it
	// but newer than the lapse means that member held p in the stall.
	retook map[int]retakeSpan

	released chan holding   // a Release of a lease given up finished
	failed   chan holding   // an Acquire failed
	quit     chan struct{}  // closed when Run has returned
	starting sync.WaitGroup // Acquire and Release goroutines
}

// Vacancy is how a partition's lease was found when this member took it:
// whether its last holder may have left work undone (a dispatcher's
// local steps, which only it knew it ran). See [Table.Vacancy].
type Vacancy uint8

const (
	// VacancyUnknown: the holding was not begun by a take (a retake), or
	// is not the partition's current one.
	VacancyUnknown Vacancy = iota
	// VacancyNever: the bucket keeps no trace of the lease. It was never
	// held, or expired longer ago than the bucket keeps the marker of an
	// expiry (its LimitMarkerTTL): its holder's last act is older than
	// that.
	VacancyNever
	// VacancyReleased: its last holder deleted it, having given the
	// partition up with nothing left to look for (Config.Release said so),
	// or someone deleted it by hand.
	VacancyReleased
	// VacancyExpired: it expired (its holder died, or renewed too late),
	// it was purged (a ghost dropped, or by hand), or it was found under
	// this member's name (an earlier run of it, or a create whose answer
	// was lost): its holder may have died holding it.
	VacancyExpired
)

func (v Vacancy) String() string {
	switch v {
	case VacancyNever:
		return "never_held"
	case VacancyReleased:
		return "released"
	case VacancyExpired:
		return "expired"
	}
	return "unknown"
}

// found is the Vacancy an acquire found, for its holding epoch.
type found struct {
	epoch   uint64
	vacancy Vacancy
}

// holding names one holding of a partition: the partition and its epoch.
type holding struct {
	p     int
	epoch uint64
}

// retakeSpan is what a retake leaves for observe: the revisions after
// (the lapsed lease's last known) and before upto (the retake's create)
// in which another member's write means it held the partition meanwhile.
type retakeSpan struct {
	after, upto uint64
	epoch       uint64 // the holding the retake began
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
	if cfg.Retook == nil {
		cfg.Retook = func(int, uint64, uint64) {}
	}
	if cfg.HeldMeanwhile == nil {
		cfg.HeldMeanwhile = func(int, uint64) {}
	}
	n := cfg.Partitions
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	return &Table{cfg: cfg, kv: kv, js: js, nonce: hex.EncodeToString(nonce), members: map[string]seen{}, leases: map[int]lease{},
		lapsed: map[int]uint64{}, unanswered: map[int]unansweredTakes{}, writeLease: js.PublishMsg, writeRenewal: js.PublishMsg, readRenewed: kv.Get, retook: map[int]retakeSpan{}, change: make(chan struct{}),
		state: make([]state, n), until: make([]time.Time, n), epoch: make([]uint64, n), since: make([]uint64, n), found: make([]found, n), left: make([]bool, n),
		released: make(chan holding, n), failed: make(chan holding, n), quit: make(chan struct{})}, nil
}

// changedLocked wakes whoever waits for a holding to change (Await).
// t.mu is held.
func (t *Table) changedLocked() {
	close(t.change)
	t.change = make(chan struct{})
}

// followsLocked reports whether epoch is p's holding now or one that the
// retakes since its acquire went on from. t.mu is held.
func (t *Table) followsLocked(p int, epoch uint64) bool {
	return t.state[p] == held && t.since[p] <= epoch && epoch <= t.epoch[p]
}

// Holds reports whether this member handles partition p now, and the
// epoch of its holding: a state cached in an earlier epoch may be behind
// what another owner wrote in between (a retake begins a new epoch too).
func (t *Table) Holds(p int) (epoch uint64, ok bool) {
	epoch, _, ok = t.HoldsSince(p)
	return epoch, ok
}

// HoldsSince is [Table.Holds], with the epoch of the acquire that p's
// holding goes on from by retakes (epoch itself when there was none). A
// retake cannot tell its own expired lease from one another member took
// and let go in the stall (the bucket keeps one value a key, and the
// watch may never show that member's writes): a state cached in an epoch
// from since on may be behind, and is as good as one read in this epoch
// only once the history is found not to have moved since.
func (t *Table) HoldsSince(p int) (epoch, since uint64, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p < 0 || p >= len(t.state) || t.state[p] != held || !t.cfg.Now().Before(t.until[p]) {
		return 0, 0, false
	}
	return t.epoch[p], t.since[p], true
}

// Current reports whether this member still handles partition p in
// holding epoch or in a retake of it (see [Config.Retook]), and the epoch
// of the holding it handles p in now: whether p was lost or released
// since, not whether its lease is valid at this moment (a renewal may be
// late; [Table.Holds] and [Table.Await] say that).
func (t *Table) Current(p int, epoch uint64) (uint64, bool) {
	if p < 0 || p >= len(t.state) {
		return 0, false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.followsLocked(p, epoch) {
		return 0, false
	}
	return t.epoch[p], true
}

// Await waits, at most within, until this member handles partition p
// again in holding epoch or in a retake of it, and reports whether it
// does. A holding whose renewal is late, or whose lease expired under it
// and is being taken back (tookBack), is valid again within moments; one
// lost, released or replaced by a later acquire is not, and Await returns
// false at once. The messages a holding had in hand when it was retaken
// are its retake's to handle: Await(old) is true while the retake holds.
func (t *Table) Await(ctx context.Context, p int, epoch uint64, within time.Duration) bool {
	if p < 0 || p >= len(t.state) {
		return false
	}
	look := func() (follows, valid bool, change <-chan struct{}) {
		t.mu.Lock()
		defer t.mu.Unlock()
		return t.followsLocked(p, epoch), t.cfg.Now().Before(t.until[p]), t.change
	}
	follows, valid, change := look()
	if !follows || valid {
		return follows && valid
	}
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		// Only a change makes a holding valid again (a renewal, a retake):
		// time passing makes it less so.
		select {
		case <-ctx.Done():
			return false
		case <-timer.C:
			return false
		case <-change:
		}
		if follows, valid, change = look(); !follows || valid {
			return follows && valid
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
		t.heartbeat(ctx)()
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
			if !ok || !t.update(e, &ready) {
				return
			}
			// The changes already queued too, before deciding: one
			// reconcile then takes the leases that expired together (a
			// dead member's), together.
		queued:
			for range 2 * t.cfg.Partitions {
				select {
				case e, ok := <-w.Updates():
					if !ok || !t.update(e, &ready) {
						return
					}
				default:
					break queued
				}
			}
		case h := <-t.released:
			t.finishRelease(ctx, h)
		case h := <-t.failed:
			t.mu.Lock()
			current := t.followsLocked(h.p, h.epoch)
			t.mu.Unlock()
			if current { // not a failure of an earlier holding
				t.startRelease(h.p)
			}
		case <-tick.C:
			beat := t.heartbeat(ctx) // under way beside the leases' renewals
			if ready {
				t.reconcile(ctx, true)
				t.dropGhosts(ctx) // after the renewals; the next reconcile takes the ghosts' partitions
			} else {
				t.renewAll(ctx) // deciding waits for the whole view; renewing does not
			}
			beat()
			continue
		}
		if ready {
			t.reconcile(ctx, false)
		}
	}
}

// update records e, a change the watch shows (nil: the watch has shown
// the bucket as it was, ready), and reports whether the loop goes on:
// not once another process is seen renewing this member's name.
func (t *Table) update(e jetstream.KeyValueEntry, ready *bool) bool {
	if e == nil {
		*ready = true
	} else {
		t.observe(e)
	}
	return t.dupes <= 1
}

// forget drops what an earlier watch showed (a new watch shows the bucket
// again), except the leases this member holds.
func (t *Table) forget() {
	t.members = map[string]seen{t.cfg.Member: {}}
	for p, l := range t.leases {
		if l.owner != t.cfg.Member {
			delete(t.leases, p)
		}
	}
	t.ownersOf = ""
}

// renewAll renews the leases held or being given back.
func (t *Table) renewAll(ctx context.Context) {
	var ps []int
	for p := range t.cfg.Partitions {
		t.mu.Lock()
		st := t.state[p]
		t.mu.Unlock()
		if st != free {
			ps = append(ps, p)
		}
	}
	t.renewAndRetake(ctx, ps)
}

// renewAndRetake renews the leases of ps, then takes back together those
// found expired (outside a reconcile, which batches them with its takes).
func (t *Table) renewAndRetake(ctx context.Context, ps []int) {
	t.retakeEach(ctx, t.renewEach(ctx, ps))
}

// retakeEach takes back the lapsed leases of ps, together (see tookBack).
func (t *Table) retakeEach(ctx context.Context, ps []int) {
	for _, tk := range t.takeEach(ctx, ps) {
		t.tookBack(ctx, tk)
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
		if id == t.cfg.Member && !gone && string(e.Value()) == t.nonce && e.Created().After(t.serverNow) {
			t.serverNow = e.Created()
		}
		if gone {
			delete(t.members, id)
		} else {
			t.members[id] = seen{at: e.Created(), rev: e.Revision()}
		}
	case strings.HasPrefix(key, "lease."):
		p, err := strconv.Atoi(strings.TrimPrefix(key, "lease."))
		if err != nil || p < 0 || p >= t.cfg.Partitions {
			return
		}
		if have, ok := t.leases[p]; ok && have.rev > e.Revision() {
			// A change older than what is known (the watcher lags behind
			// this member's own writes): a later one superseded it. After
			// a retake, though, another member's write in the stall is
			// older than the retake's create and still tells something.
			t.heldMeanwhile(p, e)
			return
		}
		if s, ok := t.retook[p]; ok && e.Revision() >= s.upto {
			delete(t.retook, p) // the watch has caught up with the retake
		}
		if gone {
			had := t.leases[p]
			delete(t.leases, p)
			if e.Operation() == jetstream.KeyValuePurge && had.owner == t.cfg.Member && t.holding(p) {
				// Expired (a MaxAge marker), not given back, while this
				// member held it: its renewals came late. reconcile takes
				// it back if nobody else has (tookBack).
				t.lapsed[p] = had.rev
				return
			}
			t.lost(p, "its lease expired or was deleted")
			return
		}
		l := lease{owner: string(e.Value()), rev: e.Revision(), seen: e.Created()}
		t.leases[p] = l
		if l.owner != t.cfg.Member {
			delete(t.lapsed, p)
			t.lost(p, "another member holds its lease")
		}
	}
}

// heldMeanwhile looks at e, a change of p's lease older than the lease
// this member holds: if p was taken back (tookBack) and e is another
// member's write after the lapse (its create, or its delete when it gave
// p back; an expiry marker may be this member's own), that member held p
// in the stall, and HeldMeanwhile is told, once.
//
// The retake's create came after e (a create succeeds only on an absent
// key): that member's holding was over by then, and the retake's new
// epoch already makes the states cached before it be read again. Nothing
// else depends on noticing it.
func (t *Table) heldMeanwhile(p int, e jetstream.KeyValueEntry) {
	s, ok := t.retook[p]
	if !ok || e.Revision() <= s.after {
		return
	}
	other := e.Operation() == jetstream.KeyValueDelete ||
		(e.Operation() == jetstream.KeyValuePut && string(e.Value()) != t.cfg.Member)
	if !other {
		return
	}
	delete(t.retook, p)
	t.mu.Lock()
	current := t.state[p] == held && t.epoch[p] == s.epoch
	t.mu.Unlock()
	if !current {
		return // a later holding began, or none: nothing to tell
	}
	t.cfg.OnError(fmt.Errorf("partition %d: another member held it while its lease had lapsed here (before it was taken back)", p), "lease")
	t.starting.Add(1)
	go func() { defer t.starting.Done(); t.cfg.HeldMeanwhile(p, s.epoch) }()
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
	delete(t.retook, p)
	t.mu.Lock()
	st := t.state[p]
	if st == free {
		t.mu.Unlock()
		return
	}
	t.state[p] = free
	epoch := t.epoch[p]
	t.changedLocked()
	t.mu.Unlock()
	t.cfg.OnError(fmt.Errorf("partition %d lost: %s", p, why), "lease")
	if st == held {
		t.starting.Add(1)
		go func() { defer t.starting.Done(); t.cfg.Release(p, epoch) }() // not this member's: nothing to give back
	}
}

// opCtx bounds one request of the table's loop: a slow one must not hold
// up the renewals behind it past the leases' time to live.
func (t *Table) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, t.cfg.TTL/2)
}

// stopping reports whether err is only the table's context being
// cancelled (its member stopping): nothing to warn about.
func stopping(ctx context.Context, err error) bool {
	return errors.Is(err, context.Canceled) && errors.Is(ctx.Err(), context.Canceled)
}

// heartbeat renews this member's key. The write goes out at once; the
// func returned waits for its answer and settles it, in the loop, which
// may renew the leases meanwhile.
func (t *Table) heartbeat(ctx context.Context) (settle func()) {
	ctx, cancel := t.opCtx(ctx)
	answer := make(chan error, 1)
	go func() {
		_, err := t.js.Publish(ctx, "$KV."+t.kv.Bucket()+"."+MemberKey(t.cfg.Member), []byte(t.nonce), jetstream.WithMsgTTL(t.cfg.TTL))
		answer <- err
	}()
	return func() {
		defer cancel()
		if err := <-answer; err != nil {
			if !stopping(ctx, err) {
				t.cfg.OnError(err, "renew membership")
			}
			return
		}
		t.members[t.cfg.Member] = seen{}
	}
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
	acts := make([]act, len(t.owners))
	var renewals []int
	for p, owner := range t.owners {
		acts[p] = t.next(p, owner, renewing)
		if acts[p] == renewIt {
			renewals = append(renewals, p)
		}
	}
	// The renewals first, together: they are what cannot wait.
	for _, p := range t.renewEach(ctx, renewals) {
		acts[p] = retakeIt // found lapsed by its refused renewal
	}
	var takes []int
	for p, a := range acts {
		switch a {
		case loseIt:
			t.lost(p, "its lease expired")
		case giveBackIt:
			t.startRelease(p)
		case retakeIt, takeIt:
			takes = append(takes, p)
		}
	}
	// Then the takes and retakes, together too: one after the other, a
	// survivor taking a dead member's partitions, or a member taking its
	// leases back after a stall, waited two round trips per partition
	// (each lease's read, then its write) before handling the last one.
	for _, tk := range t.takeEach(ctx, takes) {
		if acts[tk.p] == retakeIt {
			t.tookBack(ctx, tk)
		} else {
			t.acquired(ctx, tk)
		}
	}
}

// act is what reconcile does with a partition.
type act int

const (
	leaveIt    act = iota
	loseIt         // its lease expired under this member, which may no longer handle it
	retakeIt       // its lease expired under this member, which goes on handling it
	giveBackIt     // held here, another member's by the members' decision
	renewIt        // held or being given back: its lease is renewed
	takeIt         // this member's by the members' decision, and free
)

// next decides what reconcile does with p, which owner should hold.
func (t *Table) next(p int, owner string, renewing bool) act {
	t.mu.Lock()
	st := t.state[p]
	t.mu.Unlock()
	l, leased := t.leases[p]
	_, lapsed := t.lapsed[p]
	switch {
	case lapsed && (st != held || owner != t.cfg.Member):
		return loseIt
	case lapsed:
		return retakeIt
	case st == held && owner != t.cfg.Member:
		return giveBackIt
	case st != free && renewing: // every tick: three chances before the lease expires
		return renewIt
	case st == free && owner == t.cfg.Member && (!leased || l.owner == t.cfg.Member && len(t.unanswered[p]) > 0):
		// Its own lease too when takes of it had no answer: such a
		// take's write, stored, which the watch shows (sendTake knows it).
		return takeIt
	}
	return leaveIt
}

// acquired starts handling the partition of tk, a take of a free one, if
// it took the lease.
func (t *Table) acquired(ctx context.Context, tk taken) {
	p, sent, rev, vacancy, err := tk.p, tk.sent, tk.rev, tk.v, tk.err
	if err != nil {
		if !errors.Is(err, errTaken) && !errors.Is(err, errRefused) && ctx.Err() == nil {
			t.cfg.OnError(err, fmt.Sprintf("take partition %d", p))
		}
		return // the next reconcile tries again, if the lease is still absent
	}
	delete(t.retook, p)
	t.leases[p] = lease{owner: t.cfg.Member, rev: rev}
	t.mu.Lock()
	t.state[p], t.until[p] = held, sent.Add(t.cfg.TTL)
	t.epoch[p] = epochs.Add(1)
	t.since[p] = t.epoch[p]
	epoch := t.epoch[p]
	t.found[p] = found{epoch, vacancy}
	t.left[p] = false
	t.changedLocked()
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

// renewEach renews the leases of ps. Their writes go out together, then
// each answer is settled in turn: one renewal after the other, a tick
// took a round trip per partition, and on a loaded server the last ones
// came later than their leases lived. A lease found to hold an earlier
// renewal stored after all (stillMine) is renewed once more from the
// revision found, so that its holding does not lapse here: those
// renewals go out together too (a tick's answers all lost leave the next
// tick's renewals all refused). It returns the leases found expired
// (refused, and no longer there), for their caller to take back
// together: after a stall, a tick's renewals all find them so.
func (t *Table) renewEach(ctx context.Context, ps []int) (retakes []int) {
	again, r1 := t.renewTogether(ctx, ps)
	_, r2 := t.renewTogether(ctx, again)
	return append(r1, r2...)
}

// renewTogether renews the leases of ps, their writes together, and
// returns those to renew again (stillMine) and those to take back, found
// expired (tookBack).
func (t *Table) renewTogether(ctx context.Context, ps []int) (again, retakes []int) {
	if len(ps) == 0 {
		return nil, nil
	}
	rs := make([]renewal, len(ps))
	opCtx, cancel := t.opCtx(ctx)
	var wg sync.WaitGroup
	for i, p := range ps {
		rs[i] = renewal{p: p, l: t.leases[p]}
		wg.Go(func() { t.sendRenewal(opCtx, &rs[i]) })
	}
	wg.Wait()
	cancel()
	for _, r := range rs {
		switch t.settleRenewal(ctx, r) {
		case renewAgain:
			again = append(again, r.p)
		case retakeNow:
			retakes = append(retakes, r.p)
		}
	}
	return again, retakes
}

// renewal is a renewal's write of lease l of partition p, and its answer.
type renewal struct {
	p    int
	l    lease
	sent time.Time
	ack  *jetstream.PubAck
	err  error
	// found is the lease read after the write was refused for its
	// expected revision, or why it could not be (findErr).
	found   jetstream.KeyValueEntry
	findErr error
}

// sendRenewal writes r's renewal and keeps the answer in r; if the write
// is refused for its expected revision, it reads what the lease holds
// (stillMine settles it). It is all I/O: it changes nothing of the
// table's.
func (t *Table) sendRenewal(ctx context.Context, r *renewal) {
	r.sent = t.cfg.Now() // before the write: the lease lives its TTL from a moment after this
	r.ack, r.err = t.writeRenewal(ctx, &nats.Msg{Subject: "$KV." + t.kv.Bucket() + "." + LeaseKey(r.p), Data: []byte(t.cfg.Member)},
		jetstream.WithMsgTTL(t.cfg.TTL), jetstream.WithExpectLastSequencePerSubject(r.l.rev))
	if wrongLastSequence(r.err) {
		r.found, r.findErr = t.readRenewed(ctx, LeaseKey(r.p))
	}
}

// renewed is what follows a renewal's answer (settleRenewal).
type renewed int

const (
	renewDone  renewed = iota // renewed, lost, or to renew at the next tick
	renewAgain                // the lease holds an earlier renewal: renew again from its revision (stillMine)
	retakeNow                 // the lease expired, and nobody else holds it: take it back (tookBack)
)

// settleRenewal settles r's answer, and says what follows it.
func (t *Table) settleRenewal(ctx context.Context, r renewal) renewed {
	p, ack, err, sent := r.p, r.ack, r.err, r.sent
	if err != nil {
		if wrongLastSequence(err) {
			mine, looked := t.stillMine(p, r.found, r.findErr)
			if mine {
				return renewAgain
			}
			if !looked { // the read failed (its time ran out, or stopping): nothing is lost; the next tick renews again
				if !stopping(ctx, r.findErr) {
					t.cfg.OnError(r.findErr, fmt.Sprintf("read lease %d after a refused renewal", p))
				}
				return renewDone
			}
			if _, lapsed := t.lapsed[p]; lapsed { // expired, and nobody else holds it: take it back
				return retakeNow
			}
			delete(t.leases, p)
			t.lost(p, "its lease changed underneath")
			return renewDone
		}
		if !stopping(ctx, err) {
			t.cfg.OnError(err, fmt.Sprintf("renew partition %d", p))
		}
		return renewDone
	}
	t.leases[p] = lease{owner: t.cfg.Member, rev: ack.Sequence}
	t.mu.Lock()
	if t.state[p] != free {
		t.until[p] = sent.Add(t.cfg.TTL)
		t.changedLocked()
	}
	t.mu.Unlock()
	return renewDone
}

// stillMine settles what p's lease was read to hold (e, or err) after a
// renewal was refused for its expected revision. On a busy machine a
// renewal can time out here and be stored all the same (its
// acknowledgement came too late), and the next one, still expecting the
// older revision, is refused: the lease then holds this member's name at
// a newer revision, which it takes as its own (mine). Nobody else writes
// this member's name (a second process with it is ErrDuplicateMember).
// Any other value, or no lease, is a loss.
//
// A lease that expired (no value: a renewal came after the TTL) and that
// this member still holds is marked lapsed, for retake. A read that
// failed tells nothing (not looked): the holding's validity runs out
// unless a later renewal succeeds.
func (t *Table) stillMine(p int, e jetstream.KeyValueEntry, err error) (mine, looked bool) {
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		if t.holding(p) {
			t.lapsed[p] = t.leases[p].rev
		}
		return false, true
	case err != nil:
		return false, false
	case string(e.Value()) != t.cfg.Member:
		return false, true
	}
	t.leases[p] = lease{owner: t.cfg.Member, rev: e.Revision()}
	t.adopted.Add(1)
	return true, true
}

// tookBack settles tk, a retake: the take back of the lease of its
// partition p, which expired under this member while it still handled p (its process was starved of CPU past the TTL,
// or its connection stalled): if the lease is absent, this member creates
// it again and goes on at once, releasing nothing and resetting nothing.
// Another member that holds it wins: p is lost as usual.
//
// This member cannot tell its own expired lease from another member's
// that was taken and let go during the stall (both leave a marker or no
// key), so the retake begins a new holding: a new epoch, told by Retook,
// in which what was cached before is read again. If the watch then shows
// such a holding, HeldMeanwhile is told (see heldMeanwhile).
func (t *Table) tookBack(ctx context.Context, tk taken) {
	p, sent, rev, err := tk.p, tk.sent, tk.rev, tk.err
	// A retake's write answered late, found by a later take, counts as
	// expired: this member's holding lapsed before it.
	delete(t.unanswered, p)
	switch {
	case errors.Is(err, errTaken):
		t.lost(p, "its lease expired and another member took it")
		return
	case errors.Is(err, errRefused):
		return // lapsed still: the next tick tries again
	case err != nil:
		if ctx.Err() == nil {
			t.cfg.OnError(err, fmt.Sprintf("take back partition %d", p))
		}
		return // lapsed still: the next tick tries again
	}
	after := t.lapsed[p]
	delete(t.lapsed, p)
	t.leases[p] = lease{owner: t.cfg.Member, rev: rev}
	t.mu.Lock()
	old := t.epoch[p]
	retook := t.state[p] == held
	if t.state[p] != free {
		t.until[p] = sent.Add(t.cfg.TTL)
	}
	if retook {
		t.epoch[p] = epochs.Add(1)
	}
	epoch := t.epoch[p]
	t.changedLocked()
	t.mu.Unlock()
	if !retook {
		return // being given back: the release goes on, with its epoch
	}
	t.retook[p] = retakeSpan{after: after, upto: rev, epoch: epoch}
	t.retaken.Add(1)
	t.cfg.Retook(p, old, epoch)
	t.cfg.OnError(fmt.Errorf("partition %d: its lease expired (renewals came late) and nobody held it: taken back, nothing released (its holding goes on as epoch %d)", p, epoch), "lease")
}

// Why a take did not take a lease (sendTake): another member holds it (errTaken), or
// the lease changed after it was read (errRefused).
var (
	errTaken   = errors.New("partition: the lease is held by another member")
	errRefused = errors.New("partition: the lease changed after it was read")
)

// taken is a take of partition p's lease (see sendTake): what it was
// sent with, and its answer.
type taken struct {
	p    int
	sent time.Time // before the write: a lease taken lives its TTL from a moment after this
	// token is the take's TakeHeader; pending, p's takes that had no
	// answer before it (t.unanswered[p] when it was sent).
	token   string
	pending unansweredTakes
	// rev is the lease's revision taken, and v how it was left (the
	// message it replaced), when err is nil.
	rev     uint64
	v       Vacancy
	adopted bool // the lease held this member's name already
	err     error
	// lost is a write without an answer: it may be stored, as found
	// says the lease was left (settleTake remembers it).
	lost  bool
	found Vacancy
}

// takeEach takes the leases of ps for this member: their reads and
// writes go out together, then each answer is settled in turn
// (settleTake). It returns each take, in ps' order.
func (t *Table) takeEach(ctx context.Context, ps []int) []taken {
	if len(ps) == 0 {
		return nil
	}
	out := make([]taken, len(ps))
	sent := t.cfg.Now()
	opCtx, cancel := t.opCtx(ctx)
	defer cancel()
	if t.leaseStream == nil {
		st, err := t.js.Stream(opCtx, "KV_"+t.kv.Bucket())
		if err != nil {
			err = fmt.Errorf("open the stream of bucket %s: %w", t.kv.Bucket(), err)
			for i, p := range ps {
				out[i] = taken{p: p, sent: sent, v: VacancyUnknown, err: err}
			}
			return out
		}
		t.leaseStream = st
	}
	var wg sync.WaitGroup
	for i, p := range ps {
		t.takes++
		out[i] = taken{p: p, sent: sent, token: t.nonce + "." + strconv.FormatUint(t.takes, 10), pending: t.unanswered[p]}
		wg.Go(func() { t.sendTake(opCtx, &out[i]) })
	}
	wg.Wait()
	for i := range out {
		t.settleTake(out[i])
	}
	return out
}

// sendTake writes tk's lease for this member, a compare-and-set on the
// lease's last message, and keeps in tk its revision and how that
// message says the lease was left:
//   - none (never held, or it expired longer ago than the bucket keeps the
//     marker): VacancyNever;
//   - a delete (a holder gave it back): VacancyReleased;
//   - a purge, or the server's marker of an expiry: VacancyExpired;
//   - a lease of this member's name: an earlier write of this member's
//     (one whose answer was lost, or an earlier run's) is there; it is
//     renewed from it (adopted), as VacancyExpired, unless it is the
//     write of one of this member's takes of the partition that had no
//     answer: then as that take found it (TakeHeader, tk.pending);
//   - another member's lease: errTaken.
//
// A write refused because the lease changed since it was read (another
// member took it, or the read was answered by a replica behind the
// lease's last change) is errRefused, to try again later. The
// compare-and-set makes the Vacancy that of the message the lease
// replaced, whatever the watch has shown of it so far. It is all I/O: it
// changes nothing of the table's.
func (t *Table) sendTake(ctx context.Context, tk *taken) {
	subject := "$KV." + t.kv.Bucket() + "." + LeaseKey(tk.p)
	var last uint64
	v := VacancyNever
	// The takes that had no answer are remembered until one is answered:
	// a failed read, a write refused after a replica's stale read, or
	// another member's lease read from one says nothing of them (and a
	// token of theirs can never be the lease's last message again once
	// another member wrote after it).
	m, err := t.leaseStream.GetLastMsgForSubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		tk.v, tk.err = VacancyUnknown, fmt.Errorf("read lease %d: %w", tk.p, err)
		return
	default:
		last, v = m.Sequence, leftAs(m.Header)
		if v == VacancyUnknown { // a lease
			if string(m.Data) != t.cfg.Member {
				tk.v, tk.err = VacancyUnknown, errTaken
				return
			}
			v, tk.adopted = VacancyExpired, true
			if found, ok := tk.pending.of(m.Header.Get(TakeHeader)); ok {
				v = found // such a take's write, stored
			}
		}
	}
	ack, err := t.writeLease(ctx, &nats.Msg{Subject: subject, Data: []byte(t.cfg.Member), Header: nats.Header{TakeHeader: {tk.token}}},
		jetstream.WithMsgTTL(t.cfg.TTL), jetstream.WithExpectLastSequencePerSubject(last))
	switch {
	case wrongLastSequence(err):
		// Changed since it was read (by another member, or the read came
		// from a replica behind): not an error; the next tick looks again.
		tk.v, tk.err = VacancyUnknown, errRefused
	case err != nil:
		tk.v, tk.err = VacancyUnknown, fmt.Errorf("write lease %d: %w", tk.p, err)
		tk.lost, tk.found = true, v
	default:
		tk.rev, tk.v = ack.Sequence, v
	}
}

// settleTake remembers tk's write if it had no answer, and forgets the
// partition's takes that had none once one is answered.
func (t *Table) settleTake(tk taken) {
	switch {
	case tk.lost:
		t.unanswered[tk.p] = t.unanswered[tk.p].with(tk.token, tk.found)
	case tk.err == nil:
		delete(t.unanswered, tk.p)
		if tk.adopted {
			t.adopted.Add(1)
		}
	}
}

// unansweredTakes are a partition's takes whose writes had no answer
// since its last answered take: each one's token, and how the message it
// was written after left the lease (the last maxUnanswered, oldest
// first).
type unansweredTakes []unansweredTake

type unansweredTake struct {
	token string
	found Vacancy
}

// maxUnanswered bounds the takes remembered of a partition.
const maxUnanswered = 8

// of is how the take that wrote token found the lease, if it is one of u.
func (u unansweredTakes) of(token string) (Vacancy, bool) {
	i := slices.IndexFunc(u, func(k unansweredTake) bool { return k.token == token })
	if token == "" || i < 0 {
		return VacancyUnknown, false
	}
	return u[i].found, true
}

// with is u with a take of token that found the lease as found, the
// oldest dropped past maxUnanswered.
func (u unansweredTakes) with(token string, found Vacancy) unansweredTakes {
	u = append(u, unansweredTake{token, found})
	return u[max(0, len(u)-maxUnanswered):]
}

// TakeHeader carries a take's token on the lease it writes: this
// process's nonce and the take's number. A lease of this member's name
// found with the token of one of its takes of the partition that had no
// answer (those since the last answered) is that take's write; one
// without such a token is an earlier run's.
const TakeHeader = "Jetflow-Take"

// leftAs is how a lease's last message, of headers h, says its holder
// left it: VacancyUnknown for a lease (held, or its expiry not marked
// yet). Only a key-value delete is a lease given back; a purge, and any
// marker of the server's, are taken for a holder that may have died.
func leftAs(h nats.Header) Vacancy {
	switch h.Get("KV-Operation") {
	case "DEL":
		return VacancyReleased
	case "PURGE":
		return VacancyExpired
	}
	if h.Get(jetstream.MarkerReasonHeader) != "" {
		return VacancyExpired
	}
	return VacancyUnknown
}

// Vacancy tells how partition p's lease was found when this member took
// it to begin holding epoch (sendTake), or VacancyUnknown if holding epoch did
// not begin so (a retake) or is no longer p's. A bucket must keep the
// markers of expired keys (its LimitMarkerTTL) for as long as whoever
// asks looks back for what a holder that died may have left: an expiry
// whose marker is gone is VacancyNever.
func (t *Table) Vacancy(p int, epoch uint64) Vacancy {
	t.mu.Lock()
	defer t.mu.Unlock()
	if f := t.found[p]; f.epoch == epoch && t.epoch[p] == epoch {
		return f.vacancy
	}
	return VacancyUnknown
}

// wrongLastSequence reports a refused compare-and-set: code 10071, or
// 10164 on a replicated stream.
func wrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// changedSince reports a key-value write or delete refused because the
// key is no longer at the revision it expected.
func changedSince(err error) bool {
	return wrongLastSequence(err) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// Retaken counts the leases that expired under this member while it held
// them and that it took back (nobody held them), without a release.
func (t *Table) Retaken() int64 { return t.retaken.Load() }

// startRelease stops handling p in the background; the lease is deleted
// when that is done (finishRelease), and renewed meanwhile.
func (t *Table) startRelease(p int) {
	t.mu.Lock()
	t.state[p] = releasing
	epoch := t.epoch[p]
	t.changedLocked()
	t.mu.Unlock()
	t.starting.Add(1)
	go func() {
		defer t.starting.Done()
		t.release(p, epoch)
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
		t.changedLocked()
	}
	t.mu.Unlock()
	if done {
		t.giveBack(ctx, h.p)
	}
}

// release runs Config.Release for p's holding epoch, and notes whether
// it left something for the next holder.
func (t *Table) release(p int, epoch uint64) {
	handedOver := t.cfg.Release(p, epoch)
	t.mu.Lock()
	if t.epoch[p] == epoch { // not a later holding's
		t.left[p] = t.left[p] || !handedOver
	}
	t.mu.Unlock()
}

// giveBack deletes p's lease, or purges it if its release left something
// for the next holder (which then takes it for expired: sendTake). A delete
// refused because the lease is at a later revision than the one known
// (a renewal stored whose answer was lost: a stop cuts one short) is
// made again at the lease's revision, if it is still this member's; if
// it is no longer (it expired while the release waited for the jobs in
// hand, and may be another member's since), there is nothing to give
// back, and nothing to report.
func (t *Table) giveBack(ctx context.Context, p int) {
	l, ok := t.leases[p]
	if !ok || l.owner != t.cfg.Member {
		return
	}
	t.mu.Lock()
	left := t.left[p]
	t.mu.Unlock()
	drop, how := t.kv.Delete, "give back"
	if left {
		drop, how = t.kv.Purge, "purge (its release left something to look for)"
	}
	ctx, cancel := t.opCtx(ctx)
	defer cancel()
	err := drop(ctx, LeaseKey(p), jetstream.LastRevision(l.rev))
	if changedSince(err) {
		e, gerr := t.kv.Get(ctx, LeaseKey(p))
		switch {
		case gerr == nil && string(e.Value()) == t.cfg.Member:
			err = drop(ctx, LeaseKey(p), jetstream.LastRevision(e.Revision()))
		case errors.Is(gerr, jetstream.ErrKeyNotFound) || (gerr == nil && string(e.Value()) != t.cfg.Member):
			err = nil // no longer this member's lease
		}
	}
	if err != nil {
		t.cfg.OnError(err, fmt.Sprintf("%s partition %d", how, p))
		return // it expires
	}
	delete(t.leases, p)
}

// leave releases everything and deletes the member key, so that the
// others need not wait for the keys to expire.
func (t *Table) leave() {
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
	t.changedLocked()
	t.mu.Unlock()
	for _, p := range holding { // those releasing are being released already
		wg.Add(1)
		go func() { defer wg.Done(); t.release(p, epochOf[p]) }()
	}
	wg.Wait()
	t.starting.Wait() // starts that were under way, and releases begun before
	for _, p := range holding {
		t.release(p, epochOf[p]) // a start that finished after the release above
	}
	// The releases may have waited long (for the jobs in hand): the time
	// to give the leases back starts now, or they would expire, and the
	// next holder take them for a death.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, p := range mine {
		t.giveBack(ctx, p)
	}
	if err := t.kv.Delete(ctx, MemberKey(t.cfg.Member)); err != nil {
		t.cfg.OnError(err, "leave")
	}
}

// dropGhosts forgets the other members whose key, and deletes the other
// members' leases that, the server stored longer ago than staleAfter: they
// should have expired (see staleAfter). The keys are deleted only if
// unchanged since (a live member's renewal changes them), so that every
// member's view drops them too.
func (t *Table) dropGhosts(ctx context.Context) {
	now := t.serverNow
	if now.IsZero() {
		return // this member's own renewal not seen yet
	}
	for id, m := range t.members {
		if id == t.cfg.Member || m.at.IsZero() || now.Sub(m.at) <= t.staleAfter() {
			continue
		}
		delete(t.members, id)
		t.cfg.OnError(fmt.Errorf("member %s last renewed %s ago, past its %s TTL: a ghost the server kept (nats-io/nats-server#8505); deleting it",
			id, now.Sub(m.at).Round(time.Second), t.cfg.TTL), "drop a stale member")
		t.deleteIfUnchanged(ctx, MemberKey(id), m.rev)
	}
	for p, l := range t.leases {
		if l.owner == t.cfg.Member || l.seen.IsZero() || now.Sub(l.seen) <= t.staleAfter() {
			continue
		}
		delete(t.leases, p)
		// Purged, not deleted: its holder died, and the next taker must
		// not take it for given back (sendTake).
		t.cfg.OnError(fmt.Errorf("lease of partition %d held by %s was last renewed %s ago, past its %s TTL: a ghost the server kept; purging it",
			p, l.owner, now.Sub(l.seen).Round(time.Second), t.cfg.TTL), "drop a stale lease")
		t.purgeIfUnchanged(ctx, LeaseKey(p), l.rev)
	}
}

// deleteIfUnchanged deletes key if its last revision is still rev.
func (t *Table) deleteIfUnchanged(ctx context.Context, key string, rev uint64) {
	t.dropIfUnchanged(ctx, key, rev, t.kv.Delete)
}

// purgeIfUnchanged purges key if its last revision is still rev: the
// watch shows a purge, as it shows an expiry, where a delete is a lease
// given back.
func (t *Table) purgeIfUnchanged(ctx context.Context, key string, rev uint64) {
	t.dropIfUnchanged(ctx, key, rev, t.kv.Purge)
}

func (t *Table) dropIfUnchanged(ctx context.Context, key string, rev uint64,
	drop func(context.Context, string, ...jetstream.KVDeleteOpt) error) {
	ctx, cancel := t.opCtx(ctx)
	defer cancel()
	err := drop(ctx, key, jetstream.LastRevision(rev))
	if err != nil && !stopping(ctx, err) && !changedSince(err) {
		t.cfg.OnError(err, "delete the stale key "+key)
	}
	// A key changed since (the stale holder renewed, or another took it)
	// is no longer stale: left as it is, and nothing to report.
}
