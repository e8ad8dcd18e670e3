package projections

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"jetflow.dev/pkg/events"
)

// ErrInvalidEvent is returned for a stored message that is no valid event
// (events.Event.Invalid).
var ErrInvalidEvent = errors.New("projections: invalid event")

// ErrMisfiled is returned for an event in a history that names another
// execution (its CloudEvents subject or workflow): written there by hand,
// it is never applied to the execution whose history holds it.
var ErrMisfiled = errors.New("projections: event of another execution")

// misfiled reports an event that names another execution than s.
func misfiled(s Execution, ev events.Event) error {
	switch {
	case s.ID != "" && ev.Subject != s.ID:
		return fmt.Errorf("%w: event %s names execution %q, in the history of %q", ErrMisfiled, ev.ID, ev.Subject, s.ID)
	case s.Workflow != "" && ev.Workflow != "" && ev.Workflow != s.Workflow:
		return fmt.Errorf("%w: event %s names workflow %q, in the history of a %q execution", ErrMisfiled, ev.ID, ev.Workflow, s.Workflow)
	}
	return nil
}

// Damage says where and why an execution's history stopped folding: an
// event that cannot be decoded, that this version does not know, or that
// is illegal where it stands. The execution is quarantined: nothing acts
// on it until an admin repairs it (events.ExecutionRepaired), and its
// history stays as it is.
type Damage struct {
	// Seq is the stream sequence of the event at fault, EventID its id
	// and Type its type, as far as they could be read.
	Seq     uint64      `json:"seq"`
	EventID string      `json:"event_id,omitempty"`
	Type    events.Type `json:"type,omitempty"`
	// Reason says what is wrong with it.
	Reason string `json:"reason"`
	// Unknown: the event's type is unknown to this version (a newer one
	// may know it), not broken.
	Unknown bool `json:"unknown,omitempty"`
}

// FoldQuarantined folds the history of execution id (its owner, as its
// subject says; "" when unknown), which may hold events that do not fold.
// It never fails: the first event that cannot be applied (and that no
// repair recorded in the history passes over) marks the state Damaged,
// and the events after it only move the position on (PassOver), so that
// a writer conditioned on the last sequence (the repair's append) still
// fits. Events named by ExecutionRepaired are passed over wherever they
// are. An event naming another execution than id is damage too.
func FoldQuarantined(id string, evs []events.Event) Execution {
	return foldQuarantined(id, evs, Repaired(evs))
}

// FoldQuarantinedPrefix is FoldQuarantined of the first n events of a
// history, passing over the events that repairs anywhere in it name (a
// state as it was at an earlier point, after the history was repaired).
func FoldQuarantinedPrefix(id string, evs []events.Event, n int) Execution {
	return foldQuarantined(id, evs[:min(n, len(evs))], Repaired(evs))
}

// Repaired returns the stream sequences of the events that the repairs
// recorded in evs have folds pass over.
func Repaired(evs []events.Event) map[uint64]bool {
	ignore := map[uint64]bool{}
	for _, ev := range evs {
		if r, ok := ev.Data.(*events.ExecutionRepaired); ok && r.IgnoreSeq > 0 {
			ignore[r.IgnoreSeq] = true
		}
	}
	return ignore
}

func foldQuarantined(id string, evs []events.Event, ignore map[uint64]bool) Execution {
	return foldQuarantinedWith(id, evs, ignore, applyOwned)
}

// foldQuarantinedWith is foldQuarantined applying each event with
// applyEvent: applyOwned, which may leave the state it failed on changed,
// so that the first damage folds the events before it again with Apply,
// which never does (a fold meets a damage once: everything after it is
// passed over).
func foldQuarantinedWith(id string, evs []events.Event, ignore map[uint64]bool, applyEvent func(Execution, events.Event) (Execution, error)) Execution {
	s := Execution{ID: id}
	for i, ev := range evs {
		if ignore[ev.Seq] || s.Damaged != nil {
			s = PassOver(s, ev)
			continue
		}
		next, err := applyEvent(s, ev)
		if err != nil {
			s = foldQuarantinedWith(id, evs[:i], ignore, Apply)
			s.Damaged = &Damage{Seq: ev.Seq, EventID: ev.ID, Type: ev.Type, Reason: damageReason(s, ev, err),
				Unknown: errors.Is(err, ErrUnknownEvent)}
			s = PassOver(s, ev)
			continue
		}
		s = next
	}
	return s
}

// damageReason says why ev does not fold onto s, for people: what is wrong
// with the event, without the package's prefix or the execution's id
// (the damage is shown with its execution).
func damageReason(s Execution, ev events.Event, err error) string {
	if ev.Invalid != "" {
		return "the stored message is no valid event: " + ev.Invalid
	}
	why := strings.TrimPrefix(err.Error(), "projections: ")
	for _, id := range []string{s.ID, ev.Subject} {
		if id != "" {
			why = strings.TrimPrefix(why, "execution "+id+": ")
		}
	}
	return why
}

// PassOver moves the state's position past ev without applying it: an
// event after a damage (nothing after it applies until a repair), or one
// a repair names.
func PassOver(s Execution, ev events.Event) Execution {
	if ev.Seq != 0 {
		s.LastSeq = ev.Seq
	}
	s.LastEventID = ev.ID
	s.Events++
	return s
}

// invalid is the error of folding a message that is no valid event.
func invalid(ev events.Event) error {
	return fmt.Errorf("%w at sequence %d: %s", ErrInvalidEvent, ev.Seq, ev.Invalid)
}

// repaired records a repair in s.
func repaired(s Execution, e *events.ExecutionRepaired) Execution {
	s.Repairs = append(slices.Clone(s.Repairs), e.IgnoreSeq)
	s.Actions = withAction(s.Actions, e.ActionRecord)
	return s
}
