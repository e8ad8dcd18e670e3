package bus

// Reports handed straight to a dispatcher (docs/adr/0009).
//
// An agent may hand a report about a task straight to the dispatcher that
// holds the task's execution's partition: a core NATS request on
// DirectResultSubject, carrying the same CloudEvent it would store on the
// results stream. The dispatcher handles it as a report its partition's
// consumer delivered: it records it in the history (or finds it stale),
// and then answers DirectRecorded; the agent then acknowledges the task.
// Any other outcome (no dispatcher listens, no answer in time, an answer
// that refuses) leaves the agent to store the report on the results
// stream and then acknowledge the task, as it would without direct
// reports: so a task leaves its queue only once its report is in the
// history or on the results stream.
const (
	// DirectOutcomeHeader, on a dispatcher's answer, says what became of
	// the report: DirectRecorded, or DirectRefused.
	DirectOutcomeHeader = "Jetflow-Outcome"
	// DirectRecorded: the report is handled (recorded in the history, or
	// recognised as stale, as a stored one would be).
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
	// DirectReportHeader, on an answer that says recorded, is the
	// CloudEvent id of the report it answers: an agent takes no answer
	// for another report as its own.
	DirectReportHeader = "Jetflow-Report"
	// DirectWaitHeader, on a report handed straight to a dispatcher, is
	// how long its agent waits for the answer, in milliseconds: a report
	// still waiting for its turn at the dispatcher after that is not
	// handled (its agent has stored it), but refused.
	DirectWaitHeader = "Jetflow-Direct-Wait"
)

// DirectQueueGroup is the queue group dispatchers subscribe to the direct
// reports of a partition in: while a partition moves, its old and new
// holders may both listen for a moment, and only one of them gets each
// report.
const DirectQueueGroup = "jetflow-dispatchers"
