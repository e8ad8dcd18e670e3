package projections_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
)

// history is one replay case in testdata/*.json.
type history struct {
	Name        string        `json:"name"`
	Description string        `json:"description"`
	Events      []storedEvent `json:"events"`
	Want        wantState     `json:"want"`
	// WantError is a substring of the error Fold must return.
	WantError string `json:"want_error"`
	// WantErrorIs names the error's kind: TransitionError, ErrUnknownEvent or ErrUnknownStep.
	WantErrorIs string `json:"want_error_is"`
	// NotFuzzable says why the history cannot be written in FuzzFold's
	// bytes (they know only some event types, four steps and no nested
	// instances); it still seeds the fuzzer.
	NotFuzzable string `json:"not_fuzzable"`
}

// storedEvent is an events.Event as stored, with its data still JSON.
type storedEvent struct {
	ID        string          `json:"id"`
	Type      events.Type     `json:"type"`
	Source    string          `json:"source"`
	Subject   string          `json:"subject"`
	Workflow  string          `json:"workflow"`
	Time      time.Time       `json:"time"`
	Ignorable bool            `json:"ignorable"`
	Seq       uint64          `json:"seq"`
	Data      json.RawMessage `json:"data"`
}

// wantState is the subset of the final state a history checks: status,
// error, expired and dry_run always; the others when given.
type wantState struct {
	Status      projections.Status `json:"status"`
	Error       string             `json:"error"`
	Events      *int               `json:"events"`
	LastSeq     *uint64            `json:"last_seq"`
	LastEventID string             `json:"last_event_id"`
	Token       string             `json:"token"`
	Output      json.RawMessage    `json:"output"`
	Expired     bool               `json:"expired"`
	DryRun      bool               `json:"dry_run"`
	Resumes     *int               `json:"resumes"`
	// StepCount is the number of step instances, nested ones included.
	StepCount    *int                        `json:"step_count"`
	Steps        []wantStep                  `json:"steps"`
	Vars         map[string]json.RawMessage  `json:"vars"`
	Timers       map[string]bool             `json:"timers"` // timer id: fired
	Signals      []wantSignal                `json:"signals"`
	Replays      []wantReplay                `json:"replays"`
	Cancellation *projections.Cancellation   `json:"cancellation"`
	Actions      []projections.ActionCommand `json:"actions"`
	Ignored      []string                    `json:"ignored"`
}

type wantStep struct {
	ID      string               `json:"id"`
	Kind    string               `json:"kind"`
	Status  projections.OpStatus `json:"status"`
	Attempt int                  `json:"attempt"`
	Error   string               `json:"error"`
	Agent   string               `json:"agent"`
	TaskID  string               `json:"task_id"`
	Token   string               `json:"token"`
	Input   json.RawMessage      `json:"input"`
	Output  json.RawMessage      `json:"output"`
	// Optional: checked when given.
	RetryBase *int  `json:"retry_base"`
	Entered   *int  `json:"entered"`
	Final     *bool `json:"final"`
	Lost      *bool `json:"lost"`
	// StartedAt and Delivery: when and in which delivery the step's
	// operation started, as the fold has it.
	StartedAt *time.Time `json:"started_at"`
	Delivery  *int       `json:"delivery"`
}

type wantSignal struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	TakenBy string `json:"taken_by"`
}

type wantReplay struct {
	From        string `json:"from"`
	Point       string `json:"point"`
	Mode        string `json:"mode"`
	Cause       string `json:"cause"`
	Automatic   bool   `json:"automatic"`
	RequestedBy string `json:"requested_by"`
}

func loadHistories(t testing.TB) []history {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "*.json"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), 6)
	var hs []history
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		var h history
		require.NoError(t, dec.Decode(&h), f)
		require.Regexp(t, regexp.MustCompile(`^[A-Z][A-Za-z0-9]+$`), h.Name, "%s: name must be CamelCase", f)
		require.NotEmpty(t, h.Events, f)
		hs = append(hs, h)
	}
	return hs
}

// decodeStructured reads a structured-mode CloudEvent as the NATS codec
// (bus.Decode, given no headers) reads it: sdk-go's JSON form of the event,
// then [events.FromCloudEvent]. It keeps this package's tests free of NATS,
// as the package itself is.
func decodeStructured(b []byte) (events.Event, error) {
	var ce event.Event
	if err := json.Unmarshal(b, &ce); err != nil {
		return events.Event{}, err
	}
	return events.FromCloudEvent(ce)
}

// toEvents decodes stored events into events with typed payloads, the way
// history.Read does, through sdk-go and [events.FromCloudEvent].
func toEvents(t testing.TB, stored []storedEvent) []events.Event {
	t.Helper()
	out := make([]events.Event, 0, len(stored))
	for _, s := range stored {
		b, err := events.EncodeStructured(events.Event{ID: s.ID, Type: s.Type, Source: s.Source, Subject: s.Subject,
			Workflow: s.Workflow, Time: s.Time, Ignorable: s.Ignorable, Raw: s.Data})
		require.NoError(t, err, s.ID)
		ev, err := decodeStructured(b)
		if errors.Is(err, events.ErrUnknownType) {
			require.Nil(t, ev.Data)
		} else {
			require.NoError(t, err, s.ID)
			require.Equal(t, s.Type, ev.Data.EventType())
		}
		require.Equal(t, s.ID, ev.ID)
		require.Equal(t, s.Type, ev.Type)
		require.Equal(t, s.Ignorable, ev.Ignorable)
		ev.Seq = s.Seq
		out = append(out, ev)
	}
	return out
}

func TestReplay(t *testing.T) {
	t.Parallel()

	seen := map[string]bool{}
	for _, h := range loadHistories(t) {
		require.False(t, seen[h.Name], "two histories named %s", h.Name)
		seen[h.Name] = true
		t.Run(h.Name, func(t *testing.T) {
			t.Parallel()

			evs := toEvents(t, h.Events)
			got, err := projections.Fold(evs)
			if h.WantError == "" {
				require.NoError(t, err)
				require.Equal(t, len(evs), got.Events)
			} else {
				require.Error(t, err)
				require.Contains(t, err.Error(), h.WantError)
				switch h.WantErrorIs {
				case "TransitionError":
					var te *projections.TransitionError
					require.ErrorAs(t, err, &te)
				case "ErrUnknownEvent":
					require.ErrorIs(t, err, projections.ErrUnknownEvent)
				case "ErrUnknownStep":
					require.ErrorIs(t, err, projections.ErrUnknownStep)
				case "ErrDuplicateStep":
					require.ErrorIs(t, err, projections.ErrDuplicateStep)
				default:
					t.Fatalf("want_error_is %q is not TransitionError, ErrUnknownEvent, ErrUnknownStep or ErrDuplicateStep", h.WantErrorIs)
				}
			}

			requireState(t, h.Want, got)
			if got.Status != projections.StatusNone {
				first := evs[0]
				require.Equal(t, first.Subject, got.ID)
				require.True(t, first.Time.Equal(got.StartedAt))
				require.False(t, got.UpdatedAt.Before(got.StartedAt))
			}
			if got.Status.Terminal() {
				require.False(t, got.EndedAt.IsZero())
			}
		})
	}
}

