package events

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
)

// Names and ids. Workflow names, queue names and execution ids become
// tokens of NATS subjects (package bus builds the subjects), so the rules
// keep them to letters, digits, '-' and '_'; the rules themselves know
// nothing of NATS.

// token reports whether s is 1 to max bytes of ASCII letters, digits,
// '-', '_' and the bytes of extra, starting with a letter (or also a
// digit, when digitFirst). It is what a regular expression such as
// ^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$ says (names_test.go holds them to
// that), without a regular expression's cost: the dispatcher checks an
// execution's id and workflow name at every message it handles.
func token(s string, max int, digitFirst bool, extra string) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case c >= '0' && c <= '9':
			if i == 0 && !digitFirst {
				return false
			}
		case i > 0 && (c == '-' || c == '_' || strings.IndexByte(extra, c) >= 0):
		default:
			return false
		}
	}
	return true
}

// WorkflowNameRule describes valid workflow names, for error messages.
const WorkflowNameRule = "use 1 to 64 ASCII letters, digits, '-' or '_', starting with a letter"

// ValidWorkflowName reports whether name can be a workflow name: a letter,
// then up to 63 letters, digits, '-' or '_'. Names are subject tokens.
func ValidWorkflowName(name string) bool { return token(name, 64, false, "") }

// StepIDRule describes valid step ids, for error messages.
const StepIDRule = WorkflowNameRule

// ValidStepID reports whether id can be a step's id (or a parallel
// branch's): the rule of workflow names.
func ValidStepID(id string) bool { return token(id, 64, false, "") }

// QueueNameRule describes valid agent queue names, for error messages.
const QueueNameRule = "use 1 to 64 ASCII letters, digits, '-' or '_', starting with a letter or digit"

// ValidQueueName reports whether name can name an agent queue (a subject
// token of jf.tasks.<queue> and jf.results.<queue>.<execution>).
func ValidQueueName(name string) bool { return token(name, 64, true, "") }

// SignalNameRule describes valid signal names, for error messages.
const SignalNameRule = "use 1 to 64 ASCII letters, digits, '-' or '_', starting with a letter or digit"

// ValidSignalName reports whether name can name a signal.
func ValidSignalName(name string) bool { return token(name, 64, true, "") }

// ExecutionIDRule describes valid execution ids, for error messages.
const ExecutionIDRule = "use 1 to 128 ASCII letters, digits, '-' or '_', starting with a letter or digit"

// ValidExecutionID reports whether id can be an execution id: 1 to 128
// letters, digits, '-' or '_', not starting with '-' or '_'.
func ValidExecutionID(id string) bool { return token(id, 128, true, "") }

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

// ChildExecutionID is the id of the child execution that attempt attempt
// of the step instance at path (a workflow step with child: true) of
// execution parent starts: the parent's id and the step's own id,
// readable (other characters than letters, digits, '-' and '_' become
// '_'), then a hash of the parent, the path and the attempt (so that two
// parents, instances or attempts never share a child), cut before the
// hash to fit an execution id.
func ChildExecutionID(parent, path string, attempt int) string {
	sum := sha256.Sum256([]byte(parent + "\x00" + path + "\x00" + strconv.Itoa(attempt)))
	h := "-" + hex.EncodeToString(sum[:8])
	own := path[strings.LastIndexByte(path, '/')+1:]
	if i := strings.IndexAny(own, "~@["); i > 0 {
		own = own[:i] // the step's id, without its round, attempt or item
	}
	name := []byte(parent + "-" + own)
	for i, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			name[i] = '_'
		}
	}
	if len(name)+len(h) > 128 {
		name = name[:128-len(h)]
	}
	return string(name) + h
}

// TaskID is the task (and idempotency) id of a step attempt.
func TaskID(executionID, stepID string, attempt int) string {
	return fmt.Sprintf("%s.%s.%d", executionID, stepID, attempt)
}

// TaskHash names a task in a subject token (a task id holds a step id,
// which may not fit one): "t" and a hash of the task id.
func TaskHash(taskID string) string { return "t" + shortHash(taskID) }

func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:12])
}
