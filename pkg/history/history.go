// Package history reads execution histories from the events stream and
// appends to them with optimistic concurrency.
package history

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/groupcommit"
)

// Read returns the events on the subjects matching filter from stream
// sequence fromSeq (0 or 1 = from the start) up to the last one its
// stream's leader had when the read began (or, after a transient failure,
// when it went on): at least every event appended before the call. Events of unknown types are returned with a nil
// Data (folds decide whether they may skip them); malformed messages are
// returned marked Invalid.
func Read(ctx context.Context, js jetstream.JetStream, filter string, fromSeq uint64) ([]events.Event, error) {
	return ReadUntil(ctx, js, filter, fromSeq, 0)
}

// ReadUntil is Read stopping after stream sequence untilSeq (0 = no limit).
func ReadUntil(ctx context.Context, js jetstream.JetStream, filter string, fromSeq, untilSeq uint64) ([]events.Event, error) {
	return ReadStream(ctx, js, bus.StreamEvents, filter, fromSeq, untilSeq)
}

// ReadStream is ReadUntil on any jetflow stream that allows direct gets
// (bus.Streams: results, commands, rejections, kill notices).
func ReadStream(ctx context.Context, js jetstream.JetStream, stream, filter string, fromSeq, untilSeq uint64) ([]events.Event, error) {
	var out []events.Event
	err := Scan(ctx, js, stream, filter, fromSeq, untilSeq, func(ev events.Event) error {
		out = append(out, ev)
		return nil
	})
	return out, err
}

// ErrNoEvent is returned by [First] for a filter no event matches.
var ErrNoEvent = errors.New("history: no event")

// Store is the events stream, for the services that append to histories
// and check them often (the dispatcher, the api, the projector). No
// append, read or freshness check through it costs a stream-info request:
// each asks the stream's leader, or its replicas, directly.
type Store struct {
	js jetstream.JetStream
	// commit gathers appends into atomic batches ([Options.GroupCommit]);
	// nil: each append is a publish of its own.
	commit *groupcommit.Committer
}

// Options of a Store.
type Options struct {
	// GroupCommit gathers the appends made at once into atomic batches
	// (docs/adr/0020): for a server that fsyncs every write
	// (sync_interval: always), which fsyncs a batch once. The events
	// stream must allow atomic batches (ErrNoAtomicBatches). Close the
	// store when done.
	GroupCommit bool
	// GroupCommitFailed, if set, is told of each batch that failed (its
	// appends then made one by one): see groupcommit.Config.Failed.
	GroupCommitFailed func(err error, appends int)
}

// ErrNoAtomicBatches: group commit was asked for, and the events stream
// does not allow atomic batches (bus.AllowsAtomicBatches).
var ErrNoAtomicBatches = bus.ErrNoAtomicBatches

// ErrNoDirectGets: the events stream does not allow direct gets, with
// which histories are read (docs/adr/0006): it was made by an earlier
// release, and jetflow bootstrap of this one has not run.
var ErrNoDirectGets = errors.New("the events stream does not allow direct gets, with which this release reads histories: " +
	"run jetflow bootstrap of this release first (docs/upgrades.md)")

// Open returns the store of the events stream, which must exist and
// allow direct gets (ErrNoDirectGets).
func Open(ctx context.Context, js jetstream.JetStream) (*Store, error) {
	return OpenWith(ctx, js, Options{})
}

// OpenWith is Open with options.
func OpenWith(ctx context.Context, js jetstream.JetStream, o Options) (*Store, error) {
	stream, err := js.Stream(ctx, bus.StreamEvents)
	if err != nil {
		return nil, fmt.Errorf("open events stream: %w", err)
	}
	cfg := stream.CachedInfo().Config
	if !cfg.AllowDirect {
		return nil, ErrNoDirectGets
	}
	s := &Store{js: js}
	if o.GroupCommit {
		if err := bus.AllowsAtomicBatches(cfg); err != nil {
			return nil, err
		}
		s.commit = groupcommit.New(js, groupcommit.Config{Timeout: appendAttempt, Failed: o.GroupCommitFailed})
	}
	return s, nil
}

// Close stops the store's group commit, once the appends handed to it
// are written. An append made after goes on its own.
func (s *Store) Close() {
	if s.commit != nil {
		s.commit.Stop()
	}
}