// requireState checks the state a history folds to against its want.
func requireState(t *testing.T, w wantState, got projections.Execution) {
	t.Helper()
	require.Equal(t, w.Status, got.Status)
	require.Equal(t, w.Error, got.Error)
	require.Equal(t, w.Expired, !got.ExpiredAt.IsZero(), "expired")
	require.Equal(t, w.DryRun, got.DryRun, "dry run")
	if w.Events != nil {
		require.Equal(t, *w.Events, got.Events)
	}
	if w.LastSeq != nil {
		require.Equal(t, *w.LastSeq, got.LastSeq)
	}
	if w.LastEventID != "" {
		require.Equal(t, w.LastEventID, got.LastEventID)
	}
	if w.Token != "" {
		require.Equal(t, w.Token, got.Token)
	}
	if w.Output != nil {
		require.JSONEq(t, string(w.Output), string(got.Output))
	}
	if w.Resumes != nil {
		require.Equal(t, *w.Resumes, got.Resumes, "resumes")
	}
	if w.StepCount != nil {
		require.Len(t, got.Steps, *w.StepCount)
	}
	for _, ws := range w.Steps {
		i := got.StepIndex(ws.ID)
		require.GreaterOrEqual(t, i, 0, "no step %s", ws.ID)
		st := got.Steps[i]
		require.Equal(t, ws.Status, st.Status, "status of step %s", ws.ID)
		require.Equal(t, ws.Attempt, st.Attempt, "attempt of step %s", ws.ID)
		for _, c := range []struct{ name, want, got string }{
			{"kind", ws.Kind, st.Kind}, {"error", ws.Error, st.Error}, {"agent", ws.Agent, st.Agent},
			{"task id", ws.TaskID, st.TaskID}, {"token", ws.Token, st.Token},
		} {
			if c.want != "" {
				require.Equal(t, c.want, c.got, "%s of step %s", c.name, ws.ID)
			}
		}
		if ws.Input != nil {
			require.JSONEq(t, string(ws.Input), string(st.Input), "input of step %s", ws.ID)
		}
		if ws.Output != nil {
			require.JSONEq(t, string(ws.Output), string(st.Output), "output of step %s", ws.ID)
		}
		if ws.RetryBase != nil {
			require.Equal(t, *ws.RetryBase, st.RetryBase, "retry base of step %s", ws.ID)
		}
		if ws.Entered != nil {
			require.Equal(t, *ws.Entered, st.Entered, "entered of step %s", ws.ID)
		}
		if ws.Final != nil {
			require.Equal(t, *ws.Final, st.Final, "final of step %s", ws.ID)
		}
		if ws.Lost != nil {
			require.Equal(t, *ws.Lost, st.Lost, "lost of step %s", ws.ID)
		}
		if ws.StartedAt != nil {
			require.True(t, ws.StartedAt.Equal(st.StartedAt), "started at of step %s: %s, want %s", ws.ID, st.StartedAt, ws.StartedAt)
		}
		if ws.Delivery != nil {
			require.Equal(t, *ws.Delivery, st.Delivery, "delivery of step %s", ws.ID)
		}
	}
	if w.Vars != nil {
		require.Len(t, got.Vars, len(w.Vars), "vars %v", got.Vars)
		for k, v := range w.Vars {
			require.Contains(t, got.Vars, k)
			require.JSONEq(t, string(v), string(got.Vars[k]), "var %s", k)
		}
	}
	if w.Timers != nil {
		fired := map[string]bool{}
		for id, tm := range got.Timers {
			fired[id] = tm.Fired
		}
		require.Equal(t, w.Timers, fired, "timers")
	}
	if w.Signals != nil {
		var signals []wantSignal
		for _, g := range got.Signals {
			signals = append(signals, wantSignal{ID: g.ID, Name: g.Name, TakenBy: g.TakenBy})
		}
		require.Len(t, signals, len(w.Signals), "signals %v", signals)
		if len(w.Signals) > 0 {
			require.Equal(t, w.Signals, signals, "signals")
		}
	}
	if w.Replays != nil {
		var replays []wantReplay
		for _, r := range got.Replays {
			replays = append(replays, wantReplay{From: r.From, Point: r.Point, Mode: r.Mode, Cause: r.Cause,
				Automatic: r.Automatic, RequestedBy: r.RequestedBy})
		}
		require.Len(t, replays, len(w.Replays), "replays %v", replays)
		if len(w.Replays) > 0 {
			require.Equal(t, w.Replays, replays, "replays")
		}
	}
	if w.Cancellation != nil {
		require.NotNil(t, got.Cancellation)
		require.Equal(t, w.Cancellation.Action, got.Cancellation.Action)
		require.Equal(t, w.Cancellation.Reason, got.Cancellation.Reason)
		require.Equal(t, w.Cancellation.RequestedBy, got.Cancellation.RequestedBy)
		require.True(t, w.Cancellation.RequestedAt.Equal(got.Cancellation.RequestedAt),
			"requested at %s, want %s", got.Cancellation.RequestedAt, w.Cancellation.RequestedAt)
	}
	if w.Actions != nil {
		require.Equal(t, len(w.Actions), len(got.Actions), "actions %v", got.Actions)
		if len(w.Actions) > 0 {
			require.Equal(t, w.Actions, got.Actions)
		}
	}
	if w.Ignored != nil {
		require.Len(t, got.Ignored, len(w.Ignored), "ignored %v", got.Ignored)
		if len(w.Ignored) > 0 {
			require.Equal(t, w.Ignored, got.Ignored)
		}
	}
}

func TestFoldDeterministic(t *testing.T) {
	t.Parallel()

	for _, h := range loadHistories(t) {
		t.Run(h.Name, func(t *testing.T) {
			t.Parallel()

			a, errA := projections.Fold(toEvents(t, h.Events))
			b, errB := projections.Fold(toEvents(t, h.Events))
			require.True(t, reflect.DeepEqual(a, b), "two folds of the same events differ:\n%+v\n%+v", a, b)
			require.Equal(t, errA, errB)

			// Applying one event at a time gives the same state as Fold.
			var s projections.Execution
			var err error
			for _, ev := range toEvents(t, h.Events) {
				if s, err = projections.Apply(s, ev); err != nil {
					break
				}
			}
			require.True(t, reflect.DeepEqual(a, s), "Fold and Apply differ:\n%+v\n%+v", a, s)
		})
	}
}

func started(steps ...string) events.Event {
	refs := make([]events.StepRef, len(steps))
	for i, id := range steps {
		refs[i] = events.StepRef{ID: id, Kind: "noop"}
	}
	return events.Event{ID: "e0", Type: events.TypeExecutionStarted, Subject: "x1", Seq: 1,
		Time: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		Data: &events.ExecutionStarted{Workflow: "wf", Version: 1, Steps: refs}}
}

func stepEvent(p events.Payload) events.Event {
	return events.Event{ID: "e", Type: p.EventType(), Subject: "x1", Time: time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC), Data: p}
}

func TestApplyDoesNotModifyInput(t *testing.T) {
	t.Parallel()

	s, err := projections.Fold([]events.Event{
		started("a", "b"),
		stepEvent(&events.StepScheduled{StepID: "a", Attempt: 1}),
	})
	require.NoError(t, err)
	before := slices.Clone(s.Steps)
	snapshot := s

	t.Run("Success", func(t *testing.T) {
		t.Parallel()

		next, err := projections.Apply(s, stepEvent(&events.StepSending{StepID: "a", Attempt: 1, TaskID: "t", Queue: "q"}))
		require.NoError(t, err)
		require.Equal(t, projections.OpSending, next.Steps[0].Status)
		require.Equal(t, before, s.Steps)
		require.Equal(t, projections.OpPending, s.Steps[0].Status)
		require.Empty(t, s.Steps[0].TaskID)
		require.Equal(t, snapshot.Events, s.Events)
	})

	t.Run("Error", func(t *testing.T) {
		t.Parallel()

		_, err := projections.Apply(s, stepEvent(&events.StepSent{StepID: "a", Attempt: 1}))
		var te *projections.TransitionError
		require.ErrorAs(t, err, &te)
		require.Equal(t, "a", te.StepID)
		require.Equal(t, string(projections.OpPending), te.From)
		require.Equal(t, before, s.Steps)
	})

	t.Run("Terminal", func(t *testing.T) {
		t.Parallel()

		next, err := projections.Apply(s, stepEvent(&events.ExecutionFailed{Error: "x"}))
		require.NoError(t, err)
		require.Equal(t, projections.StatusFailed, next.Status)
		require.Equal(t, projections.StatusStarted, s.Status)
		require.Equal(t, before, s.Steps)
	})

	t.Run("Concurrent", func(t *testing.T) {
		t.Parallel()

		// The race detector catches a shared Steps array written by two Applies.
		errs := make(chan error, 2)
		for _, p := range []events.Payload{
			&events.StepSending{StepID: "a", Attempt: 1},
			&events.StepScheduled{StepID: "b", Attempt: 1},
		} {
			go func() {
				_, err := projections.Apply(s, stepEvent(p))
				errs <- err
			}()
		}
		require.NoError(t, <-errs)
		require.NoError(t, <-errs)
		require.Equal(t, before, s.Steps)
	})
}

