package cli

import (
	"testing"

	"jetflow.dev/pkg/client"
)

// TestNextPageKeepsTheFilters: the command ls suggests for the next page
// lists the same executions as the one that printed it (it used to drop
// --workflow and --status, and list every workflow's), quoted for a
// shell where it must be.
func TestNextPageKeepsTheFilters(t *testing.T) {
	for _, tc := range []struct {
		g    pageFlags
		o    client.ListOptions
		next string
		want string
	}{
		{pageFlags{}, client.ListOptions{Limit: 50}, "ce-5254", "jetflow ls --after ce-5254"},
		{pageFlags{limit: true}, client.ListOptions{Workflow: "hello", Status: "succeeded", Limit: 3}, "ce-5254",
			"jetflow ls --workflow hello --status succeeded --limit 3 --after ce-5254"},
		{pageFlags{}, client.ListOptions{Damaged: true, Limit: 50}, "x1", "jetflow ls --damaged --after x1"},
		{pageFlags{}, client.ListOptions{Workflow: "it's", Limit: 50}, "a b", `jetflow ls --workflow 'it'\''s' --after 'a b'`},
		{pageFlags{api: "http://127.0.0.1:28380", namespace: "acme"}, client.ListOptions{Limit: 50}, "x1",
			"jetflow --api http://127.0.0.1:28380 --namespace acme ls --after x1"},
	} {
		if got := nextPage(tc.g, tc.o, tc.next); got != tc.want {
			t.Errorf("nextPage(%+v, %q) = %q, want %q", tc.o, tc.next, got, tc.want)
		}
	}
}
