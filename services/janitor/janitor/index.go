package janitor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
	"unique"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// FullReadEvery is how often the janitor reads every read model again
// (at a sweep or a catch-up), rather than only those written since its
// last read. The read models'
// bucket keeps one revision per key, so reading it from a revision on
// gives each model written since then once, with the marker of each one
// deleted: the full read is there for what leaves no marker (the bucket
// purged or made again by hand), which the janitor then forgets.
const FullReadEvery = 10 * time.Minute

// modelIndex is what the sweeps need of every read model, kept from one
// sweep to the next: a sweep reads the models written since the last
// read (the first, and one every FullReadEvery, reads them all; between
// sweeps, catch-ups read those that settled: catchUp), so a
// sweep over executions that did nothing costs next to nothing, where
// reading and decoding every model cost a core-second per 20,000 or so.
// Its entries are small (about 150 bytes with the key and the map's
// room, 180 before their names were interned together) since a janitor
// keeps one per execution kept: times in Unix nanoseconds, the strings
// many models share (workflow, rule, group, status) interned.
//
// A read decodes each model's head only. What the idle part needs of a
// running one besides (does it wait on time, until when; has it a local
// step sending) takes the whole model, and is worked out the first time
// the model is idle long enough to matter, once per revision: a model
// that keeps changing is never decoded whole, one that sleeps once.
type modelIndex struct {
	entries map[string]indexed // by key (execution id)
	next    uint64             // the revision the next read starts at (0: all)
	// seen is the bucket's last revision when the last read asked where
	// it stood: a catch-up reads no further (catchUp).
	seen    uint64
	readAll time.Time // when the last full read ended well (the janitor's clock)
	// bucket is when the bucket's stream was made, as the last full read
	// found it: a bucket made again (by hand) starts its revisions anew,
	// and is read whole, its entries owing nothing to the old one's.
	bucket time.Time
	// ret is the finished executions of entries, by retention group, in
	// order: kept as entries change, made anew at each full read.
	ret *retained
	// bulk: a read of many models written since the last one is under
	// way, ret is made anew after it (refresh).
	bulk bool
	// flights holds, for an idle running execution whose sweep is only
	// to check that its tasks in flight are still in their queue (not
	// waiting on time, no local step sending, a step sent or started),
	// those tasks' sequences in the tasks stream as its model showed them
	// at revision rev. A sweep checks them without reading the model
	// again (an operation of an hour is looked at every sweep); one
	// gone, or the model written since, and the model is read again.
	// Only such executions have one: none of the others pays for it.
	flights map[string]flight
}

// getter gets a stream's message by sequence (a jetstream.Stream).
type getter interface {
	GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error)
}

// flight is what flights holds of an execution: its tasks in flight
// (their sequences; none for a task whose sequence is not recorded yet,
// which a sweep leaves alone), at a revision of its read model.
type flight struct {
	rev  uint64
	seqs []uint64
}

// indexed is one entry of the index: a read model, or the marker that a
// deleted one left.
type indexed struct {
	rev     uint64 // its revision in the bucket
	lastSeq uint64 // the last event of its history it shows
	// Unix nanoseconds (nanos), noTime for none; a marker's updated is
	// when it was made.
	updated, ended, expired int64
	// wake is until when the execution waits on time (waitingOnTime):
	// 0 if it does not, math.MaxInt64 if it does with no timer to come.
	wake int64
	// names are its workflow, rule, group and status (a model's only).
	names    unique.Handle[indexNames]
	kind     indexKind
	hasLocal bool // it names the local queue: it may have a local step sending
	// known: the model was decoded whole at this revision, and wake and
	// localSending (a local step sending) hold.
	known, localSending bool
}

// indexNames are the strings an entry of the index names, interned
// together: their combinations are few (workflows, rules, groups and
// statuses), and an entry keeps one pointer to its own where it kept one
// for each (a third less of the map's room, which is most of an entry).
type indexNames struct {
	workflow, retention, retentionKey unique.Handle[string]
	status                            unique.Handle[projections.Status]
}

// namesOf interns the names of a read model.
func namesOf(workflow, retention, retentionKey string, status projections.Status) unique.Handle[indexNames] {
	return unique.Make(indexNames{workflow: unique.Make(workflow), retention: unique.Make(retention),
		retentionKey: unique.Make(retentionKey), status: unique.Make(status)})
}