// GroupCommits returns what the store's group commit wrote: zero without
// it.
func (s *Store) GroupCommits() groupcommit.Stats {
	if s.commit == nil {
		return groupcommit.Stats{}
	}
	return s.commit.Stats()
}

// Read is [Read] on the store's stream.
func (s *Store) Read(ctx context.Context, filter string, fromSeq uint64) ([]events.Event, error) {
	return Read(ctx, s.js, filter, fromSeq)
}

// LastSeq returns the stream sequence of the last event on subject (0:
// none), with one request to the stream's leader (bus.LeaderGet: a
// replica may not have stored the latest event yet).
func (s *Store) LastSeq(ctx context.Context, subject string) (uint64, error) {
	last, err := lastStored(ctx, s.js, bus.StreamEvents, subject)
	if err != nil {
		return 0, fmt.Errorf("last event on %s: %w", subject, err)
	}
	return last, nil
}

// First returns the first event of the events stream on the subjects
// matching filter (an execution's first event, for its filter), with one
// request instead of reading the history. A message that is no valid
// event comes back marked Invalid, as from Scan.
func First(ctx context.Context, js jetstream.JetStream, filter string) (events.Event, error) {
	return (&Store{js: js}).First(ctx, filter)
}

// First is [First] on the store's stream.
func (s *Store) First(ctx context.Context, filter string) (events.Event, error) {
	m, err := bus.LeaderGet(ctx, s.js, bus.StreamEvents, bus.MsgQuery{Seq: 1, NextBySubject: filter})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return events.Event{}, fmt.Errorf("%w on %s", ErrNoEvent, filter)
	}
	if err != nil {
		return events.Event{}, fmt.Errorf("first event on %s: %w", filter, err)
	}
	ev, err := bus.Decode(m.Header, m.Data)
	if err != nil && !errors.Is(err, events.ErrUnknownType) {
		ev = bus.InvalidEvent(m.Subject, m.Header, err) // as Scan hands it on
		ev.Time = m.Time
	}
	ev.Seq = m.Sequence
	return ev, nil
}

// Scan calls fn for each event on the subjects matching filter, from
// stream sequence fromSeq up to untilSeq (0 = the last one the stream's
// leader had when the scan began, as for Read), in order, without holding them all in memory. Events
// of unknown types have a nil Data; a message that is no valid event is
// passed as an event with Invalid set (folds quarantine its execution).
// An error from fn stops the scan.
func Scan(ctx context.Context, js jetstream.JetStream, stream, filter string, fromSeq, untilSeq uint64, fn func(events.Event) error) error {
	return scan(ctx, js, stream, filter, fromSeq, untilSeq, strictScan, func(_ string, ev events.Event) error { return fn(ev) })
}

// ScanStored is Scan that tells fn the subject each event is stored on
// (an event names its execution itself, but only the subject says whose
// history holds it).
func ScanStored(ctx context.Context, js jetstream.JetStream, stream, filter string, fromSeq, untilSeq uint64, fn func(subject string, ev events.Event) error) error {
	return scan(ctx, js, stream, filter, fromSeq, untilSeq, strictScan, fn)
}

// ScanReports reads, in order, the messages of a stream that anyone may
// publish on (agents' reports in JF_RESULTS) matching filter: a message
// that is not a valid event is passed over instead of stopping the scan,
// so one bad message cannot hide the reports after it. Histories are read
// with Scan: a malformed event there is corruption, shown as such
// (Event.Invalid).
func ScanReports(ctx context.Context, js jetstream.JetStream, stream, filter string, fn func(events.Event) error) error {
	return ScanReportsFrom(ctx, js, stream, filter, 0, fn)
}

// ScanReportsFrom is ScanReports from stream sequence fromSeq on.
func ScanReportsFrom(ctx context.Context, js jetstream.JetStream, stream, filter string, fromSeq uint64, fn func(events.Event) error) error {
	return scan(ctx, js, stream, filter, fromSeq, 0, skipBadScan, func(_ string, ev events.Event) error { return fn(ev) })
}

// ScanIf says which messages a scan hands on, and how much of its time
// it may spend reading.
type ScanIf struct {
	// Keep takes a message by its subject, headers and data, before it
	// is decoded (nil: all): a scan of a long stretch of a stream that
	// wants a few of its events decodes only those.
	Keep func(subject string, header nats.Header, data []byte) bool
	// Share, above 0 and below 1, bounds the part of the scan's time
	// spent reading: after each batch it waits for the batch's time
	// times (1-Share)/Share. A scan in the background of other work (a
	// dispatcher's rescue after a death) leaves the rest of the cores to
	// it. 0 (or 1): no wait.
	Share float64
}

