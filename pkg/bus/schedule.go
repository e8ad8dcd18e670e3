package bus

import (
	"time"

	"github.com/nats-io/nats.go"

	"jetflow.dev/pkg/events"
)

// ScheduleMsg is the message that sets a pending timer's schedule in
// StreamTimers: ev (the timer's io.jetflow.timer.fire, or its
// io.jetflow.timer.notice) on jf.schedules.<timerID>, which nats-server
// fires into target at at, replacing any schedule the subject held.
//
// The time is set with nanoseconds: the client's helper truncates it to
// the second, and the timer would fire early.
func ScheduleMsg(timerID string, ev events.Event, at time.Time, target string) (*nats.Msg, error) {
	msg, err := Encode(ScheduleSubject(timerID), ev)
	if err != nil {
		return nil, err
	}
	msg.Header.Set("Nats-Schedule", "@at "+at.UTC().Format(time.RFC3339Nano))
	msg.Header.Set("Nats-Schedule-Target", target)
	return msg, nil
}