// The names of a model's entry (none of these is set on a marker's).
func (x indexed) workflow() string            { return x.names.Value().workflow.Value() }
func (x indexed) retentionKey() string        { return x.names.Value().retentionKey.Value() }
func (x indexed) status() projections.Status  { return x.names.Value().status.Value() }
func (x indexed) rule() unique.Handle[string] { return x.names.Value().retention }

type indexKind uint8

const (
	kindModel   indexKind = iota // a read model the sweep acts on
	kindIgnored                  // unreadable, or damaged (waits for a repair): left alone
	kindMarker                   // the marker of a deleted read model
)

// refresh brings the index up to date with the bucket, reading what
// was written since the last read, or everything when it never read it
// whole or did FullReadEvery ago.
func (ix *modelIndex) refresh(ctx context.Context, kv jetstream.KeyValue, now time.Time) error {
	return ix.read(ctx, kv, now, false)
}

// catchUp reads, between sweeps, the models written since the last read
// that were written before the read before asked the bucket where it
// stood (seen), and not since: models that have settled for at least the
// time between two reads. The sweep then reads only what came after
// them, not everything written since the sweep before (a burst of
// 10,000 executions starting was read at once by the next sweep, into
// whatever burst that fell on), and a model written again and again is
// read by the sweep alone, not at each catch-up. A read of every model
// (the first, one due every FullReadEvery, or of a bucket made again) is
// done as a sweep does it.
func (ix *modelIndex) catchUp(ctx context.Context, kv jetstream.KeyValue, now time.Time) error {
	return ix.read(ctx, kv, now, true)
}

// errSettled stops a catch-up's read at the first model written after
// the bound it reads to.
var errSettled = errors.New("past the models settled")

// read is refresh, or catchUp when settled.
func (ix *modelIndex) read(ctx context.Context, kv jetstream.KeyValue, now time.Time, settled bool) error {
	status, err := kv.Status(ctx)
	if err != nil {
		return fmt.Errorf("read executions: %w", err)
	}
	var bucket time.Time
	var last uint64
	st, known := status.(*jetstream.KeyValueBucketStatus)
	if known {
		info := st.StreamInfo()
		bucket, last = info.Created, info.State.LastSeq
		if !bucket.Equal(ix.bucket) || last+1 < ix.next {
			ix.entries, ix.next, ix.flights = nil, 0, nil // made again: nothing known holds
		}
	}
	full := ix.entries == nil || now.Sub(ix.readAll) >= FullReadEvery || now.Before(ix.readAll)
	upTo := uint64(math.MaxUint64)
	if settled && !full {
		if !known {
			return nil // nothing to bound the read with: the sweep reads
		}
		upTo = min(ix.seen, last)
	}
	ix.seen = last
	var written uint64 // at most, since the last read
	if known {
		bound := min(upTo, last)
		written = bound + 1 - min(ix.next, bound+1)
	}
	if settled && !full && written == 0 {
		return nil
	}
	// Many models written since (a re-projection, a burst): the groups
	// are made again once read, rather than each execution moved in its
	// group as it comes (one moved far from its group's end costs a copy
	// of the members after it).
	ix.bulk = !full && written > uint64(max(bulkAfter, len(ix.entries)/4))
	defer func() { ix.bulk = false }()
	entries, next := ix.entries, ix.next
	var opts []jetstream.WatchOpt
	if full {
		entries, next = make(map[string]indexed, len(ix.entries)), 0
	} else if next > 0 {
		opts = append(opts, jetstream.ResumeFromRevision(next))
	}
	err = watchModels(ctx, kv, func(e jetstream.KeyValueEntry) error {
		if e.Revision() > upTo {
			return errSettled // read in order: all that follow are too
		}
		next = max(next, e.Revision()+1)
		had, ok := ix.entries[e.Key()]
		changed := !ok || had.rev != e.Revision()
		x := had // the same model: what is known of it holds
		if changed {
			x, _ = readIndexed(e, false)
		}
		switch {
		case full:
			// A key of its own: the entry's is a slice of the subject.
			entries[strings.Clone(e.Key())] = x
		case changed:
			ix.set(e.Key(), had, ok, x)
		}
		return nil
	}, opts...)
	if errors.Is(err, errSettled) {
		err = nil
	}
	if upTo != math.MaxUint64 && err == nil {
		// Every revision to upTo read (those gone were written again
		// after it): the next read starts past it.
		next = max(next, upTo+1)
	}
	if !full {
		// Entries are read in order: those applied hold whatever the
		// read stopped at.
		ix.next = next
		if ix.bulk {
			ix.ret = retainedOf(ix.entries)
		}
	}
	if err != nil {
		return err
	}
	ix.entries, ix.next = entries, next
	if full {
		ix.readAll, ix.bucket = now, bucket
		ix.ret = retainedOf(entries)
	}
	return nil
}