// ScanReportsIf is ScanReportsFrom handing on only the messages opt.Keep
// takes, at the pace opt.Share allows.
func ScanReportsIf(ctx context.Context, js jetstream.JetStream, stream, filter string, fromSeq uint64,
	opt ScanIf, fn func(events.Event) error) error {
	return scanIf(ctx, js, stream, filter, fromSeq, 0, skipBadScan, opt, func(_ string, ev events.Event) error { return fn(ev) })
}

// ScanQueue is ScanReportsFrom on a work-queue stream (the agents'
// tasks), whose messages are removed as they are acknowledged, also
// while it is read.
func ScanQueue(ctx context.Context, js jetstream.JetStream, stream, filter string, fromSeq uint64, fn func(events.Event) error) error {
	return scan(ctx, js, stream, filter, fromSeq, 0, queueScan, func(_ string, ev events.Event) error { return fn(ev) })
}

// scanHow is how a scan takes what it reads.
type scanHow int

const (
	// strictScan: a history; a malformed event is handed on, marked.
	strictScan scanHow = iota
	// skipBadScan: messages anyone may publish; one that is not a valid
	// event is passed over.
	skipBadScan
	// queueScan: skipBadScan of a work queue, whose messages go while it
	// is read: no message up to the end the leader named means none.
	queueScan
)

// scanAttempts bounds the reads of a scan that fails for a transient
// reason (bus.Transient) or meets a replica that has not stored the
// history's latest events yet: each attempt goes on from the last event
// fn took, and may be answered by another replica.
const scanAttempts = 5

func scan(ctx context.Context, js jetstream.JetStream, stream, filter string, fromSeq, untilSeq uint64, how scanHow, fn func(string, events.Event) error) error {
	return scanIf(ctx, js, stream, filter, fromSeq, untilSeq, how, ScanIf{}, fn)
}

// scanIf is scan, handing on only the messages opt.Keep takes (by their
// subject, headers and data, before they are decoded; nil: all), at the
// pace opt.Share allows.
func scanIf(ctx context.Context, js jetstream.JetStream, stream, filter string, fromSeq, untilSeq uint64, how scanHow,
	opt ScanIf, fn func(string, events.Event) error) error {
	// next is the sequence to read from: after a transient failure the
	// scan goes on from there, so that fn sees every event once.
	next := fromSeq
	delivered := func(seq uint64) { next = seq + 1 }
	for attempt := 1; ; attempt++ {
		err := scanOnce(ctx, js, stream, filter, next, untilSeq, how, opt, fn, delivered)
		var fnErr callbackError
		switch {
		case err == nil:
			return nil
		case errors.As(err, &fnErr):
			return fnErr.err
		case ctx.Err() != nil:
			return fmt.Errorf("read %s: %w (the last attempt: %w)", filter, ctx.Err(), err)
		case attempt == scanAttempts || !bus.Transient(err):
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("read %s: %w (the last attempt: %w)", filter, ctx.Err(), err)
		case <-time.After(time.Duration(attempt*attempt) * 20 * time.Millisecond):
		}
	}
}

