package apiv1test_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/apiv1/apiv1test"
)

type scope string

type entry struct {
	Seq  uint64 `json:"seq"`
	Note string `json:"note,omitempty"`
}

type stored struct {
	ID      string           `json:"id"`
	Scopes  []scope          `json:"scopes"`
	At      time.Time        `json:"at,omitzero"`
	Entries []entry          `json:"entries"`
	Data    map[string]entry `json:"data"`
	Hash    string           `json:"hash,omitempty"`
	local   int
	Skipped int `json:"-"`
}

type base struct {
	ID     string   `json:"id"`
	Scopes []string `json:"scopes"`
}

type wire struct {
	base
	At      time.Time        `json:"at,omitzero"`
	Entries []entry          `json:"entries"`
	Data    map[string]entry `json:"data"`
	Status  string           `json:"status"`
}

func TestMembers(t *testing.T) {
	t.Parallel()
	m, err := apiv1test.Members(&wire{})
	require.NoError(t, err)
	require.Equal(t, map[string]string{
		"id": "string", "scopes": "[]string", "at": "time omitzero",
		"entries": "[]{note:string omitempty; seq:number}", "data": "map[string]{note:string omitempty; seq:number}", "status": "string",
	}, m, "embedded fields are members; kinds are JSON's")
	_, err = apiv1test.Members(3)
	require.Error(t, err)
}

func TestSameMembers(t *testing.T) {
	t.Parallel()
	require.NoError(t, apiv1test.SameMembers(stored{}, wire{}, []string{"hash"}, []string{"status"}))

	type wireRenamed struct {
		base
		At      time.Time        `json:"at"`
		Entries []entry          `json:"entry"`
		Data    map[string]entry `json:"data"`
		Status  string           `json:"status"`
	}
	err := apiv1test.SameMembers(stored{}, wireRenamed{}, []string{"hash"}, []string{"status"})
	require.ErrorContains(t, err, `"entries"`, "a member on one side only")
	require.ErrorContains(t, err, `"entry"`, "a member on the other side only")
	require.ErrorContains(t, err, `member "at" is time omitzero`, "an option differs")

	type wireOtherKind struct {
		ID      int              `json:"id"`
		Scopes  []string         `json:"scopes"`
		At      time.Time        `json:"at,omitzero"`
		Entries []struct{}       `json:"entries"`
		Data    map[string]entry `json:"data"`
		Status  string           `json:"status"`
	}
	err = apiv1test.SameMembers(stored{}, wireOtherKind{}, []string{"hash"}, []string{"status"})
	require.ErrorContains(t, err, `member "id" is string`)
	require.ErrorContains(t, err, `member "entries" is []{note:string omitempty; seq:number}`, "kinds compare deeply")

	require.ErrorContains(t, apiv1test.SameMembers(stored{}, wire{}, []string{"hash", "nope"}, []string{"status"}),
		`no member "nope"`, "an exception must exist")
	require.ErrorContains(t, apiv1test.SameMembers(stored{}, wire{}, []string{"hash"}, []string{"status", "id"}),
		`has the member "id" too`, "an exception must be one side's only")

	type rawInput struct {
		Input json.RawMessage `json:"input,omitempty"`
	}
	type mapInput struct {
		Input map[string]any `json:"input,omitempty"`
	}
	require.NoError(t, apiv1test.SameMembers(rawInput{}, mapInput{}, nil, nil), "raw JSON matches any kind")
}

func TestFillAndSameJSON(t *testing.T) {
	t.Parallel()
	var s stored
	require.NoError(t, apiv1test.Fill(&s))
	require.Equal(t, "ID", s.ID)
	require.Equal(t, []scope{"Scopes"}, s.Scopes)
	require.False(t, s.At.IsZero())
	require.Equal(t, "Hash", s.Hash)
	require.Nil(t, s.Entries, "structs are left alone")
	require.Zero(t, s.local)
	require.Error(t, apiv1test.Fill(s), "not a pointer")

	convert := func(s stored) wire {
		return wire{base: base{ID: s.ID, Scopes: []string{string(s.Scopes[0])}}, At: s.At, Status: "active"}
	}
	require.NoError(t, apiv1test.SameJSON(s, convert(s), "hash", "status", "local", "Skipped"))
	dropped := convert(s)
	dropped.At = time.Time{}
	require.ErrorContains(t, apiv1test.SameJSON(s, dropped, "hash", "status"), `has "at"`)
	swapped := convert(s)
	swapped.ID = "Hash"
	require.ErrorContains(t, apiv1test.SameJSON(s, swapped, "hash", "status"), `"id" is "ID"`)
	require.ErrorContains(t, apiv1test.SameJSON(s, convert(s), "hash"), `has "status"`)
}
