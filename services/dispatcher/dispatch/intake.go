package dispatch

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/startcheck"
)

// commandTypes is the one command type each command subject carries.
var commandTypes = map[string]events.Type{
	bus.SubjectStart:        events.TypeStartExecution,
	bus.SubjectSignal:       events.TypeSignalExecution,
	bus.SubjectAction:       events.TypeExecutionAction,
	bus.SubjectReconcile:    events.TypeReconcileExecution,
	bus.SubjectExpire:       events.TypeExpireExecution,
	bus.SubjectClearLock:    events.TypeClearLock,
	bus.SubjectAPIStart:     events.TypeStartExecution,
	bus.SubjectAPISignal:    events.TypeSignalExecution,
	bus.SubjectAPIAction:    events.TypeExecutionAction,
	bus.SubjectAPIClearLock: events.TypeClearLock,
}

// subjectRoles names the role NATS lets publish on each command subject
// outside the api's (besides the admin): a command published there is
// attributed to that role, since JetStream stores no publisher's identity.
var subjectRoles = map[string]string{
	bus.SubjectStart:     "client",
	bus.SubjectSignal:    "client",
	bus.SubjectAction:    "client",
	bus.SubjectClearLock: "janitor",
}

// commandActor decides who a command that arrived on subject is recorded
// as asked by, or why it may not be handled (why != ""). Only the api may
// publish on jf.commands.api.<kind>, so a command there must carry the
// actor the api authenticated; a command on any other subject may not
// carry one (anyone with the client identity could write any name), and
// is attributed to the role that may publish there: {nats, client} for
// start, signal and action, {nats, janitor} for clear-lock. Commands that
// cannot carry an actor (reconcile, expire) get none.
func commandActor(subject string, p events.Payload) (actor *events.Actor, why string) {
	carried := events.CommandActor(p)
	if strings.HasPrefix(subject, bus.APICommandsPrefix+".") {
		if carried == nil {
			return nil, fmt.Sprintf("a command on %s carries the actor the api authenticated, and this one has none", subject)
		}
		if err := carried.Check(); err != nil {
			return nil, err.Error()
		}
		return carried, ""
	}
	if carried != nil {
		return nil, fmt.Sprintf("actor is set by the api: a command on %s may not carry one (send it without actor; it is recorded as from the %s role)",
			subject, cmp.Or(subjectRoles[subject], "publishing"))
	}
	role, ok := subjectRoles[subject]
	if !ok {
		return nil, ""
	}
	return &events.Actor{Subject: role, Method: events.ActorNATS}, ""
}

