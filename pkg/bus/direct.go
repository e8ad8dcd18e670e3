package bus

import (
	"fmt"
	"strconv"
	"strings"
)

// Reports handed straight to a dispatcher (docs/adr/0009).
//
// An agent may hand a report about a task straight to the dispatcher that
// holds the task's execution's partition: a core NATS request on
// DirectResultSubject, carrying the same CloudEvent it would store on the
// results stream. The dispatcher handles it as a report its partition's
// consumer delivered: it records it in the history (or finds it stale),
// and then, for a final report, acknowledges the task's delivery itself,
// named by DirectTaskAckHeader, and waits for JetStream to confirm it.
// Only then does it answer DirectRecorded. Any other outcome (no
// dispatcher listens, no answer in time, an answer that refuses) leaves
// the agent to store the report on the results stream and acknowledge the
// task itself, as it would without direct reports: so a task leaves its
// queue only once its report is in the history or on the results stream.
const (
	// DirectTaskAckHeader, on a final report handed straight to a
	// dispatcher, is the JetStream acknowledgement subject of the task's
	// delivery (its message's reply subject).
	DirectTaskAckHeader = "Jetflow-Task-Ack"
	// DirectOutcomeHeader, on a dispatcher's answer, says what became of
	// the report: DirectRecorded, or DirectRefused.
	DirectOutcomeHeader = "Jetflow-Outcome"
	// DirectRecorded: the report is handled (recorded in the history, or
	// recognised as stale, as a stored one would be) and the task named
	// by DirectTaskAckHeader, if any, acknowledged.
	DirectRecorded = "recorded"
	// DirectRefused: the dispatcher did not handle the report (it is not
	// the partition's holder any more, or handling it failed): store it.
	DirectRefused = "refused"
	// DirectAttemptHeader, on the answer to an operation's started report
	// of a task delivered again, is DirectAttemptOver when the task's
	// attempt is no longer in flight (its result is recorded, the step
	// went on, or the execution ended): the agent then acknowledges the
	// task without running the operation again.
	DirectAttemptHeader = "Jetflow-Attempt"
	// DirectAttemptOver is DirectAttemptHeader's one value.
	DirectAttemptOver = "over"
)

// DirectQueueGroup is the queue group dispatchers subscribe to the direct
// reports of a partition in: while a partition moves, its old and new
// holders may both listen for a moment, and only one of them gets each
// report.
const DirectQueueGroup = "jetflow-dispatchers"

// TaskAck is what a task's acknowledgement subject names: the consumer
// whose delivery it acknowledges and the task's sequence in the tasks
// stream.
type TaskAck struct {
	Consumer string
	Seq      uint64
}

// ParseTaskAck reads a JetStream acknowledgement subject of a delivery
// from the tasks stream; anything else is an error. Both forms are read:
// $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>,
// and the newer one with a domain and an account hash after $JS.ACK and a
// token at the end.
func ParseTaskAck(subject string) (TaskAck, error) {
	bad := func(why string) (TaskAck, error) {
		return TaskAck{}, fmt.Errorf("%q is not the acknowledgement subject of a task's delivery: %s", subject, why)
	}
	rest, ok := strings.CutPrefix(subject, "$JS.ACK.")
	if !ok {
		return bad("it does not begin with $JS.ACK.")
	}
	tokens := strings.Split(rest, ".")
	switch {
	case len(tokens) == 7:
	case len(tokens) >= 9:
		tokens = tokens[2:] // the domain and the account hash
	default:
		return bad("it has neither 9 nor at least 11 tokens")
	}
	if tokens[0] != StreamTasks {
		return bad("it is not of " + StreamTasks)
	}
	seq, err := strconv.ParseUint(tokens[3], 10, 64)
	if err != nil || seq == 0 || tokens[1] == "" {
		return bad("no consumer or stream sequence")
	}
	return TaskAck{Consumer: tokens[1], Seq: seq}, nil
}
