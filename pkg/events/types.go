package events

// Type is a CloudEvents `type` attribute. History events are past-tense
// facts; commands are imperative.
type Type string

// History events, appended by the dispatcher to an execution's subject.
const (
	// TypeExecutionStarted records an accepted start command, the pinned
	// definition and the immutable input.
	TypeExecutionStarted Type = "io.jetflow.execution.started"
	// TypeExecutionSucceeded records that every step finished successfully.
	TypeExecutionSucceeded Type = "io.jetflow.execution.succeeded"
	// TypeExecutionFailed records that the execution ended with an error.
	TypeExecutionFailed Type = "io.jetflow.execution.failed"
	// TypeExecutionCancelling records a cancel request: the execution stops
	// at the next step boundary, once its running operations finished.
	TypeExecutionCancelling Type = "io.jetflow.execution.cancelling"
	// TypeExecutionCancelled records that the execution was cancelled (by a
	// cancel once nothing ran any more, or at once by a force-cancel).
	TypeExecutionCancelled Type = "io.jetflow.execution.cancelled"
	// TypeExecutionResumed records that an operator resumed a started,
	// failed or cancelled execution: steps to run again were reset and a
	// new execution token issued.
	TypeExecutionResumed Type = "io.jetflow.execution.resumed"
	// TypeDefinitionChanged records that a resume, force-resume or replay
	// moved the execution to another version of its workflow: the steps
	// are matched by id, and what follows runs the new version.
	TypeDefinitionChanged Type = "io.jetflow.execution.definition_changed"
	// TypeCompensationStarted, TypeCompensationFinished and
	// TypeCompensationFailed record an execution's compensation (the
	// saga pattern): the compensate steps of the steps that succeeded, in
	// reverse order of completion.
	TypeCompensationStarted  Type = "io.jetflow.compensation.started"
	TypeCompensationFinished Type = "io.jetflow.compensation.finished"
	TypeCompensationFailed   Type = "io.jetflow.compensation.failed"
	// TypeExecutionReplayed records a replay (Brooklyn's): the execution
	// runs again from a replay point or resumes at its last incomplete
	// step, with the variables as they were there and a new token.
	TypeExecutionReplayed Type = "io.jetflow.execution.replayed"
	// TypeExecutionSuspended records that an execution started with
	// wait_after_fail failed: it waits for an operator to resume (or
	// cancel) it instead of ending.
	TypeExecutionSuspended Type = "io.jetflow.execution.suspended"
	// TypeResultIgnored records an agent's report that changed nothing: it
	// carried a stale execution token or was about another attempt.
	TypeResultIgnored Type = "io.jetflow.result.ignored"
	// TypeResultAfterEnd records what became of an operation that was
	// with the agents when its execution ended (a kill terminated it, it
	// finished after a force-cancel, an agent refused its task): its final
	// report, which arrived after the end and changes nothing.
	TypeResultAfterEnd Type = "io.jetflow.result.after_end"
	// TypeStepScheduled records that a step's operation is pending.
	TypeStepScheduled Type = "io.jetflow.step.scheduled"
	// TypeStepSending records that the dispatcher is about to publish the task.
	TypeStepSending Type = "io.jetflow.step.sending"
	// TypeStepDispatched records a step's schedule and its sending in one
	// event: the step is pending, then sending (its task about to be
	// published), at the same time.
	TypeStepDispatched Type = "io.jetflow.step.dispatched"
	// TypeStepSent records that the task was stored in the tasks stream.
	TypeStepSent Type = "io.jetflow.step.sent"
	// TypeStepStarted records that an agent began the operation.
	TypeStepStarted Type = "io.jetflow.step.started"
	// TypeStepChildStarted records that a workflow step with child: true
	// started its child execution (the start is published first, with an
	// id derived from the step's attempt): the step waits for its end.
	TypeStepChildStarted Type = "io.jetflow.step.child_started"
	// TypeStepSucceeded records the operation's successful result.
	TypeStepSucceeded Type = "io.jetflow.step.succeeded"
	// TypeStepFailed records the operation's failure.
	TypeStepFailed Type = "io.jetflow.step.failed"
	// TypeStepSkipped records that a step's condition was false.
	TypeStepSkipped Type = "io.jetflow.step.skipped"
	// TypeStepWaiting records that a sleep or wait step is waiting for a
	// timer or a signal; no process holds the execution meanwhile.
	TypeStepWaiting Type = "io.jetflow.step.waiting"
	// TypeStepRescheduled records that a failed attempt will be retried
	// when its backoff timer fires.
	TypeStepRescheduled Type = "io.jetflow.step.rescheduled"
	// TypeVariablesSet records workflow variables set by a step.
	TypeVariablesSet Type = "io.jetflow.variables.set"
	// TypeTimerArmed records a durable timer stored in JetStream.
	TypeTimerArmed Type = "io.jetflow.timer.armed"
	// TypeTimerFired records that a timer fired and was acted on.
	TypeTimerFired Type = "io.jetflow.timer.fired"
	// TypeSignalReceived records a signal sent to the execution; it is
	// kept until a wait step takes it.
	TypeSignalReceived Type = "io.jetflow.signal.received"
)

