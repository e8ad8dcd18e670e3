package events

import (
	"strings"
)

// Lock events and commands. A lock is held by a scope of an execution: the
// whole workflow (Path "") or one workflow step instance (Path is its
// path). docs/locks.md describes the semantics.
const (
	// TypeLockRequested records that a scope asked for a lock; it waits
	// until it is acquired.
	TypeLockRequested Type = "io.jetflow.lock.requested"
	// TypeLockAcquired records that the lock bucket lists the scope as a
	// holder: its steps may run.
	TypeLockAcquired Type = "io.jetflow.lock.acquired"
	// TypeLockReleased records that the scope gave the lock up (or stopped
	// waiting for it): the lock bucket no longer lists it.
	TypeLockReleased Type = "io.jetflow.lock.released"
	// TypeLockCleared records that an operator (or the janitor, for a
	// holder that had ended) removed the scope from the lock's holders.
	TypeLockCleared Type = "io.jetflow.lock.cleared"
	// TypeClearLock is the command to force-clear a lock's holders.
	TypeClearLock Type = "io.jetflow.lock.clear"
)

// LockNameRule describes valid lock names, for error messages.
const LockNameRule = "use 1 to 128 ASCII letters, digits, '-', '_' or '.', starting with a letter or digit, with no '..' and not ending in '.'"

// ValidLockName reports whether name can name a lock: it is the lock's key
// in the locks bucket (JF_LOCKS).
func ValidLockName(name string) bool {
	return token(name, 128, true, ".") && !strings.Contains(name, "..") && !strings.HasSuffix(name, ".")
}

// MaxSemaphore is the largest number of holders a lock may allow.
const MaxSemaphore = 1000

// LockRequested records a scope's request for a lock.
type LockRequested struct {
	// Lock is the rendered lock name.
	Lock string `json:"lock"`
	// Path is the scope: "" for the workflow, a workflow step's path.
	Path string `json:"path,omitempty"`
	// Limit is the number of holders the lock allows (semaphore; 1 for a mutex).
	Limit int `json:"limit"`
}

// LockAcquired records that the scope holds the lock.
type LockAcquired struct {
	Lock string `json:"lock"`
	Path string `json:"path,omitempty"`
}

// LockReleased records that the scope no longer holds (or waits for) the lock.
type LockReleased struct {
	Lock string `json:"lock"`
	Path string `json:"path,omitempty"`
	// Reason says why: the scope's steps ended, the execution ended...
	Reason string `json:"reason,omitempty"`
}

// LockCleared records a force-clear of the scope's hold (or request).
type LockCleared struct {
	ActionRecord
	Lock string `json:"lock"`
	Path string `json:"path,omitempty"`
}

// LockEntry names a scope in a clear command.
type LockEntry struct {
	ExecutionID string `json:"execution_id"`
	Workflow    string `json:"workflow"`
	Path        string `json:"path,omitempty"`
	// Request is the scope's request number (see the lock bucket's entries).
	Request int `json:"request"`
}

// ClearLock is the data of a clear-lock command: the dispatcher removes
// each of Entries from the lock (with compare-and-set) and records
// [LockCleared] in its execution's history.
type ClearLock struct {
	Lock    string      `json:"lock"`
	Entries []LockEntry `json:"entries"`
	// OnlyEnded clears an entry only if its execution is no longer
	// running (the janitor's sweep): one resumed meanwhile is left alone.
	OnlyEnded   bool   `json:"only_ended,omitempty"`
	Reason      string `json:"reason,omitempty"`
	RequestedBy string `json:"requested_by,omitempty"`
	// Actor is set by the api only ([Actor]).
	Actor *Actor `json:"actor,omitempty"`
}

func (*LockRequested) EventType() Type { return TypeLockRequested }
func (*LockAcquired) EventType() Type  { return TypeLockAcquired }
func (*LockReleased) EventType() Type  { return TypeLockReleased }
func (*LockCleared) EventType() Type   { return TypeLockCleared }
func (*ClearLock) EventType() Type     { return TypeClearLock }

func (*LockRequested) payload() {}
func (*LockAcquired) payload()  {}
func (*LockReleased) payload()  {}
func (*LockCleared) payload()   {}
func (*ClearLock) payload()     {}

// newLockPayload returns a pointer to a zero lock (or expiry) payload for t, or nil.
func newLockPayload(t Type) Payload {
	switch t {
	case TypeLockRequested:
		return &LockRequested{}
	case TypeLockAcquired:
		return &LockAcquired{}
	case TypeLockReleased:
		return &LockReleased{}
	case TypeLockCleared:
		return &LockCleared{}
	case TypeClearLock:
		return &ClearLock{}
	case TypeExpireExecution:
		return &ExpireExecution{}
	case TypeExecutionExpired:
		return &ExecutionExpired{}
	case TypeExecutionRepaired:
		return &ExecutionRepaired{}
	}
	return nil
}
