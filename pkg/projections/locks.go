package projections

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"jetflow.dev/pkg/events"
)

// LockStatus is the state of a scope's hold on a lock.
//
// Valid transitions:
//
//	""                   -> waiting   (LockRequested)
//	released, cleared    -> waiting   (LockRequested: asked again, e.g. after a resume)
//	waiting              -> held      (LockAcquired)
//	waiting, held        -> released  (LockReleased)
//	waiting, held        -> cleared   (LockCleared)
//
// A lock is requested and acquired only while the execution is started or
// cancelling; it may be released or cleared in any status, since an
// execution that ended (force-cancel, kill) gives its locks up after its
// last event.
type LockStatus string

// Lock statuses.
const (
	LockWaiting  LockStatus = "waiting"
	LockHeld     LockStatus = "held"
	LockReleased LockStatus = "released"
	LockCleared  LockStatus = "cleared"
)

// Open reports whether the scope holds or waits for the lock.
func (s LockStatus) Open() bool { return s == LockWaiting || s == LockHeld }

// Lock is a scope's hold on a lock: the whole workflow (Path "") or a
// workflow step instance. It is the latest hold of that scope.
type Lock struct {
	Name   string     `json:"name"`
	Path   string     `json:"path,omitempty"`
	Limit  int        `json:"limit"`
	Status LockStatus `json:"status"`
	// Requests counts the scope's requests (a scope asks again after a
	// release or clear, e.g. when resumed).
	Requests    int       `json:"requests"`
	RequestedAt time.Time `json:"requested_at,omitzero"`
	AcquiredAt  time.Time `json:"acquired_at,omitzero"`
	ReleasedAt  time.Time `json:"released_at,omitzero"`
	// Reason says why it was released or cleared; ClearedBy who cleared
	// it (the requested_by remark) and ClearedByActor who, as authenticated.
	Reason         string        `json:"reason,omitempty"`
	ClearedBy      string        `json:"cleared_by,omitempty"`
	ClearedByActor *events.Actor `json:"cleared_by_actor,omitempty"`
}

// LockAt returns the hold of the scope at path.
func (s Execution) LockAt(path string) (Lock, bool) {
	if i := s.lockIndex(path); i >= 0 {
		return s.Locks[i], true
	}
	return Lock{}, false
}

// ContainerAt returns the container step instance whose attempt's path
// prefix is key ("blk", or "blk@2" for its second attempt, whose steps
// are blk@2/...): exists if the execution has the instance, current if
// key is its current attempt's.
func (s Execution) ContainerAt(key string) (st Step, exists, current bool) {
	path, attempt := key, 1
	if i := strings.LastIndexByte(key, '@'); i > strings.LastIndexByte(key, '/') {
		n, err := strconv.Atoi(key[i+1:])
		if err != nil {
			return Step{}, false, false
		}
		path, attempt = key[:i], n
	}
	i := s.StepIndex(path)
	if i < 0 {
		return Step{}, false, false
	}
	return s.Steps[i], true, max(s.Steps[i].Attempt, 1) == attempt
}

// WaitingLocks lists the locks the execution waits for.
func (s Execution) WaitingLocks() []Lock {
	var out []Lock
	for _, l := range s.Locks {
		if l.Status == LockWaiting {
			out = append(out, l)
		}
	}
	return out
}

func (s Execution) lockIndex(path string) int {
	return slices.IndexFunc(s.Locks, func(l Lock) bool { return l.Path == path })
}

// applyLock folds a lock event; ok is false for other events.
func applyLock(s Execution, ev events.Event) (next Execution, ok bool, err error) {
	var name, path string
	var to LockStatus
	switch e := ev.Data.(type) {
	case *events.LockRequested:
		name, path, to = e.Lock, e.Path, LockWaiting
	case *events.LockAcquired:
		name, path, to = e.Lock, e.Path, LockHeld
	case *events.LockReleased:
		name, path, to = e.Lock, e.Path, LockReleased
	case *events.LockCleared:
		name, path, to = e.Lock, e.Path, LockCleared
	default:
		return s, false, nil
	}
	illegal := func(from string) (Execution, bool, error) {
		return s, true, &TransitionError{ExecutionID: s.ID, From: from, Event: ev.Type, StepID: path}
	}
	if s.Status == StatusNone {
		return illegal(string(s.Status))
	}
	if (to == LockWaiting || to == LockHeld) && !s.Status.Active() {
		return illegal(string(s.Status))
	}
	i := s.lockIndex(path)
	var l Lock
	if i >= 0 {
		l = s.Locks[i]
	}
	if to != LockWaiting && l.Name != name {
		return illegal("lock " + l.Name + " " + string(l.Status))
	}
	switch to {
	case LockWaiting:
		if l.Status.Open() {
			return illegal("lock " + string(l.Status))
		}
		l = Lock{Name: name, Path: path, Limit: ev.Data.(*events.LockRequested).Limit, Status: LockWaiting,
			Requests: l.Requests + 1, RequestedAt: ev.Time}
	case LockHeld:
		if l.Status != LockWaiting {
			return illegal("lock " + string(l.Status))
		}
		l.Status, l.AcquiredAt = LockHeld, ev.Time
	default:
		if !l.Status.Open() {
			return illegal("lock " + string(l.Status))
		}
		l.Status, l.ReleasedAt = to, ev.Time
		if e, cleared := ev.Data.(*events.LockCleared); cleared {
			l.Reason, l.ClearedBy, l.ClearedByActor = e.Reason, e.RequestedBy, e.Actor
		} else {
			l.Reason = ev.Data.(*events.LockReleased).Reason
		}
	}
	s.Locks = slices.Clone(s.Locks)
	if i >= 0 {
		s.Locks[i] = l
	} else {
		s.Locks = append(s.Locks, l)
	}
	return s, true, nil
}