// set makes x the entry of key, which had the entry old (ok: it had one),
// and moves its execution in ix.ret to where x puts it.
func (ix *modelIndex) set(key string, old indexed, ok bool, x indexed) {
	if ok && !ix.bulk && samePlace(old, x) {
		// Under the member's own string: assigning replaces a map's key.
		if id, found := ix.ret.memberID(key, old); found {
			ix.entries[id] = x
			return
		}
	}
	// A key of its own (the caller's may be a slice of a message's
	// subject), shared by the map (an assignment replaces its key: no
	// delete, which would leave the map a tombstone to grow by) and the
	// group's member.
	key = strings.Clone(key)
	ix.entries[key] = x
	if !ix.bulk {
		ix.ret.update(key, old, ok, x)
	}
}

// bulkAfter is how many models written since the last read, at least,
// make the groups be made again after the read (bulk): a quarter of the
// index, and no fewer than this.
const bulkAfter = 1000

// readIndexed makes the entry of a bucket entry, from the head of a read
// model, and with whole from the whole of a running one (what the idle
// part needs of it; whole is returned, nil for any other entry).
func readIndexed(e jetstream.KeyValueEntry, whole bool) (indexed, *projections.Execution) {
	if e.Operation() != jetstream.KeyValuePut {
		return indexed{rev: e.Revision(), kind: kindMarker, updated: nanos(e.Created())}, nil
	}
	var h modelHead
	// The step table, most of a large model, is not read; a model with no
	// head to read (or one that does not decode) is decoded whole.
	if _, ok := projections.DecodeStoredHead(e.Value(), &h); !ok {
		h = modelHead{}
		if json.Unmarshal(e.Value(), &h) != nil {
			return indexed{rev: e.Revision(), kind: kindIgnored}, nil
		}
	}
	if h.Damaged != nil {
		return indexed{rev: e.Revision(), kind: kindIgnored}, nil
	}
	x := indexed{
		rev: e.Revision(), lastSeq: h.LastSeq,
		updated: nanos(h.UpdatedAt), ended: nanos(h.EndedAt), expired: nanos(h.ExpiredAt),
		names: namesOf(h.Workflow, h.Retention, h.RetentionKey, h.Status),
	}
	if !h.Status.Active() {
		return x, nil
	}
	x.hasLocal = bytes.Contains(e.Value(), localQueueJSON)
	if !whole {
		return x, nil
	}
	var all projections.Execution
	if json.Unmarshal(e.Value(), &all) != nil {
		// Unreadable whole: known, not waiting, no local step sending.
		// Its idle part decides nothing, as before the index.
		x.known = true
		return x, nil
	}
	x.known, x.localSending, x.wake = true, localSending(all), wakeOf(all)
	return x, &all
}

// localQueueJSON is how a read model's step run by its dispatcher shows
// its queue: a model without it has no local step sending.
var localQueueJSON = []byte(`"queue":"` + workflow.LocalQueue + `"`)

// wakeOf is until when waitingOnTime(x, now) holds: 0 if it holds at no
// time, math.MaxInt64 if at every time (nothing due: a wait for a
// signal), else until its earliest timer still to fire is overdue (due a
// minute ago), in Unix nanoseconds. Whatever else waitingOnTime looks at
// does not depend on the time.
func wakeOf(x projections.Execution) int64 {
	if !waitingOnTime(x, time.Time{}) {
		return 0
	}
	wake := int64(math.MaxInt64)
	for _, t := range x.Timers {
		if !t.Fired {
			wake = min(wake, nanos(t.Due.Add(time.Minute)))
		}
	}
	return wake
}

// noTime is nanos of the zero time.
const noTime = math.MinInt64

// The times nanos holds apart: those before and after are clamped.
var (
	firstNano = time.Unix(0, math.MinInt64+1)
	lastNano  = time.Unix(0, math.MaxInt64)
)

