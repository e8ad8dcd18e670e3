package agent

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/partition"
)

// Reports handed straight to the dispatcher (docs/adr/0009). A final
// report about a task whose dispatcher takes them goes to the holder of
// the execution's partition as a core NATS request; that dispatcher
// records it, acknowledges the task and answers. Without that answer the
// report is stored on the results stream and the task acknowledged here,
// as before direct reports: either way a task leaves its queue only once
// its report is in the history or on the results stream.

// deliver reports a task's final result, id its CloudEvent id, and lets
// the task go: handed straight to its dispatcher when it takes direct
// reports, otherwise (or when no dispatcher answers that it recorded it)
// stored on the results stream and the task acknowledged here.
//
// A report handed straight is waited for on its own goroutine, which keeps
// the task alive meanwhile: the worker that ran the operation takes its
// next task at once, as it does once a report is stored, and a dispatcher
// slow to answer (a fan-out's reports queue behind each other there) holds
// no worker.
func (a *Agent) deliver(ctx context.Context, m jetstream.Msg, task *events.Task, id string, p events.Payload, log zerolog.Logger) {
	req, err := a.directRequest(task, id, p, m.Reply())
	if err != nil {
		if !errors.Is(err, errNoDirect) {
			log.Warn().Err(err).Msg("report not handed directly: stored on the results stream")
		}
		a.finish(m, a.report(ctx, id, p), log)
		return
	}
	a.reporting.Go(func() {
		stop := a.keepAlive(m, log)
		defer stop()
		answer, err := a.request(ctx, req)
		if err == nil && answer.Header.Get(bus.DirectOutcomeHeader) == bus.DirectRecorded {
			return // recorded, and the task acknowledged by the dispatcher
		}
		if err != nil {
			log.Debug().Err(err).Msg("report not taken directly: stored on the results stream")
		} else {
			log.Debug().Str("outcome", answer.Header.Get(bus.DirectOutcomeHeader)).Str("reason", string(answer.Data)).
				Msg("report refused directly: stored on the results stream")
		}
		a.finish(m, a.report(ctx, id, p), log)
	})
}

// keepAlive tells JetStream every heartbeatEvery that the task of m is
// still in hand, until stop is called.
func (a *Agent) keepAlive(m jetstream.Msg, log zerolog.Logger) (stop func()) {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(a.heartbeatEvery())
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := m.InProgress(); err != nil {
					log.Warn().Err(err).Msg("heartbeat")
				}
			}
		}
	}()
	return sync.OnceFunc(func() { close(done) })
}

// errNoDirect: the task's dispatcher takes no direct reports, or this
// agent hands none.
var errNoDirect = errors.New("no direct reports")

// directRequest is the request that hands report p (CloudEvent id) about
// task straight to the holder of its execution's partition. ack is the
// task delivery's acknowledgement subject, for the dispatcher to
// acknowledge it once the report is recorded ("" for none). errNoDirect:
// the report is not to be handed so.
func (a *Agent) directRequest(task *events.Task, id string, p events.Payload, ack string) (*nats.Msg, error) {
	if a.cfg.NoDirectReports || task.Partitions <= 0 || a.direct.paused() {
		return nil, errNoDirect
	}
	msg, err := a.resultMsg(id, p)
	if err != nil {
		return nil, err
	}
	msg.Subject = bus.DirectResultSubject(task.Queue, partition.Of(task.ExecutionID, task.Partitions), task.ExecutionID)
	if ack != "" {
		msg.Header.Set(bus.DirectTaskAckHeader, ack)
	}
	return msg, nil
}

// request sends a direct report and waits up to DirectWait for the
// answer. A request nobody answers in time, while no other got an answer
// either, pauses direct reports (see directPause).
func (a *Agent) request(ctx context.Context, req *nats.Msg) (*nats.Msg, error) {
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, a.cfg.DirectWait)
	defer cancel()
	answer, err := a.js.Conn().RequestMsgWithContext(rctx, req)
	switch {
	case err == nil:
		a.direct.answered.Store(time.Now().UnixNano())
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil && a.direct.answered.Load() < sent.UnixNano():
		if a.direct.pause(time.Now()) {
			a.log.Warn().Dur("direct_wait", a.cfg.DirectWait).Dur("pause", directPause).
				Msg("no dispatcher answered the reports handed to it directly: reports are stored on the results stream for a while " +
					"(dispatchers stopped or stuck, or agent credentials issued before direct reports: issue them again)")
		}
	}
	return answer, err
}

// directPause is how long an agent stores every report once direct
// reports went unanswered, none answered since the first of them was
// sent: its credentials do not let it hand them (a permission violation
// is no error a request sees: each would wait DirectWait), or its
// dispatchers are stuck. A report that one dead dispatcher took with it
// while others answer pauses nothing: it is stored after DirectWait.
const directPause = 30 * time.Second

// directState pauses direct reports (directPause).
type directState struct {
	until    atomic.Int64 // unix nanoseconds: no direct report before then
	answered atomic.Int64 // unix nanoseconds: when the last answer came
}

func (s *directState) paused() bool { return time.Now().UnixNano() < s.until.Load() }

// pause pauses direct reports from now; it reports whether they were not
// paused already.
func (s *directState) pause(now time.Time) bool {
	was := s.until.Load()
	return s.until.CompareAndSwap(was, now.Add(directPause).UnixNano()) && was < now.UnixNano()
}

// attemptOver asks the dispatcher whether the attempt of a task delivered
// again (delivery) is over: its operation's started report, handed
// straight to the dispatcher, is recorded, and the answer says whether
// the attempt is still in flight. False when it cannot know (no direct
// reports, no answer): the operation then runs, as before direct reports.
func (a *Agent) attemptOver(ctx context.Context, task *events.Task, ref events.TaskRef, delivery int) bool {
	req, err := a.directRequest(task, startedReportID(task.TaskID, delivery), &events.OperationStarted{TaskRef: ref, StartedAt: time.Now().UTC()}, "")
	if err != nil {
		return false
	}
	answer, err := a.request(ctx, req)
	return err == nil && answer.Header.Get(bus.DirectOutcomeHeader) == bus.DirectRecorded &&
		answer.Header.Get(bus.DirectAttemptHeader) == bus.DirectAttemptOver
}