// pause waits, after a batch that took took, as long as Share asks.
func (o ScanIf) pause(ctx context.Context, took time.Duration) error {
	if o.Share <= 0 || o.Share >= 1 || took <= 0 {
		return nil
	}
	t := time.NewTimer(time.Duration(float64(took) * (1 - o.Share) / o.Share))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// callbackError is an error of scan's fn: it ends the scan as it is.
type callbackError struct{ err error }

func (e callbackError) Error() string { return e.err.Error() }

// directGetHeaders are the headers a direct get adds to each message.
var directGetHeaders = []string{jetstream.StreamHeader, jetstream.SubjectHeader, jetstream.SequenceHeader,
	jetstream.TimeStampHeaer, "Nats-Num-Pending", "Nats-Last-Sequence"}

// readBatch is how many messages one direct get asks for, and
// readBatchBytes bounds their size (the server stops a batch there).
const (
	readBatch      = 1000
	readBatchBytes = 4 << 20
)

// A batch and its end fit in a connection's synchronous subscription
// buffer (bus.SyncQueueLen): the build fails otherwise.
var _ [bus.SyncQueueLen - readBatch - 1]struct{}

// scanOnce reads once, telling delivered the sequence of each event fn
// took.
//
// It reads with batched direct gets (streams that are read this way allow
// them, docs/adr/0006): one request per thousand events, answered by any
// replica, with no consumer to create and delete. A consumer lives on one
// node that the cluster picks: while that node was down (and before the
// cluster knew it) reads failed or waited, and every execution whose
// history was read stalled until the node came back. A replica may lag
// behind the leader, so the stream's leader first says where the history
// ends (its last event on filter); the scan reads up to there, asking
// again (any replica may answer) until it has it all.
func scanOnce(ctx context.Context, js jetstream.JetStream, stream, filter string, fromSeq, untilSeq uint64, how scanHow,
	opt ScanIf, fn func(string, events.Event) error, delivered func(uint64)) error {
	if bus.WholeStream(stream, filter) {
		// The whole stream (a re-projection): asked so, the server
		// neither walks every subject for the last message nor matches
		// each message against the filter.
		filter = ">"
	}
	// The leader is asked where the history ends while the first batch
	// is read: a short history is read in the time of one request. The
	// first batch's events are real whatever the leader says (a replica
	// only has what the leader stored), so they are handed on at once.
	type bound struct {
		seq uint64
		err error
	}
	ends := make(chan bound, 1)
	go func() {
		seq, err := lastStored(ctx, js, stream, filter)
		ends <- bound{seq, err}
	}()
	limit := untilSeq
	if limit == 0 {
		limit = math.MaxUint64
	}
	next := max(fromSeq, 1)
	took := func(seq uint64) {
		next = seq + 1
		delivered(seq)
	}
	began := time.Now()
	_, past, err := readFrom(ctx, js, stream, filter, next, limit, how != strictScan, opt.Keep, fn, took)
	b := <-ends
	switch {
	case err != nil:
		return err
	case past:
		return nil
	case b.err != nil:
		return fmt.Errorf("read history %s: %w", filter, b.err)
	}
	end := min(b.seq, limit)
	for next <= end {
		if err := opt.pause(ctx, time.Since(began)); err != nil {
			return fmt.Errorf("read history %s: %w", filter, err)
		}
		began = time.Now()
		got, past, err := readFrom(ctx, js, stream, filter, next, end, how != strictScan, opt.Keep, fn, took)
		switch {
		case err != nil:
			return err
		case past:
			return nil
		case got == 0 && ctx.Err() != nil:
			return fmt.Errorf("read history %s: %w", filter, ctx.Err())
		case got == 0 && how == queueScan:
			// A work queue's messages go as they are acknowledged: the
			// last one the leader named may be gone already.
			return nil
		case got == 0:
			return fmt.Errorf("read history %s from seq %d to %d: %w", filter, next, end, bus.ErrBehind)
		}
	}
	return nil
}

// lastStored is the stream sequence of the last message on filter, from
// the stream's leader (0: there is none).
func lastStored(ctx context.Context, js jetstream.JetStream, stream, filter string) (uint64, error) {
	m, err := bus.LeaderGet(ctx, js, stream, bus.MsgQuery{LastBySubject: filter})
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return 0, nil
	case err != nil:
		return 0, err
	}
	return m.Sequence, nil
}