func TestTransitionErrorMessage(t *testing.T) {
	t.Parallel()

	s, err := projections.Fold([]events.Event{started("a")})
	require.NoError(t, err)

	_, err = projections.Apply(s, started("a"))
	var te *projections.TransitionError
	require.ErrorAs(t, err, &te)
	require.Equal(t, "x1", te.ExecutionID)
	require.Equal(t, string(projections.StatusStarted), te.From)
	require.Equal(t, events.TypeExecutionStarted, te.Event)
	require.Empty(t, te.StepID)
	require.Equal(t, `projections: execution x1: io.jetflow.execution.started is illegal in state "started"`, err.Error())
}

func TestStatusPredicates(t *testing.T) {
	t.Parallel()

	for st, terminal := range map[projections.Status]bool{
		projections.StatusNone: false, projections.StatusPending: false, projections.StatusStarted: false,
		projections.StatusSucceeded: true, projections.StatusFailed: true,
		projections.StatusCancelling: false, projections.StatusCancelled: true,
	} {
		require.Equal(t, terminal, st.Terminal(), string(st))
		require.Equal(t, st == projections.StatusStarted || st == projections.StatusCancelling, st.Active(), string(st))
	}
	for st, want := range map[projections.OpStatus][2]bool{ // terminal, in flight
		projections.OpNone: {false, false}, projections.OpPending: {false, false},
		projections.OpSending: {false, true}, projections.OpSent: {false, true}, projections.OpStarted: {false, true},
		projections.OpSucceeded: {true, false}, projections.OpFailed: {true, false},
	} {
		require.Equal(t, want[0], st.Terminal(), string(st))
		require.Equal(t, want[1], st.InFlight(), string(st))
	}
}

// Fuzzing: each event is three bytes, [op, arg, flags].
var (
	fuzzOps = []events.Type{
		events.TypeExecutionStarted, events.TypeExecutionSucceeded, events.TypeExecutionFailed,
		events.TypeStepScheduled, events.TypeStepSending, events.TypeStepSent, events.TypeStepStarted,
		events.TypeStepSucceeded, events.TypeStepFailed,
		events.TypeExecutionCancelling, events.TypeExecutionCancelled, events.TypeExecutionResumed, events.TypeExecutionReplayed,
		"io.jetflow.step.unknown",     // unknown type, nil Data
		events.TypeReconcileExecution, // a command that does not belong in a history
		events.TypeStepDispatched,     // scheduled and sending as one event
	}
	fuzzSteps = []string{"a", "b", "c", "d"}
)

// fuzzEvents turns fuzz bytes into events. For execution.started, arg is
// the number of steps; for step events it indexes fuzzSteps (past the end
// is an unknown step). flags&0x7f is the attempt, flags&0x80 ignorable.
func fuzzEvents(data []byte) []events.Event {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var evs []events.Event
	for i := 0; i+3 <= len(data); i += 3 {
		op, arg, flags := fuzzOps[int(data[i])%len(fuzzOps)], int(data[i+1]), data[i+2]
		attempt, ignorable := int(flags&0x7f), flags&0x80 != 0
		step := "zz"
		if k := arg % (len(fuzzSteps) + 1); k < len(fuzzSteps) {
			step = fuzzSteps[k]
		}
		var p events.Payload
		switch op {
		case events.TypeExecutionStarted:
			refs := []events.StepRef{}
			for _, id := range fuzzSteps[:arg%(len(fuzzSteps)+1)] {
				refs = append(refs, events.StepRef{ID: id, Kind: "noop"})
			}
			p = &events.ExecutionStarted{Workflow: "wf", Version: attempt, Steps: refs, Token: "t"}
		case events.TypeExecutionSucceeded:
			p = &events.ExecutionSucceeded{Output: json.RawMessage(`{}`)}
		case events.TypeExecutionFailed:
			p = &events.ExecutionFailed{Error: "e", StepID: step}
		case events.TypeStepScheduled:
			p = &events.StepScheduled{StepID: step, Attempt: attempt}
		case events.TypeStepSending:
			p = &events.StepSending{StepID: step, Attempt: attempt, TaskID: "t", Queue: "q"}
		case events.TypeStepSent:
			p = &events.StepSent{StepID: step, Attempt: attempt, TaskID: "t", TaskSeq: uint64(i)}
		case events.TypeStepStarted: // the step byte's high part is the delivery
			p = &events.StepStarted{StepID: step, Attempt: attempt, Agent: "ag", Delivery: arg / (len(fuzzSteps) + 1)}
		case events.TypeStepDispatched:
			p = &events.StepDispatched{StepID: step, Attempt: attempt, TaskID: "t", Queue: "q"}
		case events.TypeStepSucceeded: // the step byte's high part is the delivery whose start the result carries (0: none)
			e := &events.StepSucceeded{StepID: step, Attempt: attempt, Output: json.RawMessage(`1`)}
			if d := arg / (len(fuzzSteps) + 1); d > 0 {
				e.OperationStart = events.OperationStart{StartedAt: base.Add(time.Duration(i-d) * time.Second), Delivery: d}
			}
			p = e
		case events.TypeStepFailed:
			p = &events.StepFailed{StepID: step, Attempt: attempt, Error: "boom"}
		case events.TypeExecutionCancelling:
			p = &events.ExecutionCancelling{ActionRecord: events.ActionRecord{Action: events.ActionCancel, Command: "c#" + step}}
		case events.TypeExecutionCancelled:
			p = &events.ExecutionCancelled{ActionRecord: events.ActionRecord{Action: events.ActionForceCancel}}
		case events.TypeExecutionResumed: // past the steps: nothing reset
			var reset []string
			if step != "zz" {
				reset = []string{step}
			}
			p = &events.ExecutionResumed{ActionRecord: events.ActionRecord{Action: events.ActionResume, Command: "c#r"}, Token: "t2", Reset: reset}
		case events.TypeExecutionReplayed: // the step is reset (past the steps: nothing)
			var reset []string
			if step != "zz" {
				reset = []string{step}
			}
			p = &events.ExecutionReplayed{ActionRecord: events.ActionRecord{Action: events.ActionReplay}, Mode: events.ReplayModeReplay, Token: "t3", Reset: reset}
		case events.TypeReconcileExecution:
			p = &events.ReconcileExecution{ExecutionID: "x1", Workflow: "wf"}
		}
		evs = append(evs, events.Event{ID: "e" + string(rune('0'+i%10)), Type: op, Source: "fuzz", Subject: "x1",
			Time: base.Add(time.Duration(i) * time.Second), Seq: uint64(i/3 + 1), Ignorable: ignorable, Data: p})
	}
	return evs
}

