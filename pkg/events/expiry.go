package events

// Expiry of finished executions under their retention rule
// (docs/retention.md). The janitor decides which finished executions a
// rule no longer keeps, but the dispatcher stays the only writer of
// histories: the janitor asks with an ExpireExecution command naming the
// history's last sequence as it saw it, and the dispatcher appends
// ExecutionExpired only if the history is still there, so an operator's
// resume and an expiry can never both win. The janitor deletes a history
// only once its last event is ExecutionExpired.
const (
	// TypeExecutionExpired records that a finished execution expired under
	// its retention rule: nothing may follow it, and the janitor deletes
	// the history, results and read model.
	TypeExecutionExpired Type = "io.jetflow.execution.expired"
	// TypeExpireExecution is the janitor's command asking the dispatcher to
	// record an execution's expiry.
	TypeExpireExecution Type = "io.jetflow.execution.expire"
)

// CodeExpired rejects a command for an execution that expired under its
// retention rule (its history is deleted, or about to be).
const CodeExpired = "expired"

// ExpireExecution asks the dispatcher to record that an execution expired.
type ExpireExecution struct {
	ExecutionID string `json:"execution_id"`
	Workflow    string `json:"workflow"`
	// LastSeq is the stream sequence of the history's last event when the
	// janitor decided: if the history has moved since (a resume), the
	// execution is kept and the janitor decides again.
	LastSeq uint64 `json:"last_seq"`
	// Rule is the retention rule that no longer keeps the execution, as
	// the janitor resolved it, and Group the group it was counted in.
	Rule  string `json:"rule"`
	Group string `json:"group,omitempty"`
}

// ExecutionExpired records an execution's expiry.
type ExecutionExpired struct {
	Rule  string `json:"rule"`
	Group string `json:"group,omitempty"`
	// RequestedBy is the source of the expire command (the janitor).
	RequestedBy string `json:"requested_by,omitempty"`
}

func (*ExpireExecution) EventType() Type  { return TypeExpireExecution }
func (*ExecutionExpired) EventType() Type { return TypeExecutionExpired }
func (*ExpireExecution) payload()         {}
func (*ExecutionExpired) payload()        {}