// misrouted says why a decoded message may not be handled where it
// arrived ("" when it may): a command's type must be the one its subject
// carries, and a result or timer must be about the execution its subject
// names, on that execution's partition. Without the check a start
// published on jf.commands.signal would start an execution, and a result
// on one execution's subject could change another's.
func misrouted(subject string, ev events.Event, partitions int) string {
	tokens := strings.Split(subject, ".")
	switch {
	case strings.HasPrefix(subject, bus.CommandsPrefix+"."):
		want, ok := commandTypes[subject]
		if !ok {
			return fmt.Sprintf("%s is not a command subject; publish commands on %s", subject, commandSubjects())
		}
		if ev.Type != want {
			return fmt.Sprintf("a %s command on %s: that subject takes %s only (publish it on %s)",
				ev.Type, subject, want, subjectOf(ev.Type))
		}
	case strings.HasPrefix(subject, bus.InboxPrefix+"."):
		if !isCommand(ev.Type) {
			return fmt.Sprintf("%s on %s: the inbox takes commands only", ev.Type, subject)
		}
		if want := inboxSubjectOf(ev, partitions); subject != want {
			return fmt.Sprintf("a %s command on %s: it belongs on %s", ev.Type, subject, want)
		}
	case strings.HasPrefix(subject, bus.ResultsPrefix+"."):
		ref, ok := events.ResultRef(ev.Data)
		if !ok {
			return fmt.Sprintf("%s on %s: results subjects take operation reports only", ev.Type, subject)
		}
		want := bus.ResultSubject(ref.Queue, ref.ExecutionID) // stored before partitions
		if len(tokens) == 5 {
			want = bus.StoredResultSubject(ref.Queue, partition.Of(ref.ExecutionID, partitions), ref.ExecutionID)
		}
		if subject != want || !events.ValidQueueName(ref.Queue) {
			return fmt.Sprintf("a report about execution %q from queue %q on %s: it belongs on %s", ref.ExecutionID, ref.Queue, subject, want)
		}
	case strings.HasPrefix(subject, bus.DirectPrefix+"."):
		ref, ok := events.ResultRef(ev.Data)
		if !ok {
			return fmt.Sprintf("%s on %s: direct report subjects take operation reports only", ev.Type, subject)
		}
		want := bus.DirectResultSubject(ref.Queue, partition.Of(ref.ExecutionID, partitions), ref.ExecutionID)
		if subject != want || !events.ValidQueueName(ref.Queue) {
			return fmt.Sprintf("a report about execution %q from queue %q on %s: it belongs on %s", ref.ExecutionID, ref.Queue, subject, want)
		}
	case strings.HasPrefix(subject, bus.NoticesPrefix+"."):
		p, ok := ev.Data.(*events.TimerNotice) // docs/adr/0019
		if !ok {
			return fmt.Sprintf("%s on %s: notices subjects take %s only", ev.Type, subject, events.TypeTimerNotice)
		}
		if want := bus.PartitionNoticeSubject(partition.Of(p.ExecutionID, partitions), p.ExecutionID); subject != want {
			return fmt.Sprintf("a timer notice of execution %q on %s: it belongs on %s", p.ExecutionID, subject, want)
		}
	case strings.HasPrefix(subject, bus.TimersPrefix+"."):
		var exec string
		switch p := ev.Data.(type) {
		case *events.FireTimer:
			exec = p.ExecutionID
		case *events.TimerNotice:
			// Set on the timers' subject by development builds before
			// notices had subjects of their own (docs/adr/0019).
			exec = p.ExecutionID
		default:
			return fmt.Sprintf("%s on %s: timer subjects take %s only", ev.Type, subject, events.TypeFireTimer)
		}
		want := bus.TimerSubject(exec) // fired before partitions
		if len(tokens) == 4 {
			want = bus.PartitionTimerSubject(partition.Of(exec, partitions), exec)
		}
		if subject != want {
			return fmt.Sprintf("a timer of execution %q on %s: it belongs on %s", exec, subject, want)
		}
	}
	return ""
}

// subjectOf is the command subject a client publishes command type t on.
func subjectOf(t events.Type) string {
	for _, s := range []string{bus.SubjectStart, bus.SubjectSignal, bus.SubjectAction,
		bus.SubjectReconcile, bus.SubjectExpire, bus.SubjectClearLock} {
		if commandTypes[s] == t {
			return s
		}
	}
	return "no command subject: it is not a command"
}

// isCommand reports whether t is a command's type.
func isCommand(t events.Type) bool {
	for _, want := range commandTypes {
		if want == t {
			return true
		}
	}
	return false
}

func commandSubjects() string {
	return strings.Join([]string{bus.SubjectStart, bus.SubjectSignal, bus.SubjectAction, bus.SubjectClearLock}, ", ")
}

// rejectedError is what a handler returns once it published the
// rejection of a command (and logged it): the message is terminated
// without another log line.
type rejectedError struct{ reason string }

func (e rejectedError) Error() string { return "rejected: " + e.reason }

// rejectMessage rejects a message that cannot be handled as it is (it is
// no CloudEvent, or it arrived on the wrong subject), so that whoever
// published it learns why. The rejection is keyed by the CloudEvent's
// source and id when it has them; otherwise by the subject and the
// message's stream sequence (see docs/subjects.md). Only a message on a
// commands subject is answered: results and timers come from jetflow's
// own services, and a bad one is only logged. It returns an error only if
// the rejection could not be published (the caller retries then).
func (d *Dispatcher) rejectMessage(ctx context.Context, m jetstream.Msg, ev events.Event, reason, field string) error {
	var seq uint64
	if md, err := m.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	cmd, subject, answer := unhandled(m.Subject(), m.Headers(), m.Data(), ev, seq)
	log := d.log.With().Str("subject", subject).Logger()
	if !answer {
		log.Warn().Str("reason", reason).Msg("drop a message that cannot be handled")
		return nil
	}
	err := d.publishRejected(log.WithContext(ctx), cmd, &events.CommandRejected{Code: events.CodeInvalid, Reason: reason,
		Field: field, Subject: subject, StreamSeq: seq})
	var rej rejectedError
	if errors.As(err, &rej) {
		return nil
	}
	return err
}

