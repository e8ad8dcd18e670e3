package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/startcheck"
	"jetflow.dev/pkg/tracing"
	"jetflow.dev/services/dispatcher/interp"
)

// start applies a start command: it checks it as the api does
// (startcheck.Check), claims the execution id forever (a KV create, so two
// commands can never both own it), appends ExecutionStarted with the
// pinned definition, and schedules the first step. A re-delivered or
// re-published command finds its own claim and only makes sure the
// execution progresses.
func (d *Dispatcher) start(ctx context.Context, ev events.Event, cmd *events.StartExecution) error {
	key, id := startcheck.Identify(ev)
	// Resolve the definition and build the first event before claiming the
	// id, so that a command that cannot start leaves the id free.
	st, err := d.checkStartCommand(ctx, ev, cmd)
	if p := (*startcheck.Problem)(nil); errors.As(err, &p) {
		return d.publishRejected(ctx, ev, &events.CommandRejected{ExecutionID: id, Code: p.Code, Field: p.Field, Reason: p.Message})
	}
	if err != nil && (ctx.Err() != nil || bus.Transient(err)) {
		return err // the catalog could not be read now (the dispatcher stops, a leader is elected): the start is tried again
	}
	if err != nil {
		return permanentError{err}
	}
	started := st.Started
	started.Token, started.APIURL = newToken(), d.cfg.APIURL
	c, made, err := d.ids.ClaimNew(ctx, id, claim.Record{CommandKey: key, Digest: st.Digest, Workflow: cmd.Workflow, ClaimedAt: d.cfg.Now()})
	if conflict := (*claim.ConflictError)(nil); errors.As(err, &conflict) {
		return d.publishRejected(ctx, ev, &events.CommandRejected{ExecutionID: id, Code: events.CodeConflict, Field: "execution_id", Reason: conflict.Reason})
	}
	if err != nil {
		return err
	}
	if c.Expired() { // this command ran, and its execution has since expired: never run it again
		return d.publishRejected(ctx, ev, &events.CommandRejected{ExecutionID: id, Code: events.CodeConflict, Field: "execution_id", Reason: fmt.Sprintf(
			"execution %q expired under its retention rule at %s and its history was deleted; execution ids are unique forever: start a new execution with a new id",
			id, c.ExpiredAt.UTC().Format(time.RFC3339))})
	}
	// A claim this command just made has no history behind it: it is not
	// looked for (a history there all the same, written without a claim,
	// makes the start's append conflict, and the history is read then).
	how := loading{probablyNew: true, empty: made}
	return d.withExecutionAs(ctx, cmd.Workflow, id, how, func(x *execState) error {
		if x.state.Status == projections.StatusNone {
			// The definition as the execution pins it, decoded once per
			// version whatever the number of executions (pinnedDefs).
			def, err := d.pinned.get(cmd.Workflow, started.Version, started.Definition)
			if err != nil {
				return permanentError{err}
			}
			x.def = def
			// The caller's trace context, recorded on the start as it
			// reads (a malformed one is none).
			tp, ts := tracing.Parse(ev.TraceParent, ev.TraceState).Header()
			if tp == "" && d.cfg.Tracer != nil {
				tp, ts = d.newTrace(id)
			}
			x.startTrace = [2]string{tp, ts}
			// With the first operation's dispatch when that is the first
			// decision (docs/adr/0008).
			if err := d.carryOut(ctx, x, interp.Start(d.input(x), started)); err != nil {
				return err
			}

			zerolog.Ctx(ctx).Info().Str("workflow", started.Workflow).Int("version", started.Version).Msg("execution started")
		}
		return d.advance(ctx, x)
	})
}

// reject publishes why a command changes nothing and terminates it.
func (d *Dispatcher) reject(ctx context.Context, cmd events.Event, execID, code, reason string) error {
	return d.publishRejection(ctx, cmd, execID, code, reason, "", 0)
}

// publishRejection publishes the rejection of cmd, which arrived on
// subject at stream sequence seq (if known), and returns the
// rejectedError that terminates the message.
func (d *Dispatcher) publishRejection(ctx context.Context, cmd events.Event, execID, code, reason, subject string, seq uint64) error {
	return d.publishRejected(ctx, cmd, &events.CommandRejected{ExecutionID: execID, Code: code, Reason: reason, Subject: subject, StreamSeq: seq})
}

