package bus

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"jetflow.dev/pkg/events"
)

// Streams, subjects and buckets. docs/subjects.md describes them for users.
const (
	// StreamEvents holds every execution's history, one subject per execution.
	StreamEvents = "JF_EVENTS"
	// EventsPrefix starts every history subject: jf.events.<workflow>.<execution>.
	EventsPrefix = "jf.events"

	// StreamCommands holds commands (start, reconcile).
	StreamCommands = "JF_COMMANDS"
	// CommandsPrefix starts every command subject.
	CommandsPrefix = "jf.commands"
	// SubjectStart is where start commands are published.
	SubjectStart = "jf.commands.start"
	// SubjectReconcile is where reconcile commands are published.
	SubjectReconcile = "jf.commands.reconcile"
	// SubjectSignal is where signal commands are published.
	SubjectSignal = "jf.commands.signal"
	// SubjectAction is where operators' actions (cancel, force-cancel, kill) are published.
	SubjectAction = "jf.commands.action"
	// SubjectExpire is where expire commands are published.
	SubjectExpire = "jf.commands.expire"
	// SubjectClearLock is where clear-lock commands are published.
	SubjectClearLock = "jf.commands.lock"
	// APICommandsPrefix starts the subjects of the commands the api sends
	// on behalf of authenticated HTTP callers: jf.commands.api.<kind>. Only
	// the api identity may publish there, and only commands published there
	// may carry an [events.Actor].
	APICommandsPrefix = "jf.commands.api"
	// SubjectAPIStart, SubjectAPISignal, SubjectAPIAction and
	// SubjectAPIClearLock are the api's start, signal, action and
	// clear-lock command subjects.
	SubjectAPIStart     = "jf.commands.api.start"
	SubjectAPISignal    = "jf.commands.api.signal"
	SubjectAPIAction    = "jf.commands.api.action"
	SubjectAPIClearLock = "jf.commands.api.lock"
	// StreamTimers holds durable timers: pending ones as JetStream message
	// schedules on jf.schedules.<timer>, fired ones on jf.timers.<execution>
	// until the dispatcher has handled them (work-queue retention, no age
	// limit: a timer waits as long as it must).
	StreamTimers = "JF_TIMERS"
	// TimersPrefix starts the subjects timers fire on: jf.timers.<execution>.
	TimersPrefix = "jf.timers"
	// NoticesPrefix starts the subjects long timers' notices fire on:
	// jf.timers.notices.<partition>.<execution> (docs/adr/0019). No
	// consumer of fired timers matches them.
	NoticesPrefix = TimersPrefix + ".notices"
	// SchedulesPrefix starts the subjects of pending timers: jf.schedules.<timer>.
	SchedulesPrefix = "jf.schedules"

	// StreamTasks is the work-queue stream of operations, one subject per agent queue.
	StreamTasks = "JF_TASKS"
	// TasksPrefix starts every task subject: jf.tasks.<queue>.
	TasksPrefix = "jf.tasks"
	// TasksKeeperSubject holds the tasks stream's keepers: empty messages
	// that no consumer takes and that expire by themselves, published by
	// dispatchers beside their tasks so that an agent's acknowledgement
	// seldom empties the stream's last block (the file store then replaces
	// the block, a file creation; docs/benchmarks.md, "Keepers"). Queue
	// names begin with a letter or a digit: it is never a queue's subject.
	TasksKeeperSubject = TasksPrefix + "._keep"

	// StreamResults holds agents' reports. Agents publish on
	// jf.results.<queue>.<execution>; the stream stores each report on
	// jf.results.<queue>.<partition>.<execution> (a subject transform), so
	// that each dispatcher partition has its own consumer.
	StreamResults = "JF_RESULTS"
	// ResultsPrefix starts every result subject.
	ResultsPrefix = "jf.results"

	// DirectPrefix starts the subjects on which agents hand a report
	// straight to the dispatcher holding its execution's partition, as a
	// core NATS request: jf.direct.<queue>.<partition>.<execution>. No
	// stream stores them: the dispatcher records the report in the
	// history and answers on AnswersPrefix; an agent that gets no such
	// answer stores the report on the results stream instead
	// (docs/adr/0009).
	DirectPrefix = "jf.direct"
	// AnswersPrefix starts the subjects dispatchers answer direct reports
	// on: jf.answers.<agent's inbox prefix>.<...>, each agent's own to
	// subscribe to. A direct report whose reply subject is anywhere else
	// gets no answer: the reply subject is the agent's to choose, and the
	// dispatcher publishes only where its permissions let it.
	AnswersPrefix = "jf.answers"

	// StreamKills holds kill notices for agents: jf.kills.<execution>, the
	// last one per execution, for a day.
	StreamKills = "JF_KILLS"
	// KillsPrefix starts every kill notice subject.
	KillsPrefix = "jf.kills"

	// StreamInbox holds the commands the dispatchers' intake has checked,
	// on their execution's partition: jf.inbox.<partition>.<execution>
	// (work-queue retention). Only dispatchers publish there.
	StreamInbox = "JF_INBOX"
	// InboxPrefix starts every inbox subject.
	InboxPrefix = "jf.inbox"

	// StreamRejections holds the reasons commands were rejected: jf.rejections.<key>.
	StreamRejections = "JF_REJECTIONS"
	// RejectionsPrefix starts every rejection subject.
	RejectionsPrefix = "jf.rejections"

	// BucketDefinitions holds workflow definitions: def.<name>.<version> and latest.<name>.
	BucketDefinitions = "JF_DEFINITIONS"
	// BucketExecutionIDs registers every execution id ever used, with the
	// command that claimed it (ids are unique forever).
	BucketExecutionIDs = "JF_EXECUTION_IDS"
	// BucketExecutions holds the execution read models (a projection).
	BucketExecutions = "JF_EXECUTIONS"
	// BucketLocks holds one key per lock: its holders, its waiters in the
	// order they asked, and its limit (see [events.LockNameRule] for the key).
	BucketLocks = "JF_LOCKS"
	// BucketDispatchers holds the dispatchers' membership and their
	// partitions' leases (keys with a time to live), and the number of
	// partitions (package partition).
	BucketDispatchers = "JF_DISPATCHERS"
	// BucketAPIKeys holds the api's keys, one per key id: their names,
	// scopes, namespaces and the SHA-256 hash of the token (never the
	// token). Only the api reads and writes it.
	BucketAPIKeys = "JF_API_KEYS"
)

