package cli

import (
	"testing"
	"time"

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
		{pageFlags{prog: "bin/jetflow"}, client.ListOptions{Limit: 50}, "x1", "bin/jetflow ls --after x1"},
		{pageFlags{prog: "/opt/my tools/jetflow"}, client.ListOptions{Limit: 50}, "x1", "'/opt/my tools/jetflow' ls --after x1"},
		{pageFlags{api: "http://127.0.0.1:28380", namespace: "acme"}, client.ListOptions{Limit: 50}, "x1",
			"jetflow --api http://127.0.0.1:28380 --namespace acme ls --after x1"},
		{pageFlags{}, client.ListOptions{Attrs: []string{"customer:acme corp", "tier:gold"}, Sort: "started_desc", Limit: 50,
			StartedAfter: time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 3600))}, "c3RhcnRlZA",
			"jetflow ls --attr 'customer:acme corp' --attr tier:gold --started-after 2026-01-02T02:04:05Z --sort started_desc --after c3RhcnRlZA"},
	} {
		if got := nextPage(tc.g, tc.o, tc.next); got != tc.want {
			t.Errorf("nextPage(%+v, %q) = %q, want %q", tc.o, tc.next, got, tc.want)
		}
	}
}

// TestCommandName: the next page's command runs jetflow as it was run
// (bin/jetflow from a checkout, where jetflow may not be on the PATH).
func TestCommandName(t *testing.T) {
	for arg0, want := range map[string]string{
		"bin/jetflow":             "bin/jetflow",
		"./jetflow":               "./jetflow",
		"jetflow":                 "jetflow",
		"/usr/local/bin/jetflow":  "/usr/local/bin/jetflow",
		"/tmp/go-build1/cli.test": "jetflow",
		"jf":                      "jetflow",
	} {
		if got := commandName(arg0); got != want {
			t.Errorf("commandName(%q) = %q, want %q", arg0, got, want)
		}
	}
}

// TestParseWhen: ls's time flags take an RFC 3339 time or a duration ago.
func TestParseWhen(t *testing.T) {
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2026-01-02T03:04:05Z": time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		"90m":                  now.Add(-90 * time.Minute),
		"0s":                   now,
	} {
		got, err := parseWhen(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseWhen(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"yesterday", "-1h", "2026-01-02"} {
		if _, err := parseWhen(in, now); err == nil {
			t.Errorf("parseWhen(%q) takes it", in)
		}
	}
}
