// Package notices sets long timers' notices back to their firings: what
// an operator runs before rolling the dispatchers back to a release that
// does not know notices (docs/adr/0019, docs/upgrades.md).
//
// A timer due more than two minutes after its arming has, until a minute
// before its due time, a schedule in JF_TIMERS that fires an
// io.jetflow.timer.notice on a subject no older dispatcher reads. ToFirings
// replaces each such schedule with the one a dispatcher without notices
// sets: the io.jetflow.timer.fire, at the due time, on the execution's
// timers subject. Each replacement is conditioned on the schedule being
// the one read (its subject's last sequence): a schedule a dispatcher set
// meanwhile (a re-arming, the notice handled) is left as it is.
//
// JF_TIMERS is a work queue, so it is read without a consumer (one would
// take the schedules out of the stream): its schedules' subjects are
// listed, and each read with a get.
package notices

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/partition"
)

// Source is the CloudEvent source of the firings' schedules ToFirings sets.
const Source = "jetflow/admin"

// Result is what ToFirings did.
type Result struct {
	// Schedules is how many pending schedules its first pass read.
	Schedules int `json:"schedules"`
	// Notices is how many notices its passes found.
	Notices int `json:"notices"`
	// Set is how many notices it set back to their firings.
	Set int `json:"set"`
	// Changed is how many notices were replaced by a dispatcher before it
	// could (a re-arming, or the notice fired and handled), and left so.
	Changed int `json:"changed"`
	// Unreadable is how many schedules it could not decode, and left so.
	Unreadable int `json:"unreadable"`
	// Passes is how many times it read the schedules: until a pass finds
	// no notice (the listing is paged, and schedules that fire between
	// its pages can hide others from it), at most MaxPasses.
	Passes int `json:"passes"`
	// Left is how many notices the last pass still found (0 when it is
	// done).
	Left int `json:"left"`
	// Fired is how many notices have fired and wait for a dispatcher
	// that knows them (their partitions' notices consumers' backlog): a
	// rollback must wait until they are handled.
	Fired uint64 `json:"fired"`
}

// MaxPasses bounds ToFirings' passes over the schedules.
const MaxPasses = 5

// ToFirings sets every pending notice in JF_TIMERS back to its timer's
// firing, at its due time, passing over the schedules until a pass finds
// none (at most MaxPasses), then counts the notices that fired and wait
// for a dispatcher (Result.Fired). now is the clock of the events it
// writes. Dispatchers still setting notices (without
// -timer-notices=false) set new ones meanwhile: turn them off first.
func ToFirings(ctx context.Context, js jetstream.JetStream, now func() time.Time) (Result, error) {
	var res Result
	n, err := bus.Partitions(ctx, js)
	if err != nil {
		return res, err
	}
	stream, err := js.Stream(ctx, bus.StreamTimers)
	if err != nil {
		return res, fmt.Errorf("open stream %s: %w", bus.StreamTimers, err)
	}
	for res.Passes < MaxPasses {
		pass, err := onePass(ctx, js, stream, n, now)
		if res.Passes++; res.Passes == 1 { // the pending schedules, as first found
			res.Schedules, res.Unreadable = pass.Schedules, pass.Unreadable
		}
		res.Notices += pass.Notices
		res.Set += pass.Set
		res.Changed += pass.Changed
		res.Left = pass.Notices
		if err != nil {
			return res, err
		}
		if pass.Notices == 0 {
			break
		}
	}
	for p := range n {
		c, err := js.Consumer(ctx, bus.StreamTimers, bus.PartitionNoticesConsumer(p))
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue // an older bootstrap's deployment: no notice fired into it
		}
		if err != nil {
			return res, fmt.Errorf("the notices consumer of partition %d: %w", p, err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			return res, fmt.Errorf("the notices consumer of partition %d: %w", p, err)
		}
		res.Fired += info.NumPending + uint64(info.NumAckPending)
	}
	return res, nil
}

// onePass is one pass over the schedules of stream: what it read, found
// and did, so far if it failed (a replacement under way when another
// failed may have been stored and not counted: Set is then at least
// what was set). The schedules are read and set back
// Concurrency at a time: one after the other, each a round trip or two,
// 100,000 long timers took minutes.
func onePass(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, n int, now func() time.Time) (res Result, err error) {
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(bus.SchedulesPrefix+".>"))
	if err != nil {
		return res, fmt.Errorf("list the schedules of %s: %w", bus.StreamTimers, err)
	}
	subjects := make([]string, 0, len(info.State.Subjects))
	for s := range info.State.Subjects {
		subjects = append(subjects, s)
	}
	slices.Sort(subjects)
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(Concurrency)
	for _, subject := range subjects {
		if gctx.Err() != nil { // one failed (or ctx ended): start no more
			break
		}
		g.Go(func() error {
			one, err := setBack(gctx, js, stream, subject, n, now)
			mu.Lock()
			res.Schedules += one.Schedules
			res.Unreadable += one.Unreadable
			res.Notices += one.Notices
			res.Set += one.Set
			res.Changed += one.Changed
			mu.Unlock()
			return err
		})
	}
	return res, g.Wait()
}

// Concurrency is how many schedules a pass reads and sets back at once.
const Concurrency = 32

// setBack reads the schedule on subject and sets it back to its firing
// if it is a notice: what it read, found and did.
func setBack(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, subject string, n int, now func() time.Time) (res Result, err error) {
	m, err := stream.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return res, nil // fired since it was listed
	}
	if err != nil {
		return res, fmt.Errorf("read the schedule %s: %w", subject, err)
	}
	res.Schedules++
	ev, err := bus.Decode(m.Header, m.Data)
	if err != nil {
		res.Unreadable++
		return res, nil
	}
	notice, ok := ev.Data.(*events.TimerNotice)
	if !ok {
		return res, nil
	}
	res.Notices++
	if bus.ScheduleSubject(notice.TimerID) != subject {
		res.Unreadable++ // not where its timer's schedule is: not the dispatcher's
		return res, nil
	}
	set, err := toFiring(ctx, js, notice, m.Sequence, n, now())
	switch {
	case err != nil:
		return res, err
	case set:
		res.Set++
	default:
		res.Changed++
	}
	return res, nil
}

// toFiring replaces the notice stored at seq with its timer's firing at
// its due time; false if the schedule is no longer the one at seq.
func toFiring(ctx context.Context, js jetstream.JetStream, notice *events.TimerNotice, seq uint64, partitions int, now time.Time) (bool, error) {
	ev := events.New(Source, notice.ExecutionID, notice.Workflow, now,
		&events.FireTimer{ExecutionID: notice.ExecutionID, Workflow: notice.Workflow, TimerID: notice.TimerID})
	ev.ID = "fire-" + notice.TimerID // as the dispatcher names a firing's schedule
	target := bus.PartitionTimerSubject(partition.Of(notice.ExecutionID, partitions), notice.ExecutionID)
	msg, err := bus.ScheduleMsg(notice.TimerID, ev, notice.Due, target)
	if err != nil {
		return false, fmt.Errorf("the firing of timer %s: %w", notice.TimerID, err)
	}
	msg.Header.Set(jetstream.ExpectedLastSubjSeqHeader, strconv.FormatUint(seq, 10))
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		if bus.IsConflict(err) {
			return false, nil
		}
		return false, fmt.Errorf("set the firing of timer %s: %w", notice.TimerID, err)
	}
	return true, nil
}