// fuzzBytes is the inverse of fuzzEvents for the replay histories, so
// that they seed the fuzzer.
func fuzzBytes(t testing.TB, evs []events.Event) []byte {
	t.Helper()
	var out []byte
	var steps []string
	for _, ev := range evs {
		op := slices.Index(fuzzOps, ev.Type)
		if op < 0 {
			op = slices.Index(fuzzOps, "io.jetflow.step.unknown")
		}
		var arg, attempt int
		stepArg := func(id string) int {
			if i := slices.Index(steps, id); i >= 0 {
				return i
			}
			return len(fuzzSteps)
		}
		switch e := ev.Data.(type) {
		case *events.ExecutionStarted:
			require.LessOrEqual(t, len(e.Steps), len(fuzzSteps))
			steps = nil
			for _, r := range e.Steps {
				steps = append(steps, r.ID)
			}
			arg = len(e.Steps)
		case *events.StepScheduled:
			arg, attempt = stepArg(e.StepID), e.Attempt
		case *events.StepSending:
			arg, attempt = stepArg(e.StepID), e.Attempt
		case *events.StepSent:
			arg, attempt = stepArg(e.StepID), e.Attempt
		case *events.StepStarted:
			arg, attempt = stepArg(e.StepID)+e.Delivery*(len(fuzzSteps)+1), e.Attempt
			require.Less(t, arg, 256)
		case *events.StepDispatched:
			arg, attempt = stepArg(e.StepID), e.Attempt
		case *events.StepSucceeded:
			// The delivery of a start it carries; the start's time is not
			// in the bytes (such histories are not_fuzzable, seeds only).
			arg, attempt = stepArg(e.StepID)+e.Delivery*(len(fuzzSteps)+1), e.Attempt
			require.Less(t, arg, 256)
		case *events.StepFailed:
			arg, attempt = stepArg(e.StepID), e.Attempt
		case *events.ExecutionResumed:
			require.LessOrEqual(t, len(e.Reset), 1)
			arg = len(fuzzSteps)
			if len(e.Reset) == 1 {
				arg = stepArg(e.Reset[0])
			}
		}
		flags := byte(attempt & 0x7f)
		if ev.Ignorable {
			flags |= 0x80
		}
		out = append(out, byte(op), byte(arg), flags)
	}
	return out
}

func TestFuzzBytesRoundTrip(t *testing.T) {
	t.Parallel()

	// The seeds replay to the same outcome as the histories they came from
	// (step ids are renamed, so compare statuses).
	fuzzable := 0
	for _, h := range loadHistories(t) {
		if h.NotFuzzable != "" {
			continue
		}
		fuzzable++
		t.Run(h.Name, func(t *testing.T) {
			t.Parallel()

			want, wantErr := projections.Fold(toEvents(t, h.Events))
			got, gotErr := projections.Fold(fuzzEvents(fuzzBytes(t, toEvents(t, h.Events))))
			require.Equal(t, wantErr == nil, gotErr == nil, "%v / %v", wantErr, gotErr)
			require.Equal(t, want.Status, got.Status)
			require.Equal(t, want.Events, got.Events)
			require.Len(t, got.Steps, len(want.Steps))
			for i := range want.Steps {
				require.Equal(t, want.Steps[i].Status, got.Steps[i].Status)
				require.Equal(t, want.Steps[i].Attempt, got.Steps[i].Attempt)
			}
		})
	}
	require.GreaterOrEqual(t, fuzzable, 17, "the fuzzer's bytes write most histories")
}

func FuzzFold(f *testing.F) {
	for _, h := range loadHistories(f) {
		f.Add(fuzzBytes(f, toEvents(f, h.Events)))
	}
	f.Add([]byte{})
	f.Add([]byte{0, 4, 1, 0, 4, 1})                 // started twice
	f.Add([]byte{0, 0, 0, 1, 0, 0})                 // no steps, succeeded
	f.Add([]byte{9, 0, 0x80, 0, 1, 0, 10, 0, 0x80}) // ignorable unknown and command
	f.Fuzz(func(t *testing.T, data []byte) {
		evs := fuzzEvents(data)
		got, err := projections.Fold(evs)
		if err != nil {
			var te *projections.TransitionError
			require.True(t, errors.As(err, &te) || errors.Is(err, projections.ErrUnknownStep) || errors.Is(err, projections.ErrUnknownEvent) ||
				errors.Is(err, projections.ErrMisfiled) || errors.Is(err, projections.ErrDuplicateStep), "unexpected error %T: %v", err, err)
		} else {
			require.Equal(t, len(evs), got.Events)
		}

		// The quarantining fold never fails: where Fold fails it marks the
		// damage; where Fold succeeds it agrees (repairs aside, which have
		// it pass over events).
		q := projections.FoldQuarantined("", evs) // no owner: as Fold, which knows none
		require.True(t, reflect.DeepEqual(q, projections.FoldQuarantinedCopying("", evs)),
			"the fold in place and the fold onto copies differ")
		if !slices.ContainsFunc(evs, func(ev events.Event) bool { return ev.Type == events.TypeExecutionRepaired }) {
			if err != nil {
				require.NotNil(t, q.Damaged, "Fold failed (%v) and FoldQuarantined saw no damage", err)
				require.Equal(t, len(evs), q.Events, "it moves past every event")
			} else {
				require.Nil(t, q.Damaged)
				require.True(t, reflect.DeepEqual(got, q), "Fold and FoldQuarantined differ:\n%+v\n%+v", got, q)
			}
		}

		// Apply one at a time: never modifies its input, agrees with Fold.
		var s projections.Execution
		var applyErr error
		for _, ev := range evs {
			before := slices.Clone(s.Steps)
			var next projections.Execution
			next, applyErr = projections.Apply(s, ev)
			require.Equal(t, before, s.Steps)
			if applyErr != nil {
				break
			}
			s = next
		}
		require.True(t, reflect.DeepEqual(got, s), "Fold and Apply differ:\n%+v\n%+v", got, s)
		require.Equal(t, err, applyErr)
		for _, st := range s.Steps {
			require.Contains(t, []projections.OpStatus{projections.OpNone, projections.OpPending, projections.OpSending,
				projections.OpSent, projections.OpStarted, projections.OpSucceeded, projections.OpFailed}, st.Status)
		}
	})
}

// A replay of a succeeded execution: the replay point and what follows it
// start over (their attempt kept, so the next one is new), the
// variables are replaced, and the instances' entry events are recorded.
func TestFoldReplay(t *testing.T) {
	t.Parallel()
	start := started("a", "b", "c")
	for i := range start.Data.(*events.ExecutionStarted).Steps {
		start.Data.(*events.ExecutionStarted).Steps[i].Kind = "let"
	}
	evs := []events.Event{
		start,
		stepEvent(&events.StepScheduled{StepID: "a", Attempt: 1}),
		stepEvent(&events.StepSucceeded{StepID: "a", Attempt: 1, Vars: map[string]json.RawMessage{"n": json.RawMessage(`1`)}}),
		stepEvent(&events.StepScheduled{StepID: "b", Attempt: 1}),
		stepEvent(&events.StepSucceeded{StepID: "b", Attempt: 1, Vars: map[string]json.RawMessage{"n": json.RawMessage(`2`)}}),
		stepEvent(&events.StepSkipped{StepID: "c", Reason: "condition is false"}),
		stepEvent(&events.ExecutionSucceeded{}),
	}
	s, err := projections.Fold(evs)
	require.NoError(t, err)
	require.Equal(t, []int{2, 4, 6}, []int{s.Steps[0].Entered, s.Steps[1].Entered, s.Steps[2].Entered})

	replayed := stepEvent(&events.ExecutionReplayed{ActionRecord: events.ActionRecord{Action: events.ActionReplay, Command: "ops#1", RequestedBy: "ops"},
		From: "b", Point: "b", Mode: events.ReplayModeReplay, Token: "t2", Reset: []string{"b", "c"},
		Vars: map[string]json.RawMessage{"n": json.RawMessage(`1`)}})
	s, err = projections.Apply(s, replayed)
	require.NoError(t, err)
	require.Equal(t, projections.StatusStarted, s.Status)
	require.Equal(t, "t2", s.Token)
	require.JSONEq(t, `1`, string(s.Vars["n"]))
	require.Equal(t, projections.OpSucceeded, s.Steps[0].Status)
	for _, st := range s.Steps[1:] {
		require.Equal(t, projections.OpNone, st.Status, st.ID)
		require.Zero(t, st.Entered, st.ID)
		require.Equal(t, st.Attempt, st.RetryBase, st.ID)
	}
	require.Equal(t, []projections.ActionCommand{{Command: "ops#1", Action: events.ActionReplay}}, s.Actions)
	require.Len(t, s.Replays, 1)
	require.Equal(t, "ops", s.Replays[0].RequestedBy)

	s, err = projections.Apply(s, stepEvent(&events.StepScheduled{StepID: "b", Attempt: 2}))
	require.NoError(t, err, "the replayed step runs again under a new attempt")
	require.Equal(t, 9, s.Steps[1].Entered)

	_, err = projections.Apply(s, stepEvent(&events.ExecutionReplayed{Mode: events.ReplayModeReplay, Token: "t3", Reset: []string{"zz"}}))
	require.ErrorIs(t, err, projections.ErrUnknownStep)
}

