package events

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// Check reports the first problem of a start command that shows without
// the workflow registry: the member at fault ("" if none) and what to fix.
// The api checks a start with it before publishing the command, and the
// dispatcher again when the command arrives (it may come straight from
// NATS); ExecutionID must be set (given, or derived) before.
func (c *StartExecution) Check() (field, msg string) {
	switch {
	case c.Workflow == "":
		return "workflow", "is required"
	case !ValidWorkflowName(c.Workflow):
		return "workflow", fmt.Sprintf("%q is not a valid workflow name: %s", c.Workflow, WorkflowNameRule)
	case c.Version < 0:
		return "version", "must be 0 (latest) or a positive version"
	case !ValidExecutionID(c.ExecutionID):
		return "execution_id", fmt.Sprintf("%q is not a valid execution id: %s", c.ExecutionID, ExecutionIDRule)
	}
	if t := bytes.TrimSpace(c.Input); len(t) > 0 && string(t) != "null" {
		var obj map[string]json.RawMessage
		if t[0] != '{' || json.Unmarshal(t, &obj) != nil {
			return "input", "must be a JSON object"
		}
	}
	return "", ""
}

// Digest is a hash of what a start command asks for: the workflow, the
// version, the input (as JSON values: member order and spacing do not
// count) and the options. Two commands under one key (a CloudEvent's source
// and id, an Idempotency-Key) are the same request only if their digests
// are equal; the claim of an execution id keeps it.
func (c *StartExecution) Digest() string {
	var input any
	if t := bytes.TrimSpace(c.Input); len(t) > 0 {
		if json.Unmarshal(t, &input) != nil {
			input = string(t)
		}
	}
	if m, ok := input.(map[string]any); ok && len(m) == 0 {
		input = nil // {} and no input are the same request
	}
	b, _ := json.Marshal(struct {
		Workflow      string `json:"workflow"`
		Version       int    `json:"version"`
		Input         any    `json:"input"`
		ExecutionID   string `json:"execution_id"`
		WaitAfterFail bool   `json:"wait_after_fail"`
		DryRun        bool   `json:"dry_run"`
	}{c.Workflow, c.Version, input, c.ExecutionID, c.WaitAfterFail, c.DryRun})
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:16])
}
