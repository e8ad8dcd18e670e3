package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/projections"
)

// getJSON GETs path from the api and decodes the answer (or its error)
// into out; it returns the status.
func getJSON(t *testing.T, s *stack, path string, out any) int {
	t.Helper()
	resp, err := apiHTTP.Get(s.info.APIURL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"), path)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(out), path)
	return resp.StatusCode
}

// listIDs returns the ids of a page of executions.
func listIDs(list []client.ExecutionSummary) []string {
	ids := make([]string, len(list))
	for i, e := range list {
		ids[i] = e.ID
	}
	return ids
}

// TestExecutionListPages pages through GET /v1/executions with limit and
// after, with and without filters, and checks the bad parameters.
func TestExecutionListPages(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, "name: pg\nsteps:\n  - {id: a, kind: noop}\n")
	s.apply(t, "name: og\nsteps:\n  - {id: a, kind: noop}\n")
	s.apply(t, "name: pgfail\nsteps:\n  - {id: a, kind: fail, message: no}\n")
	for _, r := range []client.StartRequest{
		{Workflow: "pg", ID: "pg-3"}, {Workflow: "pg", ID: "pg-1"}, {Workflow: "og", ID: "og-1"},
		{Workflow: "pg", ID: "pg-5"}, {Workflow: "pg", ID: "pg-2"}, {Workflow: "pg", ID: "pg-4"},
		{Workflow: "pgfail", ID: "pg-2x"},
	} {
		_, err := s.c.Start(ctx, r)
		require.NoError(t, err)
	}
	all := []string{"og-1", "pg-1", "pg-2", "pg-2x", "pg-3", "pg-4", "pg-5"}
	for _, id := range all {
		s.waitDone(t, id, 20*time.Second)
	}
	// The list comes from the read models, which may be a moment behind.
	poll(t, 20*time.Second, "every execution listed as ended", func() (bool, string) {
		list, next, err := s.c.ListExecutions(ctx, client.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		ended := 0
		for _, e := range list {
			if projections.Status(e.Status).Terminal() {
				ended++
			}
		}
		return ended == len(all) && next == "", fmt.Sprintf("%d listed, %d ended, next %q", len(list), ended, next)
	})

	pages := func(o client.ListOptions) [][]string {
		t.Helper()
		var out [][]string
		for range 10 {
			list, next, err := s.c.ListExecutions(ctx, o)
			require.NoError(t, err)
			require.LessOrEqual(t, len(list), o.Limit, "a page holds at most limit executions")
			out = append(out, listIDs(list))
			if next == "" {
				return out
			}
			require.NotEmpty(t, list, "a page that says there is more is not empty")
			require.Equal(t, list[len(list)-1].ID, next, "next is the page's last id")
			o.After = next
		}
		t.Fatalf("more than 10 pages: %v", out)
		return nil
	}
	require.Equal(t, [][]string{{"og-1", "pg-1", "pg-2"}, {"pg-2x", "pg-3", "pg-4"}, {"pg-5"}},
		pages(client.ListOptions{Limit: 3}), "sorted by id, every execution once")
	require.Equal(t, [][]string{{"pg-1", "pg-2"}, {"pg-3", "pg-4"}, {"pg-5"}},
		pages(client.ListOptions{Workflow: "pg", Limit: 2}), "the filter applies before the page is cut")
	require.Equal(t, [][]string{{"pg-1", "pg-2", "pg-3", "pg-4", "pg-5"}},
		pages(client.ListOptions{Workflow: "pg", Limit: 5}), "no next when the last page is exactly full")
	require.Equal(t, [][]string{{"pg-2x"}}, pages(client.ListOptions{Status: "failed", Limit: 1}))
	require.Equal(t, [][]string{{"pg-4", "pg-5"}}, pages(client.ListOptions{Workflow: "pg", After: "pg-3", Limit: 10}),
		"a page starts after any id")
	require.Equal(t, [][]string{{}}, pages(client.ListOptions{After: "pg-5", Limit: 10}))

	list, _, err := s.c.ListExecutions(ctx, client.ListOptions{Workflow: "pgfail"})
	require.NoError(t, err)
	require.Len(t, list, 1)
	row := list[0]
	require.Equal(t, "pg-2x", row.ID)
	require.Equal(t, "pgfail", row.Workflow)
	require.Equal(t, 1, row.Version)
	require.Equal(t, "failed", row.Status)
	require.Contains(t, row.Error, "no")
	require.Equal(t, 1, row.Steps)
	require.Zero(t, row.Done)
	require.False(t, row.StartedAt.IsZero())
	require.False(t, row.EndedAt.Before(row.StartedAt))

	for _, c := range []struct{ query, field string }{
		{"limit=0", "limit"}, {"limit=1001", "limit"}, {"limit=ten", "limit"},
		{"status=sleeping", "status"}, {"workflow=no%20such", "workflow"},
	} {
		var body struct {
			Error client.Error `json:"error"`
		}
		require.Equal(t, http.StatusBadRequest, getJSON(t, s, "/v1/executions?"+c.query, &body), c.query)
		require.Equal(t, "invalid", body.Error.Code, c.query)
		require.Equal(t, c.field, body.Error.Field, c.query)
	}
}

// TestWorkflowsAndVersionsOverHTTP reads registered workflows back: the
// list, a workflow with its versions, and one version.
func TestWorkflowsAndVersionsOverHTTP(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	v1 := s.apply(t, "name: wfa\ndescription: first\nsteps:\n  - {id: a, kind: noop}\n")
	require.True(t, v1.Created)
	again := s.apply(t, "name: wfa\ndescription: first\nsteps:\n  - {id: a, kind: noop}\n")
	require.False(t, again.Created, "the same definition again is no new version")
	require.Equal(t, 1, again.Version)
	v2 := s.apply(t, "name: wfa\ndescription: second\nsteps:\n  - {id: a, kind: noop}\n  - {id: b, kind: noop}\n")
	require.Equal(t, 2, v2.Version)
	require.NotEqual(t, v1.Digest, v2.Digest)
	b1 := s.apply(t, "name: wfb\nsteps:\n  - {id: only, kind: noop}\n")

	list, err := s.c.ListWorkflows(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, client.WorkflowSummary{Name: "wfa", LatestVersion: 2, Description: "second", UpdatedAt: v2.CreatedAt}, list[0])
	require.Equal(t, client.WorkflowSummary{Name: "wfb", LatestVersion: 1, UpdatedAt: b1.CreatedAt}, list[1])

	var wf struct {
		Name     string         `json:"name"`
		Versions []int          `json:"versions"`
		Latest   catalog.Record `json:"latest"`
	}
	require.Equal(t, http.StatusOK, getJSON(t, s, "/v1/workflows/wfa", &wf))
	require.Equal(t, "wfa", wf.Name)
	require.Equal(t, []int{1, 2}, wf.Versions)
	require.Equal(t, 2, wf.Latest.Version)
	require.Equal(t, v2.Digest, wf.Latest.Digest)
	require.Equal(t, "second", wf.Latest.Definition.Description)
	require.Len(t, wf.Latest.Definition.Steps, 2)

	var rec catalog.Record
	require.Equal(t, http.StatusOK, getJSON(t, s, "/v1/workflows/wfa/versions/1", &rec))
	require.Equal(t, "wfa", rec.Name)
	require.Equal(t, 1, rec.Version)
	require.Equal(t, v1.Digest, rec.Digest, "a stored version never changes")
	require.True(t, rec.CreatedAt.Equal(v1.CreatedAt))
	require.Equal(t, "first", rec.Definition.Description)
	require.Len(t, rec.Definition.Steps, 1)

	for _, c := range []struct {
		path, code, field string
		status            int
	}{
		{"/v1/workflows/wfa/versions/3", "not_found", "version", http.StatusNotFound},
		{"/v1/workflows/nope/versions/1", "not_found", "version", http.StatusNotFound},
		{"/v1/workflows/wfa/versions/0", "invalid", "version", http.StatusBadRequest},
		{"/v1/workflows/wfa/versions/latest", "invalid", "version", http.StatusBadRequest},
		{"/v1/workflows/nope", "not_found", "name", http.StatusNotFound},
	} {
		var body struct {
			Error client.Error `json:"error"`
		}
		require.Equal(t, c.status, getJSON(t, s, c.path, &body), c.path)
		require.Equal(t, c.code, body.Error.Code, c.path)
		require.Equal(t, c.field, body.Error.Field, c.path)
	}
}

// TestListWorkIsBounded: a filter that matches few of many executions
// does not make one request read every read model: the visibility index
// answers it from a range of its own, in one page; before the index is
// live, the read models are read a bounded number per request, with
// partial pages and a cursor, and following the cursors finds every
// match either way (from the index, once it holds what the read models
// do: a list waits two seconds for it, then answers a moment behind).
func TestListWorkIsBounded(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	needles(t, s, 2500, "zz-1", "zz-2")
	walk := func() []string {
		var found []string
		after := ""
		for {
			var page struct {
				Executions []client.ExecutionSummary `json:"executions"`
				Next       string                    `json:"next"`
				Partial    bool                      `json:"partial"`
			}
			code := getJSON(t, s, "/v1/executions?workflow=needle&limit=10&after="+after, &page)
			require.Equal(t, http.StatusOK, code)
			if page.Partial {
				require.NotEmpty(t, page.Next, "a partial page says where to go on")
			}
			found = append(found, listIDs(page.Executions)...)
			if page.Next == "" {
				return found
			}
			after = page.Next
		}
	}
	want := []string{"zz-1", "zz-2"}
	poll(t, 60*time.Second, "a walk of the pages finds both needles", func() (bool, string) {
		// Read from the read models, which hold both, a walk misses
		// none; the index, once live (it stays so), may be behind them
		// on a busy machine.
		live := indexLive(t, s)
		found := walk()
		if slices.Equal(found, want) {
			return true, ""
		}
		require.True(t, live, "a walk begun on the read models found %v, not %v", found, want)
		return false, fmt.Sprintf("found %v from the visibility index", found)
	})

	// From the index (a list by start is answered by it only, once live).
	waitVisible(t, s)
	var page client.ExecutionList
	poll(t, 60*time.Second, "the index lists both needles", func() (bool, string) {
		require.Equal(t, http.StatusOK, getJSON(t, s, "/v1/executions?workflow=needle&limit=10", &page))
		return slices.Equal(listIDs(page.Executions), want), fmt.Sprintf("listed %v", listIDs(page.Executions))
	})
	require.False(t, page.Partial)
	require.Empty(t, page.Next, "one page")
	require.Equal(t, http.StatusOK, getJSON(t, s, "/v1/executions?workflow=needle&sort=started_desc&limit=1", &page))
	require.Equal(t, []string{"zz-2"}, listIDs(page.Executions), "the latest start first")
	require.NotEmpty(t, page.Next)
}

// indexLive says whether the api's visibility index is live: until then,
// a list by start is answered 503.
func indexLive(t *testing.T, s *stack) bool {
	t.Helper()
	var page client.ExecutionList
	return getJSON(t, s, "/v1/executions?sort=started_desc&limit=1", &page) == http.StatusOK
}

// waitVisible waits until the api's visibility index is live: until
// then, a list by start is answered 503.
func waitVisible(t *testing.T, s *stack) {
	t.Helper()
	poll(t, 60*time.Second, "the visibility index is live", func() (bool, string) {
		var page client.ExecutionList
		code := getJSON(t, s, "/v1/executions?sort=started_desc&limit=1", &page)
		return code == http.StatusOK, fmt.Sprintf("status %d", code)
	})
}

// TestClientFillsPartialPages: the client asks again after a partial page,
// so a caller (jetflow ls) gets a full page of matches. Each request
// examines at least 250 read models, however loaded the machine: the
// 2,203 here take at most nine requests, within the client's ten.
func TestClientFillsPartialPages(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	needles(t, s, 2200, "zz-1", "zz-2", "zz-3")
	want := []string{"zz-1", "zz-2"}
	poll(t, 60*time.Second, "a full page of needles", func() (bool, string) {
		live := indexLive(t, s) // as in TestListWorkIsBounded: only the index may be behind
		list, next, err := s.c.ListExecutions(ctx, client.ListOptions{Workflow: "needle", Limit: 2})
		require.NoError(t, err)
		if slices.Equal(listIDs(list), want) {
			require.Equal(t, "zz-2", next)
			return true, ""
		}
		require.True(t, live, "begun on the read models: %v, not %v", listIDs(list), want)
		return false, fmt.Sprintf("listed %v from the visibility index", listIDs(list))
	})
}

// needles writes n read models of a workflow "noise" (ids sorted before
// the needles'), then runs an execution of workflow "needle" for each id.
func needles(t *testing.T, s *stack, n int, ids ...string) {
	t.Helper()
	ctx := context.Background()
	kv, err := s.js.KeyValue(ctx, "JF_EXECUTIONS")
	require.NoError(t, err)
	for i := range n {
		b, _ := json.Marshal(projections.Execution{ID: fmt.Sprintf("aa-%04d", i), Workflow: "noise", Status: projections.StatusSucceeded})
		_, err := kv.Put(ctx, fmt.Sprintf("aa-%04d", i), b)
		require.NoError(t, err)
	}
	s.apply(t, "name: needle\nsteps:\n  - {id: a, kind: noop}\n")
	for _, id := range ids {
		_, err := s.c.Start(ctx, client.StartRequest{Workflow: "needle", ID: id})
		require.NoError(t, err)
		s.waitDone(t, id, 30*time.Second)
	}
	// Listed from their read models: wait until the projector wrote them.
	require.Eventually(t, func() bool {
		for _, id := range ids {
			if _, err := kv.Get(ctx, id); err != nil {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "the needles' read models are written")
}
