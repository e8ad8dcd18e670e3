package events

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
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
	// APICommandsPrefix starts the subjects of the commands the api sends
	// on behalf of authenticated HTTP callers: jf.commands.api.<kind>. Only
	// the api identity may publish there, and only commands published there
	// may carry an [Actor].
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
	// SchedulesPrefix starts the subjects of pending timers: jf.schedules.<timer>.
	SchedulesPrefix = "jf.schedules"

	// StreamTasks is the work-queue stream of operations, one subject per agent queue.
	StreamTasks = "JF_TASKS"
	// TasksPrefix starts every task subject: jf.tasks.<queue>.
	TasksPrefix = "jf.tasks"

	// StreamResults holds agents' reports. Agents publish on
	// jf.results.<queue>.<execution>; the stream stores each report on
	// jf.results.<queue>.<partition>.<execution> (a subject transform), so
	// that each dispatcher partition has its own consumer.
	StreamResults = "JF_RESULTS"
	// ResultsPrefix starts every result subject.
	ResultsPrefix = "jf.results"

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
	// BucketDispatchers holds the dispatchers' membership and their
	// partitions' leases (keys with a time to live), and the number of
	// partitions (package partition).
	BucketDispatchers = "JF_DISPATCHERS"
	// BucketAPIKeys holds the api's keys, one per key id: their names,
	// scopes, namespaces and the SHA-256 hash of the token (never the
	// token). Only the api reads and writes it.
	BucketAPIKeys = "JF_API_KEYS"
)

var (
	nameRe = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_-]{0,63}$`)
	idRe   = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$`)
)

// WorkflowNameRule describes valid workflow names, for error messages.
const WorkflowNameRule = "use 1 to 64 letters, digits, '-' or '_', starting with a letter"

// ValidWorkflowName reports whether name can be a workflow name: a letter,
// then up to 63 letters, digits, '-' or '_'. Names are subject tokens.
func ValidWorkflowName(name string) bool { return nameRe.MatchString(name) }

// QueueNameRule describes valid agent queue names, for error messages.
const QueueNameRule = "use 1 to 64 letters, digits, '-' or '_', starting with a letter or digit"

var queueRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// ValidQueueName reports whether name can name an agent queue (a subject
// token of jf.tasks.<queue> and jf.results.<queue>.<execution>).
func ValidQueueName(name string) bool { return queueRe.MatchString(name) }

// SignalNameRule describes valid signal names, for error messages.
const SignalNameRule = "use 1 to 64 letters, digits, '-' or '_', starting with a letter or digit"

var signalRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// ValidSignalName reports whether name can name a signal.
func ValidSignalName(name string) bool { return signalRe.MatchString(name) }

// ExecutionIDRule describes valid execution ids, for error messages.
const ExecutionIDRule = "use 1 to 128 letters, digits, '-' or '_', starting with a letter or digit"

// ValidExecutionID reports whether id can be an execution id: 1 to 128
// letters, digits, '-' or '_', not starting with '-' or '_'.
func ValidExecutionID(id string) bool { return idRe.MatchString(id) }

// ExecutionSubject is the history subject of one execution.
func ExecutionSubject(workflow, id string) string {
	return EventsPrefix + "." + workflow + "." + id
}

// ParseExecutionSubject reads the workflow and execution id out of an
// execution's history subject (ok false for any other subject).
func ParseExecutionSubject(subject string) (workflow, id string, ok bool) {
	parts := strings.Split(subject, ".")
	if len(parts) != 4 || subject != ExecutionSubject(parts[2], parts[3]) || !ValidWorkflowName(parts[2]) || !ValidExecutionID(parts[3]) {
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

// InboxSubject is where the intake puts a checked command for an
// execution: jf.inbox.<partition>.<execution>.
func InboxSubject(partition int, executionID string) string {
	return InboxPrefix + "." + strconv.Itoa(partition) + "." + executionID
}

// ScheduleSubject holds a pending timer.
func ScheduleSubject(timerID string) string { return SchedulesPrefix + "." + timerID }

// TaskSubject is the work-queue subject of an agent queue.
func TaskSubject(queue string) string { return TasksPrefix + "." + queue }

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

// RejectionSubject is where the rejection of a command is published.
func RejectionSubject(commandKey string) string {
	return RejectionsPrefix + "." + shortHash(commandKey)
}

// CommandKey identifies a command by its CloudEvent source and id.
func CommandKey(source, id string) string { return source + "#" + id }

// CommandMsgID is the Nats-Msg-Id of a command: a hash of its command key,
// since a CloudEvent is identified by source and id together (two sources
// may use the same id).
func CommandMsgID(commandKey string) string { return "cmd-" + shortHash(commandKey) }

// SignalID identifies a signal by the command that sent it, so that the
// same signal command delivered twice is recorded once.
func SignalID(commandKey string) string { return "s" + shortHash(commandKey) }

// DerivedExecutionID is the execution id of a start command that names
// none: a stable hash of the command key.
func DerivedExecutionID(commandKey string) string { return "ce-" + shortHash(commandKey) }

// TaskID is the task (and idempotency) id of a step attempt.
func TaskID(executionID, stepID string, attempt int) string {
	return fmt.Sprintf("%s.%s.%d", executionID, stepID, attempt)
}

func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:12])
}