// TestAResultsStartIsKeptBetweenScheduleAndEnd: the start a result carries
// comes from the agent's clock, the schedule and the end from the
// dispatcher's. A start before the schedule (the agent's clock behind) is
// taken as the schedule, and one after the end as the end: no step
// starts before it was scheduled nor ends before it starts.
func TestAResultsStartIsKeptBetweenScheduleAndEnd(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name    string
		started time.Time
		want    time.Time
	}{
		{"between", at.Add(1500 * time.Millisecond), at.Add(1500 * time.Millisecond)},
		{"before the schedule", at.Add(-time.Hour), at.Add(time.Second)},
		{"after the end", at.Add(time.Hour), at.Add(2 * time.Second)},
	} {
		s := foldOneOperation(t, at, 2*time.Second, &events.StepSucceeded{StepID: "a", Attempt: 1, Agent: "agent-1",
			OperationStart: events.OperationStart{StartedAt: c.started, Delivery: 1}})
		require.Equal(t, projections.OpSucceeded, s.Steps[0].Status, c.name)
		require.True(t, c.want.Equal(s.Steps[0].StartedAt), "%s: started at %v, want %v", c.name, s.Steps[0].StartedAt, c.want)
		require.Equal(t, 1, s.Steps[0].Delivery, c.name)
	}
}

// TestAStartedReportGivesTheAgentsStart: a long operation is reported
// started only once it has run a while (the agent's
// -report-started-after), so step.started carries when the agent began
// it: that is the step's start, not the event's later time (a step's
// duration would be short by the wait). Kept between the schedule and the
// event, as a result's start is.
func TestAStartedReportGivesTheAgentsStart(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 3, 14, 15, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name    string
		started time.Time
		want    time.Time
	}{
		{"the agent's start", at.Add(1200 * time.Millisecond), at.Add(1200 * time.Millisecond)},
		{"none (an older agent)", time.Time{}, at.Add(1250 * time.Millisecond)},
		{"before the schedule", at.Add(-time.Hour), at.Add(time.Second)},
		{"after the event", at.Add(time.Hour), at.Add(1250 * time.Millisecond)},
	} {
		s := foldOneOperation(t, at, 1250*time.Millisecond,
			&events.StepStarted{StepID: "a", Attempt: 1, Agent: "agent-1", Delivery: 1, StartedAt: c.started})
		require.Equal(t, projections.OpStarted, s.Steps[0].Status, c.name)
		require.True(t, c.want.Equal(s.Steps[0].StartedAt), "%s: started at %v, want %v", c.name, s.Steps[0].StartedAt, c.want)
	}
}

// foldOneOperation folds the history of an execution of one operation
// step a, started at at: dispatched at +1 s, sent at +1.1 s, then last
// at +lastAfter. It fails the test unless the fold has that one step.
func foldOneOperation(t *testing.T, at time.Time, lastAfter time.Duration, last events.Payload) projections.Execution {
	t.Helper()
	return foldStepA(t, at, timed{1100 * time.Millisecond, &events.StepSent{StepID: "a", Attempt: 1, TaskID: "x1.a.1", TaskSeq: 9}},
		timed{lastAfter, last})
}

// timed is an event's payload, after a time.
type timed struct {
	after time.Duration
	p     events.Payload
}

// foldStepA folds the history of an execution of one operation step a,
// started at at and dispatched at +1 s, then the events then. It fails
// the test unless the fold has that one step.
func foldStepA(t *testing.T, at time.Time, then ...timed) projections.Execution {
	t.Helper()
	var evs []events.Event
	for _, e := range append([]timed{
		{0, &events.ExecutionStarted{Workflow: "wf", Version: 1, Steps: []events.StepRef{{ID: "a", Kind: "exec"}}, Token: "t"}},
		{time.Second, &events.StepDispatched{StepID: "a", Attempt: 1, TaskID: "x1.a.1", Queue: "default"}},
	}, then...) {
		ev := events.New("jetflow/dispatcher", "x1", "wf", at.Add(e.after), e.p)
		ev.Seq, ev.PrevSeq = uint64(len(evs)+1), uint64(len(evs))
		evs = append(evs, ev)
	}
	s, err := projections.Fold(evs)
	require.NoError(t, err)
	require.Len(t, s.Steps, 1)
	return s
}

// TestASendingCarriedByTheNextEvent: a step's start, success or failure
// may carry its task's sending (no step.sent recorded it): the step
// passed through sent then, at that sequence, and a time outside the
// schedule and the event (clocks apart) is taken as the nearer one.
func TestASendingCarriedByTheNextEvent(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	fold := func(t *testing.T, next events.Payload) projections.Step {
		t.Helper()
		return foldStepA(t, t0, timed{2 * time.Second, next}).Steps[0]
	}
	sent := events.TaskSent{SentAt: t0.Add(1100 * time.Millisecond), TaskSeq: 9}
	for _, next := range []events.Payload{
		&events.StepStarted{StepID: "a", Attempt: 1, Agent: "a1", Delivery: 1, TaskSent: sent},
		&events.StepSucceeded{StepID: "a", Attempt: 1, TaskSent: sent},
		&events.StepFailed{StepID: "a", Attempt: 1, Error: "boom", TaskSent: sent},
	} {
		st := fold(t, next)
		require.Equal(t, uint64(9), st.TaskSeq, "%T", next)
		require.True(t, sent.SentAt.Equal(st.SentAt), "%T: sent at %s", next, st.SentAt)
	}
	early := fold(t, &events.StepSucceeded{StepID: "a", Attempt: 1, TaskSent: events.TaskSent{SentAt: t0, TaskSeq: 9}})
	require.True(t, early.SentAt.Equal(t0.Add(time.Second)), "not before its schedule: %s", early.SentAt)
	late := fold(t, &events.StepSucceeded{StepID: "a", Attempt: 1, TaskSent: events.TaskSent{SentAt: t0.Add(time.Hour)}})
	require.True(t, late.SentAt.Equal(t0.Add(2*time.Second)), "not after the event: %s", late.SentAt)
	none := fold(t, &events.StepSucceeded{StepID: "a", Attempt: 1})
	require.True(t, none.SentAt.IsZero(), "an older agent's report tells nothing")
	afterStart := fold(t, &events.StepSucceeded{StepID: "a", Attempt: 1, TaskSent: events.TaskSent{SentAt: t0.Add(1500 * time.Millisecond)},
		OperationStart: events.OperationStart{StartedAt: t0.Add(1200 * time.Millisecond), Delivery: 1}})
	require.True(t, afterStart.SentAt.Equal(afterStart.StartedAt), "not sent after it started: %s, %s", afterStart.SentAt, afterStart.StartedAt)
}