// nanos is t in Unix nanoseconds, noTime for the zero time, clamped to
// what an int64 holds (1678 to 2262).
func nanos(t time.Time) int64 {
	switch {
	case t.IsZero():
		return noTime
	case t.Before(firstNano):
		return math.MinInt64 + 1
	case t.After(lastNano):
		return math.MaxInt64
	}
	return t.UnixNano()
}

// timeOf is the time of Unix nanoseconds n (nanos' inverse).
func timeOf(n int64) time.Time {
	if n == noTime {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

// finished is the entry's retention fields.
func (x indexed) finished(id string) finished {
	return finished{ID: id, Workflow: x.workflow(), Status: x.status(), EndedAt: timeOf(x.ended),
		Retention: x.rule().Value(), RetentionKey: x.retentionKey(), LastSeq: x.lastSeq, ExpiredAt: timeOf(x.expired)}
}

// marker is a deleted read model's marker in the bucket.
type marker struct {
	key string
	rev uint64
}

// swept is what the index says the sweep must look at, besides the
// finished executions (ix.ret): the running ones idle long enough to be
// looked at (look: read again whole, then decided as before: those known
// to be idle, and those not known yet; check: those known to have only
// their tasks in flight to check, flights); how many idle ones are known
// to merely wait on time (a sleep, a signal: nothing to do); and the
// markers of deleted models older than markerAge.
func (ix *modelIndex) swept(now time.Time, idleAfter time.Duration) (out swept, look []string, check []string) {
	for key, f := range ix.flights {
		if x, ok := ix.entries[key]; !ok || x.rev != f.rev {
			delete(ix.flights, key) // deleted, or written since
		}
	}
	if len(ix.flights) == 0 {
		ix.flights = nil // a map keeps its room: let a burst's go
	}
	for key, x := range ix.entries {
		switch x.kind {
		case kindMarker:
			if now.Sub(timeOf(x.updated)) > markerAge {
				out.oldMarkers = append(out.oldMarkers, marker{key: key, rev: x.rev})
			}
		case kindModel:
			if x.status().Active() {
				quiet := now.Sub(timeOf(x.updated))
				if quiet < idleAfter && (quiet < LocalIdleAfter || !x.hasLocal) {
					continue
				}
				if x.known && !x.localSending {
					if quiet < idleAfter {
						continue // a local step, not sending
					}
					if x.wake != 0 && nanos(now) <= x.wake {
						out.waiting++ // waitingOnTime: sweepIdle would do nothing
						continue
					}
					if _, ok := ix.flights[key]; ok {
						check = append(check, key)
						continue
					}
				}
				look = append(look, key)
			}
		}
	}
	return out, look, check
}

// inFlight returns the sequences of x's tasks in flight (a step sent or
// started; 0 for one whose sequence is not recorded), and whether it has
// any: what sweepIdle checks of an execution not waiting on time.
func inFlight(x projections.Execution) ([]uint64, bool) {
	var seqs []uint64
	flying := false
	for _, st := range x.Steps {
		if !stepInFlight(st) {
			continue
		}
		flying = true
		if st.TaskSeq != 0 {
			seqs = append(seqs, st.TaskSeq)
		}
	}
	return seqs, flying
}

// stepInFlight reports whether a step's task is in flight: sent, or
// started by an agent.
func stepInFlight(st projections.Step) bool {
	return st.Status == projections.OpSent || st.Status == projections.OpStarted
}

// checkFlights checks the tasks in flight of the executions keys (each
// with one in flights): those whose tasks are all still in the tasks
// stream are counted in out.flying, and nothing more is done about them,
// as sweepIdle would do nothing; the others (a task gone) are returned,
// in the order of keys, to be read again whole and decided as before. A
// task that could not be read is taken to be there, as sweepIdle takes it
// (the next sweep looks again), and counted in out.errors. Up to
// flightGets executions are checked at once (each a get at a time): the
// gets are round trips, and one after another they made a sweep over
// many long operations wait on each.
func (ix *modelIndex) checkFlights(ctx context.Context, tasks getter, keys []string, out *swept, log zerolog.Logger) (look []string, err error) {
	if len(keys) == 0 {
		return nil, nil
	}
	type checked struct {
		gone   bool
		errors int
	}
	res := make([]checked, len(keys))
	check := func(i int) {
		for _, seq := range ix.flights[keys[i]].seqs {
			_, err := tasks.GetMsg(ctx, seq)
			switch {
			case ctx.Err() != nil:
				return
			case errors.Is(err, jetstream.ErrMsgNotFound):
				res[i].gone = true // read the model again, and decide
				return
			case err != nil:
				log.Warn().Err(err).Str("execution_id", keys[i]).Uint64("task_seq", seq).Msg("sweep: look for a task in flight, will retry")
				res[i].errors++
			}
		}
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(flightGets, len(keys)) {
		wg.Go(func() {
			for i := range next {
				check(i)
			}
		})
	}
	for i := range keys {
		if ctx.Err() != nil {
			break // stopped: what was not handed out is not got
		}
		next <- i
	}
	close(next)
	wg.Wait() // ix.flights is only read meanwhile
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	for i, r := range res {
		out.errors += r.errors
		if r.gone {
			look = append(look, keys[i])
			continue
		}
		out.flying++
	}
	return look, nil
}

// flightGets bounds the executions whose tasks checkFlights gets at once.
const flightGets = 16

// lookAgain reads the read models of keys whole, as they are now,
// updates their entries, and adds those idle to out.idle, as the sweep
// decided before the index. A few are read one by one; many (a tenth of
// the index and more than lookOneByOne: executions that all fell asleep
// together, idle for the first time) in one pass over the bucket.
func (ix *modelIndex) lookAgain(ctx context.Context, kv jetstream.KeyValue, keys []string, now time.Time, idleAfter time.Duration, out *swept, log zerolog.Logger) error {
	look := func(e jetstream.KeyValueEntry) {
		had, ok := ix.entries[e.Key()]
		if ok && e.Revision() < had.rev {
			return // an older model than the index's (a replica behind): the next sweep looks
		}
		x, whole := readIndexed(e, true)
		if ok {
			ix.set(e.Key(), had, true, x)
		}
		// Its tasks in flight are all a sweep has to look at when it waits
		// on nothing else and has no local step sending (swept's gate, and
		// sweepIdle's decision: a step in flight, nothing else done).
		var seqs []uint64
		flying := false
		if whole != nil && x.kind == kindModel && ok && !x.localSending && x.wake == 0 {
			seqs, flying = inFlight(*whole)
		}
		if flying {
			if ix.flights == nil {
				ix.flights = map[string]flight{}
			}
			ix.flights[strings.Clone(e.Key())] = flight{rev: x.rev, seqs: seqs}
		} else {
			delete(ix.flights, e.Key())
		}
		if whole == nil || x.kind != kindModel {
			return
		}
		if quiet := now.Sub(whole.UpdatedAt); quiet >= idleAfter || (quiet >= LocalIdleAfter && x.localSending) {
			out.idle = append(out.idle, *whole)
		}
	}
	if len(keys) > lookOneByOne && len(keys) > len(ix.entries)/10 {
		want := make(map[string]bool, len(keys))
		for _, key := range keys {
			want[key] = true
		}
		return watchModels(ctx, kv, func(e jetstream.KeyValueEntry) error {
			if want[e.Key()] && e.Operation() == jetstream.KeyValuePut {
				look(e)
			}
			return nil
		})
	}
	for _, key := range keys {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // deleted since: its marker comes with the next read
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			log.Warn().Err(err).Str("execution_id", key).Msg("sweep: read an idle execution's read model, will retry")
			out.errors++
			continue
		}
		look(e)
	}
	return nil
}

// lookOneByOne is how many read models lookAgain reads one request each
// at most, when they are not a tenth of the index.
const lookOneByOne = 100

// purgeMarkers removes the markers of deleted read models from the
// bucket, each no further than its own revision (a model written again
// under its key since is kept), and from the index.
func (ix *modelIndex) purgeMarkers(ctx context.Context, js jetstream.JetStream, markers []marker) error {
	if len(markers) == 0 {
		return nil
	}
	bucketStream := bus.BucketStream(bus.BucketExecutions)
	stream, err := js.Stream(ctx, bucketStream)
	if err != nil {
		return fmt.Errorf("open %s: %w", bucketStream, err)
	}
	for _, m := range markers {
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject(bus.BucketSubject(bus.BucketExecutions, m.key)), jetstream.WithPurgeSequence(m.rev+1)); err != nil {
			return fmt.Errorf("purge the marker of %s: %w", m.key, err)
		}
		if ix.entries[m.key].rev == m.rev {
			delete(ix.entries, m.key)
		}
	}
	return nil
}