// ExecutionSubject is the history subject of one execution.
func ExecutionSubject(workflow, id string) string {
	return EventsPrefix + "." + workflow + "." + id
}

// ParseExecutionSubject reads the workflow and execution id out of an
// execution's history subject (ok false for any other subject).
func ParseExecutionSubject(subject string) (workflow, id string, ok bool) {
	parts := strings.Split(subject, ".")
	if len(parts) != 4 || subject != ExecutionSubject(parts[2], parts[3]) || !events.ValidWorkflowName(parts[2]) || !events.ValidExecutionID(parts[3]) {
		return "", "", false
	}
	return parts[2], parts[3], true
}

// WorkflowSubjects is the subject filter for all executions of a workflow.
func WorkflowSubjects(workflow string) string { return EventsPrefix + "." + workflow + ".*" }

// ExecutionFilter matches one execution's history without knowing its workflow.
func ExecutionFilter(id string) string { return EventsPrefix + ".*." + id }

// TimerSubject is where an execution's timers fired before partitions
// (jf.timers.<execution>); dispatchers still take the ones left there.
func TimerSubject(executionID string) string { return TimersPrefix + "." + executionID }

// PartitionTimerSubject is where an execution's timers fire:
// jf.timers.<partition>.<execution>.
func PartitionTimerSubject(partition int, executionID string) string {
	return TimersPrefix + "." + strconv.Itoa(partition) + "." + executionID
}

// PartitionNoticeSubject is where a long timer's notice fires
// (docs/adr/0019): jf.timers.notices.<partition>.<execution>, read by the
// partition's notices consumer only. Dispatchers older than it never see
// one.
func PartitionNoticeSubject(partition int, executionID string) string {
	return NoticesPrefix + "." + strconv.Itoa(partition) + "." + executionID
}