// TestPeek: a look at the state after a step's schedule or success sees
// what Apply gives, and leaves the state it was given as it was, for an
// instance that is there (changed in place, then put back) and one the
// schedule adds (past the last, in room the state does not use); a
// success that sets variables, takes a signal or carries the next
// dispatch, and an event Peek refuses, change nothing either.
func TestPeek(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	s, err := projections.Fold([]events.Event{
		{ID: "1", Type: events.TypeExecutionStarted, Subject: "x1", Time: t0, Seq: 1,
			Data: &events.ExecutionStarted{Workflow: "wf", Version: 1, Token: "t",
				Steps: []events.StepRef{{ID: "a", Kind: "exec"}, {ID: "b", Kind: "foreach"}}}},
		{ID: "2", Type: events.TypeStepScheduled, Subject: "x1", Time: t0, Seq: 2, PrevSeq: 1,
			Data: &events.StepScheduled{StepID: "b", Attempt: 1, Input: json.RawMessage(`{"items":[1]}`)}},
		{ID: "3", Type: events.TypeVariablesSet, Subject: "x1", Time: t0, Seq: 3, PrevSeq: 2,
			Data: &events.VariablesSet{Vars: map[string]json.RawMessage{"w": json.RawMessage(`0`)}}},
		{ID: "4", Type: events.TypeSignalReceived, Subject: "x1", Time: t0, Seq: 4, PrevSeq: 3,
			Data: &events.SignalReceived{SignalID: "sig1", Name: "go"}},
	})
	require.NoError(t, err)
	require.Len(t, s.Signals, 1)
	s.Steps = slices.Grow(s.Steps, 4) // room past the last instance
	was := s
	was.Steps, was.Signals, was.Vars = slices.Clone(s.Steps), slices.Clone(s.Signals), maps.Clone(s.Vars)
	for _, ev := range []events.Event{
		{ID: "3", Type: events.TypeStepScheduled, Subject: "x1", Time: t0.Add(time.Second), Seq: 3,
			Data: &events.StepScheduled{StepID: "a", Attempt: 1, Input: json.RawMessage(`{"n":1}`)}},
		{ID: "3", Type: events.TypeStepScheduled, Subject: "x1", Time: t0.Add(time.Second), Seq: 3,
			Data: &events.StepScheduled{StepID: "b[0]/op", Kind: "exec", Attempt: 1}},
		{ID: "3", Type: events.TypeStepSucceeded, Subject: "x1", Time: t0.Add(time.Second), Seq: 3,
			Data: &events.StepSucceeded{StepID: "b", Attempt: 1, Output: json.RawMessage(`{"ok":true}`)}},
		{ID: "3", Type: events.TypeStepSucceeded, Subject: "x1", Time: t0.Add(time.Second), Seq: 3, // variables: a copy of the map
			Data: &events.StepSucceeded{StepID: "b", Attempt: 1, Vars: map[string]json.RawMessage{"v": json.RawMessage(`1`)}}},
		{ID: "3", Type: events.TypeStepSucceeded, Subject: "x1", Time: t0.Add(time.Second), Seq: 3, // the next dispatch: applied to a copy
			Data: &events.StepSucceeded{StepID: "b", Attempt: 1, Then: &events.StepDispatched{StepID: "a", Attempt: 1, TaskID: "x1.a.1", Queue: "default"}}},
		{ID: "3", Type: events.TypeStepSucceeded, Subject: "x1", Time: t0.Add(time.Second), Seq: 3, // a signal taken: applied to a copy
			Data: &events.StepSucceeded{StepID: "b", Attempt: 1, SignalID: "sig1"}},
	} {
		want, err := projections.Apply(s, ev)
		require.NoError(t, err)
		looked := 0
		require.NoError(t, projections.Peek(s, ev, func(next projections.Execution) {
			looked++
			require.Equal(t, want, next)
		}))
		require.Equal(t, 1, looked)
		require.Equal(t, was, s, "%s: the state given is as it was", ev.Type)
	}
	for _, refused := range []events.Event{
		{ID: "3", Type: events.TypeStepScheduled, Subject: "x1", Time: t0, Seq: 3,
			Data: &events.StepScheduled{StepID: "b", Attempt: 2}}, // b is pending: scheduled again before it ends
		{ID: "3", Type: events.TypeStepSucceeded, Subject: "x1", Time: t0, Seq: 3,
			Data: &events.StepSucceeded{StepID: "a", Attempt: 1}}, // a never ran
	} {
		_, want := projections.Apply(s, refused)
		require.Error(t, want)
		err = projections.Peek(s, refused, func(projections.Execution) { t.Fatal("looked at a state the fold refuses") })
		require.Equal(t, want, err)
		require.Equal(t, was, s, "a refused %s changes nothing", refused.Type)
	}
}

// TestMarkSent: what a dispatcher knows of a sending (MarkSent) makes the
// step sent for its decisions, is told apart from what the history
// records, and goes with the step's next event.
func TestMarkSent(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	s, err := projections.Fold([]events.Event{
		{ID: "1", Type: events.TypeExecutionStarted, Subject: "x1", Time: t0, Seq: 1,
			Data: &events.ExecutionStarted{Workflow: "wf", Version: 1, Steps: []events.StepRef{{ID: "a", Kind: "exec"}}, Token: "t"}},
		{ID: "2", Type: events.TypeStepDispatched, Subject: "x1", Time: t0, Seq: 2, PrevSeq: 1,
			Data: &events.StepDispatched{StepID: "a", Attempt: 1, TaskID: "x1.a.1", Queue: "default"}},
	})
	require.NoError(t, err)
	require.Equal(t, s, projections.MarkSent(s, "a", 2, 5, t0), "another attempt: unchanged")
	require.Equal(t, s, projections.MarkSent(s, "b", 1, 5, t0), "another step: unchanged")

	marked := projections.MarkSent(s, "a", 1, 5, t0.Add(time.Millisecond))
	require.Equal(t, projections.OpSending, s.Steps[0].Status, "the state given is not changed")
	st := marked.Steps[0]
	require.Equal(t, projections.OpSent, st.Status)
	require.True(t, st.SentUnrecorded())
	require.Equal(t, projections.OpSending, st.RecordedStatus())
	require.Equal(t, events.TaskSent{SentAt: t0.Add(time.Millisecond), TaskSeq: 5}, st.Unrecorded())
	require.Equal(t, marked, projections.MarkSent(marked, "a", 1, 6, t0.Add(time.Second)), "sent already: unchanged")
	owned := s
	owned.Steps = slices.Clone(s.Steps)
	require.Equal(t, marked, projections.MarkSentOwned(owned, "a", 1, 5, t0.Add(time.Millisecond)), "in place: the same state")
	require.Equal(t, projections.OpSent, owned.Steps[0].Status, "in place: the steps given are the state's")

	require.Equal(t, marked, projections.ForgetSent(marked, "b"), "another step: unchanged")
	forgot := projections.ForgetSent(marked, "a")
	require.Equal(t, projections.OpSending, forgot.Steps[0].Status, "sending again, as recorded")
	require.False(t, forgot.Steps[0].SentUnrecorded())
	require.Zero(t, forgot.Steps[0].TaskSeq)
	require.Equal(t, projections.OpSent, marked.Steps[0].Status, "the state given is not changed")

	done, err := projections.Apply(marked, events.Event{ID: "3", Type: events.TypeStepSucceeded, Subject: "x1", Time: t0.Add(time.Second), Seq: 3,
		Data: &events.StepSucceeded{StepID: "a", Attempt: 1, TaskSent: st.Unrecorded()}})
	require.NoError(t, err)
	require.False(t, done.Steps[0].SentUnrecorded())
	require.Equal(t, projections.OpSucceeded, done.Steps[0].RecordedStatus())
	require.Zero(t, done.Steps[0].Unrecorded())
}

