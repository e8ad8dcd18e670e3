package dispatch

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/services/dispatcher/interp"
)

// Reports handed straight to the dispatcher (docs/adr/0009): an agent
// asks the holder of its task's partition to record a report, a core NATS
// request on jf.direct.<queue>.<partition>.<execution>, instead of storing
// it on the results stream for the partition's consumer. The report is
// handled as a stored one would be (the same intake, the same turns, the
// same handling); only its message differs (directMsg): its
// acknowledgement answers the agent that the report is handled, and
// anything else that the agent should store the report itself. A report
// the handling did not apply because its execution was not running (it
// ended, or is suspended) is answered so too: a resume looks for such
// reports on the results stream.
//
// Answers go only to the agents' answer subjects (bus.AnswersPrefix): the
// reply subject is the agent's to choose, and the dispatcher may publish
// on histories, tasks and its buckets.

// directBacklog is how many jobs of one execution may wait for their turn
// before a report handed straight to the dispatcher is refused at once,
// to be stored: a fan-out's reports then wait on the results stream,
// under its consumer's flow control, instead of in memory, and no agent
// waits for an answer that would come late.
const directBacklog = 64

// directMsg is a report handed straight to the dispatcher, seen by the
// handling as a consumer's message.
type directMsg struct {
	msg *nats.Msg
	nc  *nats.Conn
	// by is when its agent stops waiting for the answer (it then stores
	// the report), less a margin: a report still in the turns by then is
	// not handled. id is the report's CloudEvent id, once decoded.
	by time.Time
	id string
	// over is set by the handling of an operation's started report: the
	// task's attempt is no longer in flight (interp.AttemptOver). keep:
	// the report was not applied because its execution was not running,
	// and must be stored.
	over, keep atomic.Bool
	answered   atomic.Bool
}

// late reports whether its agent has stopped waiting for the answer.
func (m *directMsg) late(now time.Time) bool { return !m.by.IsZero() && now.After(m.by) }

var errNotStored = errors.New("a report handed straight to the dispatcher is stored nowhere: it has no metadata")

func (m *directMsg) Metadata() (*jetstream.MsgMetadata, error) { return nil, errNotStored }
func (m *directMsg) Data() []byte                              { return m.msg.Data }
func (m *directMsg) Headers() nats.Header                      { return m.msg.Header }
func (m *directMsg) Subject() string                           { return m.msg.Subject }
func (m *directMsg) Reply() string                             { return m.msg.Reply }

// InProgress does nothing: the agent waits for the answer (up to its
// direct wait) while it keeps its task alive.
func (m *directMsg) InProgress() error { return nil }

// Ack answers the agent that its report is handled: it acknowledges its
// task then. A report kept (its execution was not running) is refused,
// to be stored.
func (m *directMsg) Ack() error {
	if m.keep.Load() {
		return m.refuse("its execution has ended: store it, for a resume to find")
	}
	m.answer(bus.DirectRecorded, "")
	return nil
}

func (m *directMsg) DoubleAck(context.Context) error { return m.Ack() }

// Nak, NakWithDelay, Term and TermWithReason refuse the report: the agent
// stores it on the results stream, where it is handled again (or
// rejected again) as any stored report.
func (m *directMsg) Nak() error                         { return m.refuse("not handled here now") }
func (m *directMsg) NakWithDelay(time.Duration) error   { return m.refuse("not handled here now") }
func (m *directMsg) Term() error                        { return m.refuse("cannot be handled") }
func (m *directMsg) TermWithReason(reason string) error { return m.refuse(reason) }

func (m *directMsg) refuse(why string) error {
	m.answer(bus.DirectRefused, why)
	return nil
}

// answer answers the agent once (later answers are dropped: a report
// refused after it was answered changes nothing the agent does).
func (m *directMsg) answer(outcome, why string) {
	if !answerable(m.msg.Reply) || !m.answered.CompareAndSwap(false, true) {
		return
	}
	r := nats.NewMsg(m.msg.Reply)
	r.Header.Set(bus.DirectOutcomeHeader, outcome)
	if m.id != "" {
		r.Header.Set(bus.DirectReportHeader, m.id)
	}
	if outcome == bus.DirectRecorded && m.over.Load() {
		r.Header.Set(bus.DirectAttemptHeader, bus.DirectAttemptOver)
	}
	r.Data = []byte(why)
	_ = m.nc.PublishMsg(r)
}

// directKey carries, in a handling's context, the report handed straight
// to the dispatcher that it handles.
type directKey struct{}

// answerable reports whether reply is an agent's answer subject: a
// report with any other reply subject gets no answer, and is not handled.
func answerable(reply string) bool { return strings.HasPrefix(reply, bus.AnswersPrefix+".") }

// noteReport marks, on the direct report a handling's context carries,
// what its answer says: to a final report, that it is to be stored, when
// its execution had ended when it came (ended: the status then; a report
// is not applied then, and a resume looks for it on the results stream);
// to an operation's started report, whether the task's attempt is over
// in the execution's state now (the agent then does not run a task
// delivered again that need not run).
func noteReport(ctx context.Context, x *execState, ref events.TaskRef, ev events.Event, ended bool) {
	m, ok := ctx.Value(directKey{}).(*directMsg)
	if !ok {
		return
	}
	if ev.Type == events.TypeOperationStarted {
		// A question (attemptOver): its answer says whether to run.
		m.over.Store(interp.AttemptOver(x.state, ref))
		return
	}
	m.keep.Store(ended)
}

// listenDirect subscribes to the reports handed straight to the holder of
// partition p, handing each to enqueue as a message of holding r.
func (d *Dispatcher) listenDirect(p int, r *consuming, enqueue func(jetstream.Msg, *consuming)) (*nats.Subscription, error) {
	nc := d.js.Conn()
	sub, err := nc.QueueSubscribe(bus.DirectResults(p), bus.DirectQueueGroup, func(m *nats.Msg) {
		if !answerable(m.Reply) {
			return // nobody to answer: a report is only handed this way by an agent, answered on its answer subjects
		}
		dm := &directMsg{msg: m, nc: nc}
		if ms, err := strconv.Atoi(m.Header.Get(bus.DirectWaitHeader)); err == nil && ms > 0 && ms <= 3_600_000 {
			// Half of it: the report travelled, and its handling takes a
			// while, before its agent reads the answer.
			dm.by = time.Now().Add(time.Duration(ms) * time.Millisecond / 2)
		}
		execution := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		question := m.Header.Get("ce-type") == string(events.TypeOperationStarted) // a task delivered again asks
		if work := d.work.Load(); !question && work != nil && work.backlog(execution) >= directBacklog {
			_ = dm.refuse(fmt.Sprintf("execution %s has %d messages waiting here: store the report", execution, directBacklog))
			return
		}
		r.inFlight.Add(1)
		enqueue(dm, r)
	})
	if err != nil {
		return nil, fmt.Errorf("listen for partition %d's direct reports: %w", p, err)
	}
	// Reports come as fast as agents finish tasks: the default pending
	// limits (65,536 messages, 64 MiB) are the bound, beyond which the
	// client drops them and their agents, without an answer, store them.
	return sub, nil
}