// readFrom reads one batch of the messages on filter from seq from, and
// returns how many it was given up to end, and whether it was given one
// past end (the scan is done).
func readFrom(ctx context.Context, js jetstream.JetStream, stream, filter string, from, end uint64, skipBad bool,
	keep func(string, nats.Header, []byte) bool, fn func(string, events.Event) error, delivered func(uint64)) (got int, past bool, err error) {
	rctx, cancel := context.WithTimeout(ctx, bus.ServiceRequestTimeout)
	defer cancel()
	opts := []jetstreamext.GetBatchOpt{jetstreamext.GetBatchSeq(from), jetstreamext.GetBatchMaxBytes(readBatchBytes)}
	if filter != ">" {
		opts = append(opts, jetstreamext.GetBatchSubject(filter))
	}
	msgs, err := jetstreamext.GetBatch(rctx, js, stream, readBatch, opts...)
	if err != nil {
		return 0, false, fmt.Errorf("read history %s: %w", filter, err)
	}
	// A batch nobody answered in time ends without an error (the
	// iterator stops): got is 0, and the caller asks again.
	for m, err := range msgs {
		switch {
		case errors.Is(err, jetstreamext.ErrNoMessages): // this replica has none (yet)
			return got, false, nil
		case err != nil:
			return got, false, fmt.Errorf("read history %s: %w", filter, err)
		case m.Sequence > end:
			return got, true, nil
		}
		got++
		if keep != nil && !keep(m.Subject, m.Header, m.Data) {
			delivered(m.Sequence)
			continue
		}
		for _, h := range directGetHeaders { // the server's, not the event's: less to decode
			delete(m.Header, h)
		}
		ev, err := bus.Decode(m.Header, m.Data)
		if err != nil && !errors.Is(err, events.ErrUnknownType) {
			if skipBad {
				delivered(m.Sequence)
				continue
			}
			// A history holds it: hand it on, marked, for folds to
			// quarantine its execution (events.Event.Invalid).
			ev = bus.InvalidEvent(m.Subject, m.Header, err)
			ev.Time = m.Time // when it was stored: all there is to tell
		}
		ev.Seq = m.Sequence
		if err := fn(m.Subject, ev); err != nil {
			return got, false, callbackError{err}
		}
		delivered(m.Sequence)
	}
	return got, false, nil
}

// Append publishes ev on subject if the subject's last stream sequence is
// still lastSeq (0 = the subject is empty). It returns the new sequence.
// If someone else wrote first it returns an error wrapping bus.ErrConflict;
// a retried append of the same event that was in fact stored is recognised
// by its id and succeeds. A replicated stream's refusal while an append
// to the same subject is still being applied (10164, often the caller's
// own previous append: bus.SubjectInFlight) is no answer yet: Append asks
// again a moment later and returns what the stream then decides.
func Append(ctx context.Context, js jetstream.JetStream, subject string, lastSeq uint64, ev events.Event) (uint64, error) {
	return (&Store{js: js}).Append(ctx, subject, lastSeq, ev)
}

// appendAttempt bounds one publish of an append (bus.PublishAttempt):
// while the events stream elects a leader (4 to 9 s after its leader's
// node died) a publish gets no answer at all; bounded, it is sent again
// and stored soon after the election.
const appendAttempt = bus.PublishAttempt

// appendAttempts covers the longest election (nats-server's Raft waits 4
// to 9 s for a leader that stopped answering, then elects one), so an
// append sent during it is stored within an attempt of the new leader:
// with three attempts (4.5 s) an append that began early in a 5 s
// election failed, was handed back to its consumer, and came back only
// after the consumer's ack wait.
const appendAttempts = 7

// appendInProcessWaits bounds the waits, 250 ms each, for an earlier
// attempt that a replicated stream is still storing ("duplicate message
// id is in process"): those do not count as attempts.
const appendInProcessWaits = 20

// appendInFlightWaits bounds the waits for an append to the same subject
// that a replicated stream is still applying (bus.SubjectInFlight): 2,
// 4, 8 ... ms, capped at 100 ms, about 1.1 s in all. They do not count as
// attempts either.
const appendInFlightWaits = 16

// Append is [Append] on the store's stream. With group commit, the append
// goes in the committer's next batch; a batch that failed says nothing of
// this append alone (another one's check may have failed it, or its
// answer was lost after it was stored), so the append is then made on its
// own, which decides it as without group commit.
func (s *Store) Append(ctx context.Context, subject string, lastSeq uint64, ev events.Event) (uint64, error) {
	if s.commit != nil {
		if seq, decided, err := appendGrouped(ctx, s.commit, subject, lastSeq, ev); decided {
			return seq, err
		}
	}
	return s.appendAlone(ctx, subject, lastSeq, ev)
}

// appendGrouped hands the append to the committer; decided is false when
// its batch failed (or the committer stopped): the append is then to be
// made on its own.
func appendGrouped(ctx context.Context, c *groupcommit.Committer, subject string, lastSeq uint64, ev events.Event) (seq uint64, decided bool, err error) {
	msg, err := appendMsg(subject, lastSeq, ev)
	if err != nil {
		return 0, true, err
	}
	seq, err = c.Publish(ctx, msg)
	switch {
	case err == nil:
		return seq, true, nil
	case ctx.Err() != nil: // cut short: stored or not, as a publish cut short
		return 0, true, fmt.Errorf("append %s to %s: %w", ev.Type, subject, err)
	}
	return 0, false, nil
}