// TestASuccessThenADispatch: a success that carries the next operation's
// dispatch folds as the success followed by a step.dispatched, both at
// the event's time and number.
func TestASuccessThenADispatch(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	then := &events.StepDispatched{StepID: "b", Attempt: 1, Input: json.RawMessage(`{"id":"b"}`), TaskID: "x1.b.1", Queue: "default"}
	evs := []events.Event{
		{ID: "1", Type: events.TypeExecutionStarted, Subject: "x1", Time: t0, Seq: 1,
			Data: &events.ExecutionStarted{Workflow: "wf", Version: 1, Steps: []events.StepRef{{ID: "a", Kind: "noop"}, {ID: "b", Kind: "noop"}}, Token: "t"}},
		{ID: "2", Type: events.TypeStepDispatched, Subject: "x1", Time: t0, Seq: 2, PrevSeq: 1,
			Data: &events.StepDispatched{StepID: "a", Attempt: 1, TaskID: "x1.a.1", Queue: "default"}},
		{ID: "3", Type: events.TypeStepSucceeded, Subject: "x1", Time: t0.Add(time.Second), Seq: 3, PrevSeq: 2,
			Data: &events.StepSucceeded{StepID: "a", Attempt: 1, Then: then}},
	}
	s, err := projections.Fold(evs)
	require.NoError(t, err)
	require.Equal(t, 3, s.Events)
	require.Equal(t, projections.OpSucceeded, s.Steps[0].Status)
	b := s.Steps[1]
	require.Equal(t, projections.OpSending, b.Status)
	require.Equal(t, 3, b.Entered, "entered by that event")
	require.True(t, t0.Add(time.Second).Equal(b.ScheduledAt))
	require.Equal(t, "x1.b.1", b.TaskID)
	require.JSONEq(t, `{"id":"b"}`, string(b.Input))

	t.Log("a dispatch that is illegal where it stands fails the whole event")
	again := evs[2]
	again.ID, again.Seq, again.PrevSeq = "4", 4, 3
	again.Data = &events.StepSucceeded{StepID: "b", Attempt: 1, Then: then}
	_, err = projections.Fold(append(evs, again))
	var te *projections.TransitionError
	require.ErrorAs(t, err, &te)
	require.Equal(t, events.TypeStepSucceeded, te.Event)
}

// TestAStartThenADispatch: a start that carries the first operation's
// dispatch folds as the start followed by a step.dispatched, both at the
// event's time and number.
func TestAStartThenADispatch(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	start := func(then *events.StepDispatched) events.Event {
		return events.Event{ID: "1", Type: events.TypeExecutionStarted, Subject: "x1", Time: t0, Seq: 1,
			Data: &events.ExecutionStarted{Workflow: "wf", Version: 1, Steps: []events.StepRef{{ID: "a", Kind: "noop"}, {ID: "b", Kind: "noop"}},
				Token: "t", Then: then}}
	}
	s, err := projections.Fold([]events.Event{start(&events.StepDispatched{StepID: "a", Attempt: 1, Input: json.RawMessage(`{"id":"a"}`),
		TaskID: "x1.a.1", Queue: "default"})})
	require.NoError(t, err)
	require.Equal(t, projections.StatusStarted, s.Status)
	require.Equal(t, 1, s.Events)
	a := s.Steps[0]
	require.Equal(t, projections.OpSending, a.Status)
	require.Equal(t, 1, a.Entered, "entered by that event")
	require.True(t, t0.Equal(a.ScheduledAt))
	require.Equal(t, "x1.a.1", a.TaskID)
	require.Equal(t, "t", a.Token)
	require.Equal(t, projections.OpNone, s.Steps[1].Status)

	t.Log("a dispatch that is illegal where it stands fails the whole event")
	_, err = projections.Fold([]events.Event{start(&events.StepDispatched{StepID: "nowhere/a", Attempt: 1, TaskID: "x1.a.1"})})
	require.ErrorContains(t, err, `unknown step: "nowhere/a" in io.jetflow.execution.started`)
}

// TestAStartNamingAStepTwiceIsRefused: short lists (compared pair by
// pair) and long ones (through a map) alike.
func TestAStartNamingAStepTwiceIsRefused(t *testing.T) {
	t.Parallel()
	for _, n := range []int{2, 10, 32, 33, 100} {
		steps := make([]string, n)
		for i := range steps {
			steps[i] = fmt.Sprintf("s%d", i)
		}
		_, err := projections.Fold([]events.Event{started(steps...)})
		require.NoError(t, err, "%d different steps", n)
		steps[n-1] = steps[(n-1)/2]
		_, err = projections.Fold([]events.Event{started(steps...)})
		require.ErrorIs(t, err, projections.ErrDuplicateStep, "%d steps, one twice", n)
		require.Contains(t, err.Error(), fmt.Sprintf("%q", steps[(n-1)/2]))
	}
}

// TestTwinsAfterAnOldMoveAreFoundFromTheLast: in a history whose move
// to another version (by a dispatcher before 2026-12-05) renamed an
// instance onto another's path, a path finds the later instance, as the
// interpreter's index and views do.
func TestTwinsAfterAnOldMoveAreFoundFromTheLast(t *testing.T) {
	t.Parallel()
	for _, h := range loadHistories(t) {
		if h.Name != "TwinsAfterAnOldMove" {
			continue
		}
		x, err := projections.Fold(toEvents(t, h.Events))
		require.NoError(t, err)
		require.Len(t, x.Steps, 2)
		require.Equal(t, projections.OpFailed, x.Steps[0].Status, "build, renamed")
		require.Equal(t, 1, x.StepIndex("deploy"), "the later of the two")
		return
	}
	t.Fatal("no history TwinsAfterAnOldMove in testdata")
}

