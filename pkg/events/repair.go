package events

import (
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
)

// Quarantine and repair. A history can hold an event that cannot be
// decoded or is illegal where it stands: a bug, or an admin's mistake (only
// the dispatcher's and the admin's identities may write histories). It is
// never shown as state: folds mark the execution damaged at that event
// and stop there, the dispatcher stops acting on it, and the history stays
// as it is. An admin repairs it with the repair action, which records
// ExecutionRepaired: folds then pass over the event it names, and the
// execution goes on.
const (
	// TypeExecutionRepaired records that an admin had a damaged execution
	// go on without the event at IgnoreSeq: folds pass over it.
	TypeExecutionRepaired Type = "io.jetflow.execution.repaired"
	// ActionRepair is the admin's action that records ExecutionRepaired.
	ActionRepair = "repair"
	// CodeDamaged rejects a command for an execution that is damaged: it
	// waits for an admin's repair.
	CodeDamaged = "damaged"
)

// ExecutionRepaired records a repair: the event at stream sequence
// IgnoreSeq, which made the execution damaged, is passed over by folds.
type ExecutionRepaired struct {
	IgnoreSeq uint64 `json:"ignore_seq"`
	ActionRecord
}

func (*ExecutionRepaired) EventType() Type { return TypeExecutionRepaired }
func (*ExecutionRepaired) payload()        {}

// notCloudEvent is how Decode starts to say a message is no CloudEvent.
const notCloudEvent = "the message is not a CloudEvent"

// InvalidEvent stands for a message stored on subject that is no valid
// event (Decode returned cause): what its headers and subject tell of it,
// and Invalid saying why. Readers of histories hand it on instead of
// failing, and folds mark its execution damaged at it.
func InvalidEvent(subject string, h nats.Header, cause error) Event {
	why := strings.TrimPrefix(cause.Error(), ErrMalformed.Error()+": ")
	if strings.HasPrefix(why, notCloudEvent+":") {
		// What a publisher should send is no help to whoever reads a
		// history: say what it is.
		why = notCloudEvent + " (no ce- headers, and no CloudEvent in the body)"
	}
	ev := Event{ID: h.Get(nats.MsgIdHdr), Type: Type(h.Get("ce-type")), Invalid: why}
	if ev.ID == "" {
		ev.ID = h.Get("ce-id")
	}
	ev.Workflow, ev.Subject, _ = ParseExecutionSubject(subject)
	return ev
}

// DamagedMessage is what the sender of a command for a damaged execution
// is told: the command itself may be fine; the execution's history holds
// an event that does not fold at seq, and it waits for an admin's repair.
func DamagedMessage(executionID string, seq uint64, reason string) string {
	return fmt.Sprintf("execution %q takes no command now: its history is damaged at sequence %d (%s); "+
		"it waits for an admin's repair: jetflow repair %s --ignore-seq %d", executionID, seq, reason, executionID, seq)
}