// appendMsg is the message appending ev to subject after lastSeq: its
// id the message id, the subject's last sequence expected.
func appendMsg(subject string, lastSeq uint64, ev events.Event) (*nats.Msg, error) {
	msg, err := bus.Encode(subject, ev)
	if err != nil {
		return nil, err
	}
	msg.Header.Set(jetstream.MsgIDHeader, ev.ID)
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(lastSeq, 10))
	return msg, nil
}

// appendAlone is Append as a publish of its own.
func (s *Store) appendAlone(ctx context.Context, subject string, lastSeq uint64, ev events.Event) (uint64, error) {
	msg, err := bus.Encode(subject, ev)
	if err != nil {
		return 0, err
	}
	var ack *jetstream.PubAck
	inProcess, inFlight := 0, 0
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, appendAttempt)
		ack, err = s.js.PublishMsg(actx, msg, jetstream.WithMsgID(ev.ID), jetstream.WithExpectLastSequencePerSubject(lastSeq))
		cancel()
		wait := 50 * time.Millisecond
		if bus.InProcess(err) && inProcess < appendInProcessWaits {
			// An earlier attempt is still being stored by the replicas: it
			// does not count as an attempt; ask again once it is done.
			inProcess++
			attempt--
			wait = 250 * time.Millisecond
		} else if bus.SubjectInFlight(err) && inFlight < appendInFlightWaits {
			// The subject's last append, often our own, was still being
			// applied: the expected sequence was not checked. Ask again
			// once it is applied.
			inFlight++
			attempt--
			wait = min(time.Millisecond<<inFlight, 100*time.Millisecond)
		} else if err == nil || attempt == appendAttempts || ctx.Err() != nil || !bus.Transient(err) {
			break
		}
		// The same id and expected sequence again: an attempt that was
		// stored after all is recognised (a duplicate, or below).
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	if err == nil {
		return ack.Sequence, nil
	}
	return s.failed(ctx, subject, lastSeq, ev, err)
}

// failed is what an append of ev to subject after lastSeq that failed
// with err comes to. A single server checks the expected sequence before
// dedupe, so our own earlier, successful attempt looks like a conflict:
// the last event's id tells, and then the append succeeded after all.
func (s *Store) failed(ctx context.Context, subject string, lastSeq uint64, ev events.Event, err error) (uint64, error) {
	if !bus.IsConflict(err) {
		return 0, fmt.Errorf("append %s to %s: %w", ev.Type, subject, err)
	}
	if last, gerr := bus.LeaderGet(ctx, s.js, bus.StreamEvents, bus.MsgQuery{LastBySubject: subject}); gerr == nil && last.Header.Get(jetstream.MsgIDHeader) == ev.ID {
		return last.Sequence, nil
	}
	return 0, fmt.Errorf("append %s to %s after seq %d: %w", ev.Type, subject, lastSeq, bus.ErrConflict)
}

// Pending is one append of a batch ([Store.AppendBatch]): Event, to
// Subject, if the subject's last stream sequence is still LastSeq.
type Pending struct {
	Subject string
	LastSeq uint64
	Event   events.Event
}

// Appended is the outcome of one append of a batch: the new sequence, or
// why it was not stored (an error wrapping bus.ErrConflict when another
// writer went first).
type Appended struct {
	Seq uint64
	Err error
}