// TestASleepsSuccessRecordsItsFiring: a sleep's success that carries its
// timer's firing (docs/adr/0017) folds as the timer.fired followed by the
// success, at the event's time and number, also inside an end that
// carries the success; a firing of a timer that is not the sleep's
// armed one fails the whole event.
func TestASleepsSuccessRecordsItsFiring(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	due := t0.Add(time.Minute)
	evs := []events.Event{
		{ID: "1", Type: events.TypeExecutionStarted, Subject: "x1", Time: t0, Seq: 1,
			Data: &events.ExecutionStarted{Workflow: "wf", Version: 1, Steps: []events.StepRef{{ID: "rest", Kind: "sleep"}}, Token: "t"}},
		{ID: "2", Type: events.TypeStepScheduled, Subject: "x1", Time: t0, Seq: 2, PrevSeq: 1,
			Data: &events.StepScheduled{StepID: "rest", Kind: "sleep", Attempt: 1}},
		{ID: "3", Type: events.TypeTimerArmed, Subject: "x1", Time: t0, Seq: 3, PrevSeq: 2,
			Data: &events.TimerArmed{TimerID: "t1", Purpose: events.TimerSleep, StepID: "rest", Attempt: 1, Due: due}},
		{ID: "4", Type: events.TypeTimerArmed, Subject: "x1", Time: t0, Seq: 4, PrevSeq: 3,
			Data: &events.TimerArmed{TimerID: "t2", Purpose: events.TimerWorkflowTimeout, Due: due.Add(time.Hour)}},
		{ID: "5", Type: events.TypeStepWaiting, Subject: "x1", Time: t0, Seq: 5, PrevSeq: 4,
			Data: &events.StepWaiting{StepID: "rest", Attempt: 1, Until: due}},
		// The same step attempt's timer of another purpose, and another
		// step's sleep.
		{ID: "6", Type: events.TypeTimerArmed, Subject: "x1", Time: t0, Seq: 6, PrevSeq: 5,
			Data: &events.TimerArmed{TimerID: "t3", Purpose: events.TimerStepTimeout, StepID: "rest", Attempt: 1, Due: due.Add(time.Hour)}},
		{ID: "7", Type: events.TypeTimerArmed, Subject: "x1", Time: t0, Seq: 7, PrevSeq: 6,
			Data: &events.TimerArmed{TimerID: "t4", Purpose: events.TimerSleep, StepID: "other", Attempt: 1, Due: due}},
	}
	end := func(p *events.StepSucceeded) events.Event {
		return events.Event{ID: "9", Type: events.TypeExecutionSucceeded, Subject: "x1", Time: due, Seq: 9, PrevSeq: 8,
			Data: &events.ExecutionSucceeded{Step: p}}
	}

	s, err := projections.Fold(append(slices.Clone(evs), end(&events.StepSucceeded{StepID: "rest", Attempt: 1, Fired: "t1"})))
	require.NoError(t, err)
	require.Equal(t, 8, s.Events)
	require.Equal(t, projections.StatusSucceeded, s.Status)
	require.True(t, s.Timers["t1"].Fired, "the firing is recorded")
	require.True(t, due.Equal(s.Timers["t1"].FiredAt), "at the event's time")
	require.False(t, s.Timers["t2"].Fired)
	require.True(t, s.Timers["t2"].FiredAt.IsZero())
	require.Equal(t, projections.OpSucceeded, s.Steps[0].Status)
	require.True(t, due.Equal(s.Steps[0].EndedAt))

	alone := events.Event{ID: "8", Type: events.TypeStepSucceeded, Subject: "x1", Time: due, Seq: 8, PrevSeq: 7,
		Data: &events.StepSucceeded{StepID: "rest", Attempt: 1, Fired: "t1"}}
	s, err = projections.Fold(append(slices.Clone(evs), alone))
	require.NoError(t, err)
	require.Equal(t, projections.StatusStarted, s.Status)
	require.True(t, s.Timers["t1"].Fired)
	require.Equal(t, projections.OpSucceeded, s.Steps[0].Status)

	for name, c := range map[string]struct {
		p    *events.StepSucceeded
		from string
	}{
		"NotArmed":         {&events.StepSucceeded{StepID: "rest", Attempt: 1, Fired: "t9"}, "not armed"},
		"AWorkflowsTimer":  {&events.StepSucceeded{StepID: "rest", Attempt: 1, Fired: "t2"}, "a timer of another step"},
		"AnotherPurpose":   {&events.StepSucceeded{StepID: "rest", Attempt: 1, Fired: "t3"}, "a timer of another step"},
		"AnotherStep":      {&events.StepSucceeded{StepID: "rest", Attempt: 1, Fired: "t4"}, "a timer of another step"},
		"AnotherAttempt":   {&events.StepSucceeded{StepID: "rest", Attempt: 2, Fired: "t1"}, "a timer of another step"},
		"FiredAlreadyOnce": {nil, "not armed"},
	} {
		p := c.p
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := slices.Clone(evs)
			if p == nil { // recorded fired before: a second firing is refused
				h = append(h, events.Event{ID: "8", Type: events.TypeTimerFired, Subject: "x1", Time: due, Seq: 8, PrevSeq: 7,
					Data: &events.TimerFired{TimerID: "t1"}})
				p = &events.StepSucceeded{StepID: "rest", Attempt: 1, Fired: "t1"}
			}
			requireRefused(t, append(h, end(p)), c.from)
		})
	}
}

// requireRefused checks that the fold of h fails at its last event, as a
// whole (the error names that event's type), for the reason from.
func requireRefused(t *testing.T, h []events.Event, from string) {
	t.Helper()
	_, err := projections.Fold(h)
	var te *projections.TransitionError
	require.ErrorAs(t, err, &te)
	require.Equal(t, h[len(h)-1].Type, te.Event, "the whole event fails")
	require.Equal(t, from, te.From, "refused for the right reason")
}

// TestAWaitRecordsItsTimersArming: a step.waiting that carries its
// timer's arming (docs/adr/0018) folds as the timer.armed and the
// step.waiting did one after the other; an arming that is not that
// wait's (another purpose, step, attempt or due time), or a timer armed
// already, fails the whole event.
func TestAWaitRecordsItsTimersArming(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	due := t0.Add(time.Minute)
	evs := []events.Event{
		{ID: "1", Type: events.TypeExecutionStarted, Subject: "x1", Time: t0, Seq: 1,
			Data: &events.ExecutionStarted{Workflow: "wf", Version: 1, Steps: []events.StepRef{{ID: "rest", Kind: "sleep"}, {ID: "ask", Kind: "wait"}}, Token: "t"}},
		{ID: "2", Type: events.TypeStepScheduled, Subject: "x1", Time: t0, Seq: 2, PrevSeq: 1,
			Data: &events.StepScheduled{StepID: "rest", Kind: "sleep", Attempt: 1}},
	}
	armed := func(id, purpose, step string, attempt int, at time.Time) *events.TimerArmed {
		return &events.TimerArmed{TimerID: id, Purpose: purpose, StepID: step, Attempt: attempt, Due: at}
	}
	waiting := func(timer *events.TimerArmed) events.Event {
		return events.Event{ID: "3", Type: events.TypeStepWaiting, Subject: "x1", Time: t0.Add(time.Millisecond), Seq: 3, PrevSeq: 2,
			Data: &events.StepWaiting{StepID: "rest", Attempt: 1, Until: due, Timer: timer}}
	}

	s, err := projections.Fold(append(slices.Clone(evs), waiting(armed("t1", events.TimerSleep, "rest", 1, due))))
	require.NoError(t, err)
	require.Equal(t, 3, s.Events)
	require.Equal(t, projections.Timer{Purpose: events.TimerSleep, StepID: "rest", Attempt: 1, Due: due}, s.Timers["t1"])
	require.Equal(t, projections.OpWaiting, s.Steps[0].Status)
	require.True(t, due.Equal(s.Steps[0].WaitUntil))

	// The same as the two events an older dispatcher appends.
	two := append(slices.Clone(evs),
		events.Event{ID: "3", Type: events.TypeTimerArmed, Subject: "x1", Time: t0.Add(time.Millisecond), Seq: 3, PrevSeq: 2,
			Data: armed("t1", events.TimerSleep, "rest", 1, due)},
		events.Event{ID: "4", Type: events.TypeStepWaiting, Subject: "x1", Time: t0.Add(time.Millisecond), Seq: 4, PrevSeq: 3,
			Data: &events.StepWaiting{StepID: "rest", Attempt: 1, Until: due}})
	old, err := projections.Fold(two)
	require.NoError(t, err)
	require.Equal(t, old.Timers, s.Timers)
	require.Equal(t, old.Steps[0].Status, s.Steps[0].Status)
	require.Equal(t, old.Steps[0].StartedAt, s.Steps[0].StartedAt)
	require.Equal(t, old.Steps[0].SleptFrom, s.Steps[0].SleptFrom)

	for name, c := range map[string]struct {
		timer *events.TimerArmed
		from  string
	}{
		"AnotherPurpose": {armed("t1", events.TimerStepTimeout, "rest", 1, due), "a timer not this wait's"},
		"AWaitsTimeout":  {armed("t1", events.TimerWaitTimeout, "rest", 1, due), "a timer not this wait's"},
		"AnotherStep":    {armed("t1", events.TimerSleep, "ask", 1, due), "a timer not this wait's"},
		"AnotherAttempt": {armed("t1", events.TimerSleep, "rest", 2, due), "a timer not this wait's"},
		"AnotherDue":     {armed("t1", events.TimerSleep, "rest", 1, due.Add(time.Second)), "a timer not this wait's"},
		"ArmedAlready":   {nil, "armed"},
	} {
		timer := c.timer
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := slices.Clone(evs)
			if timer == nil { // recorded armed before: a second arming is refused
				h = append(h, events.Event{ID: "2b", Type: events.TypeTimerArmed, Subject: "x1", Time: t0, Seq: 3, PrevSeq: 2,
					Data: armed("t1", events.TimerSleep, "rest", 1, due)})
				timer = armed("t1", events.TimerSleep, "rest", 1, due)
			}
			w := waiting(timer)
			w.Seq, w.PrevSeq = h[len(h)-1].Seq+1, h[len(h)-1].Seq
			requireRefused(t, append(h, w), c.from)
		})
	}
}
