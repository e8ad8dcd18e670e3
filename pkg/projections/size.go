package projections

import (
	"unsafe"

	"jetflow.dev/pkg/events"
)

// Approximate costs, in bytes, of what a state's fields point to, beyond
// the bytes of their strings and JSON values: a map entry (key, value
// slot and the map's share of overhead), and a pointed-to record.
const (
	mapEntryBytes = 48
	pointerBytes  = 8
)

// SizeEstimate is about how many bytes of memory s holds: its own fields,
// its slices' backing arrays and what their elements point to (strings,
// JSON values, maps). It is an estimate for bounding caches by bytes, not
// an exact count: memory shared with other states (a string two states
// both hold) counts in each, and the allocator's rounding is left out.
// It walks every step, so it costs as much as the state's size.
func SizeEstimate(s *Execution) int {
	n := int(unsafe.Sizeof(*s)) +
		len(s.ID) + len(s.Workflow) + len(s.Input) + len(s.Output) + len(s.Error) + len(s.Token) +
		len(s.CommandKey) + len(s.StartedBy) + len(s.APIURL) + len(s.Retention) + len(s.RetentionKey) +
		len(s.LastEventID)
	if s.StartedByActor != nil {
		n += actorSize(s.StartedByActor)
	}
	n += cap(s.Steps) * int(unsafe.Sizeof(Step{}))
	for i := range s.Steps {
		st := &s.Steps[i]
		n += len(st.ID) + len(st.Kind) + len(st.TaskID) + len(st.Queue) + len(st.Agent) +
			len(st.Input) + len(st.Output) + len(st.Error) + len(st.Token)
	}
	for k, v := range s.Vars {
		n += mapEntryBytes + len(k) + len(v)
	}
	for k, t := range s.Timers {
		n += mapEntryBytes + int(unsafe.Sizeof(t)) + len(k) + len(t.Purpose) + len(t.StepID)
	}
	if c := s.Cancellation; c != nil {
		n += int(unsafe.Sizeof(*c)) + len(c.Action) + len(c.Reason) + len(c.RequestedBy) + actorSize(c.Actor)
	}
	n += cap(s.Actions) * int(unsafe.Sizeof(ActionCommand{}))
	for i := range s.Actions {
		n += len(s.Actions[i].Command) + len(s.Actions[i].Action) + actorSize(s.Actions[i].Actor)
	}
	n += cap(s.Ignored) * int(unsafe.Sizeof(""))
	for _, id := range s.Ignored {
		n += len(id)
	}
	n += cap(s.Replays) * int(unsafe.Sizeof(Replay{}))
	for i := range s.Replays {
		r := &s.Replays[i]
		n += len(r.From) + len(r.Point) + len(r.Mode) + len(r.Cause) + len(r.RequestedBy) + len(r.Reason) + actorSize(r.Actor)
	}
	n += cap(s.Signals) * int(unsafe.Sizeof(Signal{}))
	for i := range s.Signals {
		g := &s.Signals[i]
		n += len(g.ID) + len(g.Name) + len(g.Data) + len(g.TakenBy) + actorSize(g.Actor)
	}
	n += cap(s.Locks) * int(unsafe.Sizeof(Lock{}))
	for i := range s.Locks {
		l := &s.Locks[i]
		n += len(l.Name) + len(l.Path) + len(l.Reason) + len(l.ClearedBy)
	}
	if d := s.Damaged; d != nil {
		n += int(unsafe.Sizeof(*d)) + len(d.EventID) + len(d.Type) + len(d.Reason)
	}
	n += cap(s.Repairs) * int(unsafe.Sizeof(uint64(0)))
	if s.Truncated != nil {
		n += int(unsafe.Sizeof(*s.Truncated))
	}
	return n
}

// actorSize estimates the memory an actor record holds (0 for nil).
func actorSize(a *events.Actor) int {
	if a == nil {
		return 0
	}
	return pointerBytes + int(unsafe.Sizeof(*a)) + len(a.Subject) + len(a.Method) + len(a.KeyID)
}
