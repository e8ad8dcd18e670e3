package projections

import "time"

// HibernateAfter is how far ahead the timers of an execution that waits
// for nothing else must be due for caches to let its state go (Dormant):
// a sleep of a minute or more costs a read when it wakes, not its state's
// memory meanwhile; shorter ones (retries' backoffs, brief waits) stay
// cached. The dispatcher and the projector both use it.
const HibernateAfter = time.Minute

// Dormant reports whether s is an execution that waits, for at least d
// after its last event, for nothing but its timers: it runs, every step
// of it that has not ended is a sleep or wait step waiting (or an
// operation waiting for its retry's backoff) until at least d after the
// event last folded, and no operation is pending or with an agent. A
// signal may still wake a wait early. Caches let such a state go (a
// sleeping execution holds no memory: it is read again from its history
// when it wakes).
//
// It is a pure function of s: the time it measures from is the last
// event's, not a clock.
func Dormant(s *Execution, d time.Duration) bool {
	if s.Status != StatusStarted || s.UpdatedAt.IsZero() {
		return false
	}
	waits := false
	for i := range s.Steps {
		switch st := &s.Steps[i]; st.Status {
		case OpWaiting, OpRescheduled:
			if st.WaitUntil.IsZero() || st.WaitUntil.Sub(s.UpdatedAt) < d {
				return false // no timer, or one due soon
			}
			waits = true
		case OpPending, OpSending, OpSent, OpStarted:
			return false
		}
	}
	return waits
}