// publishRejected publishes rej, the rejection of cmd (its command key
// and type filled in here), and returns the rejectedError that
// terminates the message.
func (d *Dispatcher) publishRejected(ctx context.Context, cmd events.Event, rej *events.CommandRejected) error {
	msg, err := rejectionMsg(d.cfg.Source, d.cfg.Now(), cmd, rej)
	if err != nil {
		return err
	}
	key := rej.CommandKey
	if _, err := d.js.PublishMsg(ctx, msg, jetstream.WithMsgID("rej-"+bus.RejectionSubject(key))); err != nil {
		return fmt.Errorf("publish rejection: %w", err)
	}
	d.cfg.Metrics.rejection(rej.Code)
	zerolog.Ctx(ctx).Warn().Str("code", rej.Code).Str("field", rej.Field).Str("reason", rej.Reason).Str("command", key).Msg("command rejected")
	return rejectedError{reason: rej.Reason}
}

// rejectionMsg is the message of rej, the rejection of cmd (its command
// key and type filled in here), from source at now.
func rejectionMsg(source string, now time.Time, cmd events.Event, rej *events.CommandRejected) (*nats.Msg, error) {
	key := events.CommandKey(cmd.Source, cmd.ID)
	rej.CommandKey, rej.CommandType = key, cmd.Type
	return bus.Encode(bus.RejectionSubject(key), events.New(source, rej.ExecutionID, "", now, rej))
}

// result applies an agent's report about a task.
func (d *Dispatcher) result(ctx context.Context, ref events.TaskRef, ev events.Event) error {
	return d.withExecution(ctx, ref.Workflow, ref.ExecutionID, func(x *execState) error {
		if x.state.Status == projections.StatusNone {
			return permanentError{fmt.Errorf("result for unknown execution %s", ref.ExecutionID)}
		}
		if x.state.StepIndex(ref.StepID) < 0 {
			// A nested step is created by its first event: a cached state
			// that is behind the history does not know it yet.
			if err := d.checkFresh(ctx, x); err != nil {
				return err
			}
			return permanentError{fmt.Errorf("result for unknown step %q", ref.StepID)}
		}
		ended := x.state.Status.Terminal()
		if err := d.applyResult(ctx, x, ref, ev); err != nil {
			return err
		}
		if err := d.advance(ctx, x); err != nil {
			return err
		}
		noteReport(ctx, x, ref, ev, ended)
		return nil
	})
}

// publishStart hands the start of a continue-as-new step's successor to
// the dispatchers: into the inbox, on the successor's partition, with the
// step's id for it as message id (and CloudEvent id), so that publishing
// it again after a crash starts nothing new. It is the dispatcher's own
// command: it carries no actor (the successor records the chain, its run
// and its predecessor).
func (d *Dispatcher) publishStart(ctx context.Context, x *execState, e interp.PublishStart) error {
	start := e.Start
	if err := d.publishOwn(ctx, e.ID, start.ExecutionID, start.Workflow, &start); err != nil {
		return fmt.Errorf("execution %s: publish the start of its successor %s: %w", x.id, start.ExecutionID, err)
	}
	return nil
}

// publishOwn publishes a command of the dispatcher's own (p) into the
// inbox, on the partition its routing key gives, with id as its CloudEvent
// id and message id: publishing it again stores nothing new.
func (d *Dispatcher) publishOwn(ctx context.Context, id, subject, wf string, p events.Payload) error {
	ev := events.New(d.cfg.Source, subject, wf, d.cfg.Now(), p)
	ev.ID = id
	msg, err := bus.Encode(inboxSubjectOf(ev, d.parts.n), ev)
	if err != nil {
		return err
	}
	_, err = d.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id))
	return err
}

// checkStartCommand checks the start command ev (cmd its data) against
// the registered definition it names, as startcheck.Check does: a
// *startcheck.Problem when it may not start.
func (d *Dispatcher) checkStartCommand(ctx context.Context, ev events.Event, cmd *events.StartExecution) (startcheck.Start, error) {
	def, err := d.defs.StartDefinition(ctx, cmd.Workflow, cmd.Version)
	if err != nil && !errors.Is(err, catalog.ErrNotFound) {
		return startcheck.Start{}, err
	}
	return startcheck.Check(ev, def, startcheck.Options{MaxPayload: d.js.Conn().MaxPayload(), Now: d.cfg.Now()})
}

// checkStart checks a start as the start handler will (startcheck.Check,
// against the registered definition it names): "" if it passes, else
// why not.
func (d *Dispatcher) checkStart(ctx context.Context, n interp.NeedStartCheck) (string, error) {
	start := n.Start
	ev := events.New(d.cfg.Source, start.ExecutionID, start.Workflow, d.cfg.Now(), &start)
	ev.ID = n.ID
	_, err := d.checkStartCommand(ctx, ev, &start)
	var p *startcheck.Problem
	if errors.As(err, &p) {
		return p.Message, nil
	}
	return "", err
}
