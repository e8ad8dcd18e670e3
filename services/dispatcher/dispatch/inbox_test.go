package dispatch_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/dispatcher/dispatch"
)

// TestInboxCommandsAreCheckedAsPublished: a command the intake put in the
// inbox (another dispatcher's intake, for a partition this one holds) is
// the command as its sender published it, and is checked again as if it
// had arrived on the subject the intake names: its body byte for byte (a
// misspelt member is still refused), its type for that subject, and who
// may have sent it (an actor only on the api's subjects).
func TestInboxCommandsAreCheckedAsPublished(t *testing.T) {
	t.Parallel()
	b := setup(t)
	runDispatcher(t, b.js, dispatch.Config{Workers: 2})
	b.register(t, "wf", "one")

	inbox := func(id, subject, typ, data string) string {
		m := nats.NewMsg(bus.InboxSubject(partition.Of(id, partition.DefaultCount), id))
		for k, v := range map[string]string{"ce-specversion": "1.0", "ce-id": "in-" + id, "ce-source": "urn:test:inbox",
			"ce-type": typ, "content-type": "application/json"} {
			m.Header.Set(k, v)
		}
		if subject != "" {
			m.Header.Set(dispatch.CommandSubjectHeader, subject)
		}
		m.Data = []byte(data)
		_, err := b.js.PublishMsg(t.Context(), m)
		require.NoError(t, err)
		return events.CommandKey("urn:test:inbox", "in-"+id)
	}

	rej := readRejection(t, b.js, inbox("typo", bus.SubjectStart, string(events.TypeStartExecution),
		`{"workflow":"wf","execution_id":"typo","inptu":{}}`))
	require.Contains(t, rej.Reason, "inptu", "the body as sent: an unknown member is refused")

	rej = readRejection(t, b.js, inbox("wrong", bus.SubjectSignal, string(events.TypeStartExecution),
		`{"workflow":"wf","execution_id":"wrong"}`))
	require.Contains(t, rej.Reason, "that subject takes "+string(events.TypeSignalExecution)+" only")

	rej = readRejection(t, b.js, inbox("forged", bus.SubjectStart, string(events.TypeStartExecution),
		`{"workflow":"wf","execution_id":"forged","actor":{"subject":"alice","method":"api-key","key_id":"0123456789abcdef"}}`))
	require.Contains(t, rej.Reason, "actor is set by the api")

	// A well-formed one starts, recorded as from the client role.
	inbox("fine", bus.SubjectStart, string(events.TypeStartExecution), `{"workflow":"wf","execution_id":"fine"}`)
	_, evs := waitStatus(t, b.js, "wf", "fine", projections.StatusStarted)
	started, ok := evs[0].Data.(*events.ExecutionStarted)
	require.True(t, ok)
	require.Equal(t, &events.Actor{Subject: "client", Method: events.ActorNATS}, started.Actor)
}