// AppendBatch appends each of appends as [Store.Append] does, with its
// own expected last subject sequence (the fence) and message id, but
// publishes them all before it waits for their acknowledgements: a batch
// of appends to different histories costs about one round trip instead
// of one each. Each append succeeds or fails alone; the outcome of
// appends[i] is out[i]. Two appends to the same subject in one batch
// cannot both succeed (the second expects the first's predecessor): give
// each history at most one.
//
// Unlike Append it tries each once: an append that timed out or met a
// leader election may have been stored, so the caller reads the history
// again before deciding anew (a conflict of its own earlier attempt is
// recognised, as by Append). An append a replicated stream refused
// unchecked because the subject was in flight (bus.SubjectInFlight) was
// not stored: it is sent again by Append.
//
// With group commit, the appends go in the committer's batches; those of
// a batch that failed are then made as without it.
func (s *Store) AppendBatch(ctx context.Context, appends []Pending) []Appended {
	c := s.commit
	if c == nil {
		return s.appendBatchAlone(ctx, appends)
	}
	out := make([]Appended, len(appends))
	answers := make([]<-chan groupcommit.Result, len(appends))
	for i, a := range appends {
		msg, err := appendMsg(a.Subject, a.LastSeq, a.Event)
		if err != nil {
			out[i].Err = err
			continue
		}
		answers[i] = c.Submit(msg)
	}
	var again []Pending // undecided: their batch failed
	var at []int
	for i, answer := range answers {
		if answer == nil {
			continue
		}
		select {
		case r := <-answer:
			if r.Err == nil {
				out[i].Seq = r.Seq
				continue
			}
			again, at = append(again, appends[i]), append(at, i)
		case <-ctx.Done():
			out[i].Err = fmt.Errorf("append %s to %s: %w", appends[i].Event.Type, appends[i].Subject, ctx.Err())
		}
	}
	if len(again) > 0 {
		for k, res := range s.appendBatchAlone(ctx, again) {
			out[at[k]] = res
		}
	}
	return out
}

// appendBatchAlone is AppendBatch, each append a publish of its own.
func (s *Store) appendBatchAlone(ctx context.Context, appends []Pending) []Appended {
	out := make([]Appended, len(appends))
	futures := make([]jetstream.PubAckFuture, len(appends))
	for i, a := range appends {
		msg, err := bus.Encode(a.Subject, a.Event)
		if err != nil {
			out[i].Err = err
			continue
		}
		futures[i], err = s.js.PublishMsgAsync(msg, jetstream.WithMsgID(a.Event.ID), jetstream.WithExpectLastSequencePerSubject(a.LastSeq))
		if err != nil {
			out[i].Err = fmt.Errorf("append %s to %s: %w", a.Event.Type, a.Subject, err)
		}
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			// Too many acks outstanding on the connection: each further
			// publish would wait and fail the same. The rest are left to
			// be appended one by one.
			for k := i + 1; k < len(appends); k++ {
				out[k].Err = fmt.Errorf("append %s to %s: %w", appends[k].Event.Type, appends[k].Subject, err)
			}
			break
		}
	}
	wait, cancel := context.WithTimeout(ctx, appendAttempt)
	defer cancel()
	errs := make([]error, len(appends))
	for i, f := range futures {
		if f == nil {
			continue
		}
		select {
		case ack := <-f.Ok():
			out[i].Seq = ack.Sequence
		case errs[i] = <-f.Err():
		case <-wait.Done():
			// An answer that came meanwhile counts (select picks at
			// random among ready cases).
			select {
			case ack := <-f.Ok():
				out[i].Seq = ack.Sequence
			case errs[i] = <-f.Err():
			default:
				errs[i] = wait.Err()
			}
		}
	}
	// What failed is looked into once every answer is in, so that one
	// append's look (a read of its history's last event) or its sending
	// again does not run down the time the others' answers have.
	for i, err := range errs {
		if err == nil {
			continue
		}
		a := appends[i]
		if bus.SubjectInFlight(err) {
			// Refused unchecked, not stored: asked again as Append asks.
			out[i].Seq, out[i].Err = s.Append(ctx, a.Subject, a.LastSeq, a.Event)
			continue
		}
		out[i].Seq, out[i].Err = s.failed(ctx, a.Subject, a.LastSeq, a.Event, err)
	}
	return out
}

// Linear returns an error unless every event of evs, read in stream order
// from the start of one execution's history, was appended right after the
// one before it: the first event names no previous event and each later
// one's PrevSeq is the Seq of the event before it. A history that forked
// (two events appended after the same event), that lost an event, or
// that was read in pieces out of order fails. Sequences that merely
// increase are not enough: an ordered consumer always gives those.
func Linear(evs []events.Event) error {
	if len(evs) == 0 {
		return errors.New("history: the history is empty")
	}
	var prev uint64
	for i, ev := range evs {
		if ev.Seq == 0 {
			return fmt.Errorf("history: event %d (%s) has no stream sequence: not read from the stream", i, ev.Type)
		}
		if ev.PrevSeq != prev {
			return fmt.Errorf("history: history not linear at event %d (%s, seq %d): appended after seq %d, not after the previous event (seq %d)",
				i, ev.Type, ev.Seq, ev.PrevSeq, prev)
		}
		prev = ev.Seq
	}
	return nil
}
