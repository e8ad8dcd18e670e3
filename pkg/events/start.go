package events

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

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