// maxRejectedName bounds the source, id and type a rejection repeats
// from the message it answers.
const maxRejectedName = 1024

// unhandled is what rejectMessage answers, without I/O: the command a
// message that arrived on subject with header and data at stream sequence
// seq is taken for (ev is what decoding it gave, if anything), the subject
// it was published on, and whether it is answered (a command) or only
// dropped. The command is named by its CloudEvent source and id: from
// the headers in binary mode; in structured mode from the decoded event,
// or the members of one that could not be decoded; so that its sender,
// who listens on the rejection subject of that key, hears of it.
func unhandled(subject string, h nats.Header, data []byte, ev events.Event, seq uint64) (cmd events.Event, published string, answer bool) {
	if p := h.Get(CommandSubjectHeader); p != "" && strings.HasPrefix(subject, bus.InboxPrefix+".") {
		subject = p // a command routed by an intake: answer it as published
	}
	if !strings.HasPrefix(subject, bus.CommandsPrefix+".") {
		return events.Event{}, subject, false
	}
	get := func(k string) string { // header keys in any case, as Decode accepts them
		for key, v := range h {
			if strings.EqualFold(key, k) && len(v) > 0 {
				return strings.TrimSpace(v[0])
			}
		}
		return ""
	}
	cmd = events.Event{Type: cmp.Or(ev.Type, events.Type(get("ce-type")))}
	if get("ce-specversion") != "" {
		// Binary mode (as the sdk reads it): the headers name the command;
		// the data is its payload.
		cmd.ID, cmd.Source = cmp.Or(get("ce-id"), h.Get(jetstream.MsgIDHeader)), get("ce-source")
	} else {
		// Structured, or no CloudEvent: the event as decoded, else the
		// members of one that could not be, else any ce- headers.
		var body struct {
			ID, Source, Type any
		}
		_ = json.Unmarshal(data, &body)
		str := func(v any) string {
			s, _ := v.(string)
			return strings.TrimSpace(s)
		}
		switch {
		case ev.ID != "" && ev.Source != "":
			cmd.ID, cmd.Source = ev.ID, ev.Source
		case str(body.ID) != "" && str(body.Source) != "":
			cmd.ID, cmd.Source = str(body.ID), str(body.Source)
			cmd.Type = cmp.Or(cmd.Type, events.Type(str(body.Type)))
		default:
			cmd.ID, cmd.Source = cmp.Or(get("ce-id"), h.Get(jetstream.MsgIDHeader)), get("ce-source")
		}
	}
	if len(cmd.ID)+len(cmd.Source)+len(cmd.Type) > maxRejectedName {
		cmd = events.Event{} // named by where it is stored: a rejection that names it would not fit
	}
	if cmd.ID == "" || cmd.Source == "" {
		// Nothing names the command: name it by where it is stored.
		cmd.Source, cmd.ID = subject, "seq-"+strconv.FormatUint(seq, 10)
	}
	return cmd, subject, true
}

// intake decodes a message and checks that it may be handled where it
// arrived; one that may not is rejected (a command) or dropped, and ok is
// false.
func (d *Dispatcher) intake(ctx context.Context, m jetstream.Msg) (ev events.Event, ok bool) {
	ev, why, field := admit(m.Subject(), m.Headers(), m.Data(), d.parts.n)
	if why == "" {
		return ev, true
	}
	if perr := d.rejectMessage(ctx, m, ev, why, field); perr != nil {
		d.log.Warn().Err(perr).Dur("retry_in", retryLater(m)).Msg("publish rejection, will retry")
		return ev, false
	}
	_ = m.Term()
	return ev, false
}