// Commands, published by users or the api on the commands stream.
const (
	// TypeStartExecution asks the dispatcher to start an execution.
	TypeStartExecution Type = "io.jetflow.execution.start"
	// TypeSignalExecution sends a named signal with data to an execution.
	TypeSignalExecution Type = "io.jetflow.execution.signal"
	// TypeExecutionAction asks the dispatcher to carry out an operator's
	// action (cancel, force-cancel, kill) on an execution.
	TypeExecutionAction Type = "io.jetflow.execution.action"
	// TypeFireTimer is a durable timer coming due (published by JetStream's
	// message scheduler into the timers stream, JF_TIMERS).
	TypeFireTimer Type = "io.jetflow.timer.fire"
	// TypeTimerNotice is a long timer's notice: the schedule of a timer
	// armed more than two minutes before it is due comes a minute early
	// with this command, which brings the timer into the memory of the
	// dispatcher holding its execution and sets its schedule again for
	// the due time (docs/adr/0019).
	TypeTimerNotice Type = "io.jetflow.timer.notice"
	// TypeReconcileExecution asks the dispatcher to re-evaluate an execution
	// (sent by the janitor for executions that look stuck). It is idempotent.
	TypeReconcileExecution Type = "io.jetflow.execution.reconcile"
)

// Tasks, results and rejections.
const (
	// TypeTask is an operation for an agent, on the tasks stream.
	TypeTask Type = "io.jetflow.task"
	// TypeOperationStarted is an agent's report that it began a task.
	TypeOperationStarted Type = "io.jetflow.operation.started"
	// TypeOperationSucceeded is an agent's report of a successful task.
	TypeOperationSucceeded Type = "io.jetflow.operation.succeeded"
	// TypeOperationFailed is a report of a failed task (from an agent, or
	// from the janitor when a task's agents kept dying).
	TypeOperationFailed Type = "io.jetflow.operation.failed"
	// TypeKillOperations tells agents to terminate an execution's running
	// operations, after a kill.
	TypeKillOperations Type = "io.jetflow.operations.kill"
	// TypeRefuseTasks tells agents that an execution ended with
	// operations still with them: they refuse its tasks of that run (its
	// token) that have not started, and let the running ones finish.
	TypeRefuseTasks Type = "io.jetflow.tasks.refuse"
	// TypeTerminateTask tells agents to terminate one attempt (its step
	// gave up on it: a timeout) and refuse its task if it comes later.
	TypeTerminateTask Type = "io.jetflow.task.terminate"
	// TypeCommandRejected explains why a command changed nothing.
	TypeCommandRejected Type = "io.jetflow.command.rejected"
)

// IsTerminal reports whether t ends an execution.
func (t Type) IsTerminal() bool {
	return t == TypeExecutionSucceeded || t == TypeExecutionFailed || t == TypeExecutionCancelled
}
