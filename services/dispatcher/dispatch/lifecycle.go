package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/interp"
)

// start applies a start command: it claims the execution id forever (a KV
// create, so two commands can never both own it), appends
// ExecutionStarted with the pinned definition, and schedules the first
// step. A re-delivered or re-published command finds its own claim and
// only makes sure the execution progresses.
func (d *Dispatcher) start(ctx context.Context, ev events.Event, cmd *events.StartExecution) error {
	key := events.CommandKey(ev.Source, ev.ID)
	id := cmd.ExecutionID
	if id == "" {
		id = events.DerivedExecutionID(key)
	}
	reject := func(code, format string, args ...any) error {
		return d.reject(ctx, ev, id, code, fmt.Sprintf(format, args...))
	}
	if err := events.StrictData(ev); err != nil {
		field, msg := events.ExplainJSON(err)
		if field != "" && !strings.Contains(msg, field) {
			msg = field + " " + msg
		}
		return reject(events.CodeInvalid, "data: %s", msg)
	}
	asked := *cmd
	asked.ExecutionID = id
	if field, msg := asked.Check(); field != "" {
		return reject(events.CodeInvalid, "%s %s", field, msg)
	}
	digest := asked.Digest()
	input := cmd.Input
	if len(input) == 0 || string(input) == "null" {
		input = json.RawMessage(`{}`)
	}

	// Resolve the definition and build the first event before claiming the
	// id, so that a command that cannot start leaves the id free.
	rec, err := d.defs.Get(ctx, cmd.Workflow, cmd.Version)
	if errors.Is(err, catalog.ErrNotFound) {
		if cmd.Version > 0 {
			return reject(events.CodeNotFound, "workflow %q has no version %d", cmd.Workflow, cmd.Version)
		}
		return reject(events.CodeNotFound, "workflow %q is not registered", cmd.Workflow)
	}
	if err != nil {
		return err
	}
	if problems := rec.Definition.CheckInput(input); len(problems) > 0 {
		msgs := make([]string, len(problems))
		for i, p := range problems {
			msgs[i] = p.Field + ": " + p.Message
		}
		return reject(events.CodeInvalid, "input does not match the workflow's input schema: %s", strings.Join(msgs, "; "))
	}
	def, err := rec.Definition.Canonical()
	if err != nil {
		return permanentError{err}
	}
	started := &events.ExecutionStarted{
		Workflow: rec.Name, Version: rec.Version, Input: input, Steps: rec.Definition.StepRefs(),
		Definition: def, Token: newToken(), CommandKey: key, CommandDigest: digest, StartedBy: ev.Source, Actor: cmd.Actor, APIURL: d.cfg.APIURL,
		WaitAfterFail: cmd.WaitAfterFail, DryRun: cmd.DryRun,
	}
	if cmd.Actor != nil {
		started.StartedBy = cmd.Actor.Subject // who, as authenticated; the command key keeps the source
	}
	if started.Retention, err = interp.StartRetention(rec.Definition, projections.Execution{ID: id, Workflow: rec.Name,
		Version: rec.Version, Input: input, StartedAt: d.cfg.Now()}); err != nil {
		return reject(events.CodeInvalid, "%s", err)
	}
	if size, limit := d.encodedSize(id, cmd.Workflow, started), d.js.Conn().MaxPayload(); size > limit {
		return reject(events.CodeInvalid, "input and definition take %d bytes, more than the %d a message may hold; make the input smaller", size, limit)
	}
	c, err := d.ids.Create(ctx, id, claim.Claim{CommandKey: key, Digest: digest, Workflow: cmd.Workflow, ClaimedAt: d.cfg.Now().UTC()})
	if err != nil {
		return err
	}
	if why := c.Conflict(id, key, digest); why != "" {
		return reject(events.CodeConflict, "%s", why)
	}
	if c.Expired() { // this command ran, and its execution has since expired: never run it again
		return reject(events.CodeConflict, "execution %q expired under its retention rule at %s and its history was deleted; execution ids are unique forever: start a new execution with a new id",
			id, c.ExpiredAt.UTC().Format(time.RFC3339))
	}
	return d.withExecution(ctx, cmd.Workflow, id, func(x *execState) error {
		if x.state.Status == projections.StatusNone {
			x.def = rec.Definition
			if err := d.append(ctx, x, started); err != nil {
				return err
			}

			zerolog.Ctx(ctx).Info().Str("workflow", rec.Name).Int("version", rec.Version).Msg("execution started")
		}
		return d.advance(ctx, x)
	})
}

// encodedSize is the size of p as a history message (data and headers).
func (d *Dispatcher) encodedSize(id, wf string, p events.Payload) int64 {
	msg, err := bus.Encode(bus.ExecutionSubject(wf, id), events.New(d.cfg.Source, id, wf, d.cfg.Now(), p))
	if err != nil {
		return 0
	}
	n := int64(len(msg.Data) + len(msg.Subject))
	for k, vs := range msg.Header {
		for _, v := range vs {
			n += int64(len(k) + len(v) + 4)
		}
	}
	return n + 256 // Nats-Msg-Id, expected-sequence headers and framing
}

// reject publishes why a command changes nothing and terminates it.
func (d *Dispatcher) reject(ctx context.Context, cmd events.Event, execID, code, reason string) error {
	return d.publishRejection(ctx, cmd, execID, code, reason, "", 0)
}

// publishRejection publishes the rejection of cmd, which arrived on
// subject at stream sequence seq (if known), and returns the
// rejectedError that terminates the message.
func (d *Dispatcher) publishRejection(ctx context.Context, cmd events.Event, execID, code, reason, subject string, seq uint64) error {
	key := events.CommandKey(cmd.Source, cmd.ID)
	rej := events.New(d.cfg.Source, execID, "", d.cfg.Now(), &events.CommandRejected{
		CommandKey: key, CommandType: cmd.Type, ExecutionID: execID, Code: code, Reason: reason, Subject: subject, StreamSeq: seq})
	msg, err := bus.Encode(bus.RejectionSubject(key), rej)
	if err != nil {
		return err
	}
	if _, err := d.js.PublishMsg(ctx, msg, jetstream.WithMsgID("rej-"+bus.RejectionSubject(key))); err != nil {
		return fmt.Errorf("publish rejection: %w", err)
	}
	zerolog.Ctx(ctx).Warn().Str("code", code).Str("reason", reason).Str("command", key).Msg("command rejected")
	return rejectedError{reason: reason}
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
		if err := d.applyResult(ctx, x, ref, ev); err != nil {
			return err
		}
		return d.advance(ctx, x)
	})
}
