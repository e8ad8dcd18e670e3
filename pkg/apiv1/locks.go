package apiv1

import (
	"time"

	"jetflow.dev/pkg/events"
)

// LockEntry is a holder or a waiter of a lock.
type LockEntry struct {
	ExecutionID string `json:"execution_id"`
	Workflow    string `json:"workflow"`
	// Path is the scope: "" for the workflow's own lock, else the
	// workflow step's path.
	Path string `json:"path,omitempty"`
	// Request numbers the scope's requests of the lock.
	Request int `json:"request"`
	// Since is when a holder acquired the lock, when a waiter asked.
	Since time.Time `json:"since"`
}

// Lock is a lock as GET /v1/locks/{name} answers it: its holders and its
// waiters, in the order they acquire.
type Lock struct {
	Name    string      `json:"name"`
	Limit   int         `json:"limit"`
	Holders []LockEntry `json:"holders"`
	Waiters []LockEntry `json:"waiters"`
}

// LockList answers GET /v1/locks: every lock held or waited for, by name.
type LockList struct {
	Locks []Lock `json:"locks"`
}

// ClearLockRequest is the optional body of DELETE /v1/locks/{name}: whose
// hold to clear and why. Unknown members are an error.
type ClearLockRequest struct {
	// ExecutionID clears only this execution's hold; every holder if empty.
	ExecutionID string `json:"execution_id,omitempty"`
	// Reason is kept in the holders' histories.
	Reason      string `json:"reason,omitempty"`
	RequestedBy string `json:"requested_by,omitempty"`
}

// ClearedLock answers DELETE /v1/locks/{name}.
type ClearedLock struct {
	// Cleared are the holds cleared.
	Cleared []events.LockEntry `json:"cleared"`
	// Command is the key of the clear-lock command.
	Command string `json:"command"`
	Lock    string `json:"lock"`
	// Recorded is true once every cleared holder's history records it
	// (200), false if not yet (202).
	Recorded bool `json:"recorded"`
}
