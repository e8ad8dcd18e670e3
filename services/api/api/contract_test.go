package api

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/apiv1/apiv1test"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/lock"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/api/access"
)

// The api answers with the types of package apiv1. Where it keeps a thing
// in a type of its own (as stored, with more than the wire), it converts
// it: these tests hold each pair in step, so that a member added to one
// side only, or a conversion that drops a value, fails here.

func TestKeyAsShownIsTheStoredKeyButItsHash(t *testing.T) {
	t.Parallel()
	require.NoError(t, apiv1test.SameMembers(access.Key{}, apiv1.Key{}, []string{"hash"}, []string{"status", "token"}))
	var k access.Key
	require.NoError(t, apiv1test.Fill(&k))
	k.RevokedAt = time.Time{} // still active
	v := viewKey(k, k.CreatedAt)
	require.NoError(t, apiv1test.SameJSON(k, v, "hash", "status"))
	require.Equal(t, "active", v.Status)
	require.Empty(t, v.Token, "shown once, by createKey")
	require.Equal(t, "expired", viewKey(k, k.ExpiresAt).Status)
}

func TestLockEntryAsShownIsAsStored(t *testing.T) {
	t.Parallel()
	require.NoError(t, apiv1test.SameMembers(lock.Entry{}, apiv1.LockEntry{}, nil, nil))
	var e lock.Entry
	require.NoError(t, apiv1test.Fill(&e))
	require.NoError(t, apiv1test.SameJSON(e, lockEntry(e)))
	l := lockInfo("gate", lock.Record{Holders: []lock.Entry{e}})
	require.Equal(t, []apiv1.LockEntry{lockEntry(e)}, l.Holders)
	require.Equal(t, []apiv1.LockEntry{}, l.Waiters, "none is [], not null")
	require.Equal(t, 1, l.Limit)
}

func TestWorkflowAsShownIsAsStored(t *testing.T) {
	t.Parallel()
	require.NoError(t, apiv1test.SameMembers(catalog.Summary{}, apiv1.WorkflowSummary{}, nil, nil))
	var sum catalog.Summary
	require.NoError(t, apiv1test.Fill(&sum))
	require.NoError(t, apiv1test.SameJSON(sum, workflowSummary(sum)))

	require.NoError(t, apiv1test.SameMembers(catalog.Record{}, apiv1.WorkflowVersion{}, nil, []string{"yaml"}))
	var rec catalog.Record
	require.NoError(t, apiv1test.Fill(&rec))
	rec.Definition.Name, rec.Definition.Description = "deploy", "roll out"
	v, err := workflowVersion(rec)
	require.NoError(t, err)
	require.NoError(t, apiv1test.SameJSON(rec, v, "yaml"))
	require.Contains(t, v.YAML, "name: deploy\ndescription: roll out\n")
}

// TestWorkflowYAMLIsTheStoredDefinition: the yaml of a stored version, as
// the catalog gives it back (its JSON decoded), parses into the same
// definition.
func TestWorkflowYAMLIsTheStoredDefinition(t *testing.T) {
	t.Parallel()
	def, err := workflow.Parse([]byte(`
name: deploy
search_attributes: [input.who]
input: {type: object, properties: {who: {type: string}, n: {type: number, maximum: 1.5e3}}}
steps:
  - {id: approve, kind: wait, signal: "yes", timeout: 1h}
  - {id: run, kind: exec, command: sh, args: ["-c", "echo \"${input.who}\": done"], retry: {limit: 3}}
`))
	require.NoError(t, err)
	raw, err := json.Marshal(catalog.Record{Name: "deploy", Version: 1, Definition: def})
	require.NoError(t, err)
	var rec catalog.Record // as stored: numbers in the schema are float64 now
	require.NoError(t, json.Unmarshal(raw, &rec))
	v, err := workflowVersion(rec)
	require.NoError(t, err)
	again, err := workflow.Parse([]byte(v.YAML))
	require.NoError(t, err, "%s", v.YAML)
	back, err := json.Marshal(again)
	require.NoError(t, err)
	require.JSONEq(t, string(v.Definition), string(back), "%s", v.YAML)
}