// admit is intake's decision, without I/O: it decodes a message that
// arrived on subject (with header and data) and says why it may not be
// handled there ("" if it may), with the dispatchers' number of
// partitions, and the attribute or member at fault of a CloudEvent
// refused as it was decoded (field, as the api's answer names it). A
// command's actor is set from the subject it was published on (see
// commandActor).
func admit(subject string, header nats.Header, data []byte, partitions int) (ev events.Event, why, field string) {
	ev, err := bus.Decode(header, data)
	why = misrouted(subject, ev, partitions)
	// The subject a command was published on decides who it is from: its
	// own, or for one the intake put in the inbox, the one it arrived on.
	published := ""
	switch {
	case strings.HasPrefix(subject, bus.CommandsPrefix+"."):
		published = subject
	case strings.HasPrefix(subject, bus.InboxPrefix+"."):
		published = header.Get(CommandSubjectHeader) // "": the dispatcher's own (a lock wake)
		if why == "" && err == nil && published != "" {
			why = misrouted(published, ev, partitions)
		}
	}
	if s, ok := ev.Data.(*events.StartExecution); ok && why == "" && err == nil && published != "" &&
		(s.Chain != "" || s.Run != 0 || s.ContinuedFrom != "") {
		why = "chain, run and continued_from are set by the dispatcher only, for the execution a continue-as-new step starts: send the start without them"
	}
	if s, ok := ev.Data.(*events.StartExecution); ok && why == "" && err == nil && published != "" && s.Parent != nil {
		why = "parent is set by the dispatcher only, for the child execution a workflow step with child: true starts: send the start without it"
	}
	if why == "" && err == nil && published != "" {
		var actor *events.Actor
		if actor, why = commandActor(published, ev.Data); why == "" && actor != nil {
			events.SetCommandActor(ev.Data, actor)
		}
	}
	if err != nil {
		why = strings.TrimPrefix(err.Error(), events.ErrMalformed.Error()+": ")
		if errors.Is(err, events.ErrUnknownType) {
			why = fmt.Sprintf("type %q is not a jetflow command", ev.Type)
		}
		var fe *events.FieldError
		if errors.As(err, &fe) {
			field = fe.FieldName()
		}
	}
	return ev, why, field
}

// routeCommand is the intake of commands: any dispatcher checks a
// command (rejecting one that cannot be handled) and puts it on its
// execution's partition, whose holder handles it. A command for a
// partition this dispatcher holds is handled here at once (the common
// case with one dispatcher): the inbox would only bring it back.
func (d *Dispatcher) routeCommand(ctx context.Context, m jetstream.Msg, queue func(job)) {
	ev, ok := d.intake(ctx, m)
	if !ok {
		return
	}
	key := routingKey(ev)
	if from := d.holding(d.partitionOf(key)); from != nil {
		_ = m.InProgress() // the intake's ack wait is short: it may wait in the worker's queue
		queue(job{msg: m, ev: ev, key: key, from: from, intake: true})
		return
	}
	if err := d.route(ctx, m, ev); err != nil {
		level := zerolog.WarnLevel
		if ctx.Err() != nil {
			// Stopping: the command stays in its stream, unacknowledged,
			// for the next intake (this dispatcher's after a restart, or
			// another's).
			level = zerolog.DebugLevel
		}
		d.log.WithLevel(level).Err(err).Dur("retry_in", retryLater(m)).Msg("route command, will retry")
		return
	}
	_ = m.Ack()
}

func routingKey(ev events.Event) string {
	switch p := ev.Data.(type) {
	case *events.StartExecution:
		_, id := startcheck.Identify(ev)
		return id
	case *events.ReconcileExecution:
		return p.ExecutionID
	case *events.FireTimer:
		return p.ExecutionID
	case *events.TimerNotice:
		return p.ExecutionID
	case *events.SignalExecution:
		return p.ExecutionID
	case *events.ExecutionAction:
		return p.ExecutionID
	case *events.ExpireExecution:
		return p.ExecutionID
	}
	if ref, ok := events.ResultRef(ev.Data); ok {
		return ref.ExecutionID
	}
	return ev.ID
}
