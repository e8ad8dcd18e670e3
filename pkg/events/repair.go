package events

import "fmt"

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

// DamagedMessage is what the sender of a command for a damaged execution
// is told: the command itself may be fine; the execution's history holds
// an event that does not fold at seq, and it waits for an admin's repair.
func DamagedMessage(executionID string, seq uint64, reason string) string {
	return fmt.Sprintf("execution %q takes no command now: its history is damaged at sequence %d (%s); "+
		"it waits for an admin's repair: jetflow repair %s --ignore-seq %d", executionID, seq, reason, executionID, seq)
}