// InboxSubject is where the intake puts a checked command for an
// execution: jf.inbox.<partition>.<execution>.
func InboxSubject(partition int, executionID string) string {
	return InboxPrefix + "." + strconv.Itoa(partition) + "." + executionID
}

// ScheduleSubject holds a pending timer.
func ScheduleSubject(timerID string) string { return SchedulesPrefix + "." + timerID }

// BucketStream is the stream a KV bucket keeps its entries in.
func BucketStream(bucket string) string { return "KV_" + bucket }

// BucketSubject is the subject of key's entries in a KV bucket; with
// key ">", every key's.
func BucketSubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// TaskSubject is the work-queue subject of an agent queue.
func TaskSubject(queue string) string { return TasksPrefix + "." + queue }

// BulkTaskSubject is the bulk lane of an agent queue: where the tasks of
// an execution that already has many on the queue go, so that they do not
// queue ahead of other executions' tasks (docs/reliability.md, "Fair
// sharing"). Queue names have no dots, so jf.tasks.<queue>.bulk is never
// another queue's subject.
func BulkTaskSubject(queue string) string { return TaskSubject(queue) + ".bulk" }

// ResultSubject is where agents of queue report about an execution's
// tasks. The queue is part of the subject so that NATS permissions can let
// an agent report for its queues only, and the dispatcher records a report
// only when it came on the queue of the step it is about.
func ResultSubject(queue, executionID string) string {
	return ResultsPrefix + "." + queue + "." + executionID
}

// StoredResultSubject is the subject the results stream stores a report
// published on ResultSubject(queue, executionID) under.
func StoredResultSubject(queue string, partition int, executionID string) string {
	return ResultsPrefix + "." + queue + "." + strconv.Itoa(partition) + "." + executionID
}

// DirectResultSubject is where an agent of queue hands a report about an
// execution of partition straight to its dispatcher.
func DirectResultSubject(queue string, partition int, executionID string) string {
	return DirectPrefix + "." + queue + "." + strconv.Itoa(partition) + "." + executionID
}

// AnswerSubjects matches the answers to the direct reports of the agent
// whose inbox prefix is inbox (auth.Inbox).
func AnswerSubjects(inbox string) string { return AnswersPrefix + "." + inbox + ".>" }

// DirectQueueSubjects matches the direct reports of queue's agents, about
// any execution.
func DirectQueueSubjects(queue string) string { return DirectPrefix + "." + queue + ".*.*" }

// DirectResults matches the reports handed straight to the holder of a
// partition, from any queue.
func DirectResults(partition int) string {
	return DirectPrefix + ".*." + strconv.Itoa(partition) + ".*"
}

// ExecutionResults matches the stored reports about one execution, from
// any queue.
func ExecutionResults(executionID string) string { return ResultsPrefix + ".*.*." + executionID }

// ExecutionResultsBefore matches the reports about one execution stored
// before partitions (jf.results.<queue>.<execution>): readers that must
// see every report read both filters.
func ExecutionResultsBefore(executionID string) string { return ResultsPrefix + ".*." + executionID }

// QueueResults matches the stored reports about one execution from one queue.
func QueueResults(queue, executionID string) string {
	return ResultsPrefix + "." + queue + ".*." + executionID
}

// KillSubject is where the kill notice of an execution is published.
func KillSubject(executionID string) string { return KillsPrefix + "." + executionID }

// TaskKillSubject is where the notice terminating one task of an
// execution is published: jf.kills.<execution>.<hash of the task id>
// (a task id holds a step id, which may not fit a subject token).
func TaskKillSubject(executionID, taskID string) string {
	return KillSubject(executionID) + "." + events.TaskHash(taskID)
}

// RejectionSubject is where the rejection of a command is published.
func RejectionSubject(commandKey string) string {
	return RejectionsPrefix + "." + shortHash(commandKey)
}

// shortHash is the hash of a command key in a rejection's subject: the
// same as in the command ids of package events (events.CommandMsgID), so
// that rejections stored by an earlier version are found.
func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:12])
}
