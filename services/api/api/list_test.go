package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/api/visibility"
	"jetflow.dev/services/api/visibility/storetest"
	"jetflow.dev/services/internal/metrics/metricstest"
)

// listEnv is an api serving an embedded JetStream whose read models the
// test writes itself (there is no dispatcher).
type listEnv struct {
	url string
	kv  jetstream.KeyValue
	t0  time.Time
	// reg has the api's metrics.
	reg *prometheus.Registry
}

func (e *listEnv) get(t *testing.T, query string, out any) (int, http.Header) {
	t.Helper()
	return e.getJSON(t, "/v1/executions?"+query, out)
}

// getJSON asks the api for path and decodes its answer into out.
func (e *listEnv) getJSON(t *testing.T, path string, out any) (int, http.Header) {
	t.Helper()
	resp, err := http.Get(e.url + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.NoError(t, json.NewDecoder(resp.Body).Decode(out))
	return resp.StatusCode, resp.Header
}

// ids pages through a list and returns the ids, failing on any answer
// but 200.
func (e *listEnv) ids(t *testing.T, query string) []string {
	t.Helper()
	out := []string{}
	after := ""
	for range 100 {
		var page apiv1.ExecutionList
		q := query
		if after != "" {
			q += "&after=" + url.QueryEscape(after)
		}
		status, _ := e.get(t, q, &page)
		require.Equal(t, http.StatusOK, status, q)
		require.False(t, page.Partial, q)
		for _, x := range page.Executions {
			out = append(out, x.ID)
		}
		if page.Next == "" {
			return out
		}
		after = page.Next
	}
	t.Fatal("too many pages")
	return nil
}

func (e *listEnv) put(t *testing.T, id, wf string, minute int, st projections.Status, customer string) {
	t.Helper()
	x := projections.Execution{ID: id, Workflow: wf, Version: 1, Status: st, StartedAt: e.t0.Add(time.Duration(minute) * time.Minute),
		Input: json.RawMessage(fmt.Sprintf(`{"customer": %q}`, customer)), Steps: []projections.Step{{ID: "a", Status: projections.OpSucceeded}}}
	if st.Terminal() {
		x.EndedAt = x.StartedAt.Add(10 * time.Minute)
	}
	b, err := json.Marshal(x)
	require.NoError(t, err)
	_, err = e.kv.Put(t.Context(), id, b)
	require.NoError(t, err)
}

// startListEnv starts an api whose index is in a directory, or with pg
// in a fresh PostgreSQL database (JETFLOW_TEST_POSTGRES).
func startListEnv(t *testing.T, pg bool) *listEnv {
	t.Helper()
	cfg := Config{Auth: AuthConfig{Disabled: true}, freshWait: time.Minute}
	if pg {
		cfg.VisibilityPostgres = freshDatabase(t)
	} else {
		cfg.VisibilityDir = t.TempDir()
	}
	nc, js := natstest.Connect(t, natstest.RunJetStream(t))
	defs, err := catalog.Open(t.Context(), js)
	require.NoError(t, err)
	d, err := workflow.Parse([]byte("name: billing\nsearch_attributes: [input.customer]\nsteps:\n  - {id: a, kind: noop}\n"))
	require.NoError(t, err)
	_, _, err = defs.Apply(t.Context(), d)
	require.NoError(t, err)
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg.Listener = ln
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	natstest.Serve(t, func(ctx context.Context) error {
		// A list waits up to a minute for the index to apply a write before
		// it (2 s in production): on a loaded machine the feed can lag more.
		return Serve(ctx, cfg, nc, js, zerolog.New(zerolog.NewTestWriter(t)))
	})
	return &listEnv{url: "http://" + ln.Addr().String(), kv: kv, t0: time.Date(2026, 4, 2, 10, 0, 0, 0, time.UTC), reg: reg}
}

// live waits until the index answers (lists by start answer 503 before).
func (e *listEnv) live(t *testing.T) {
	t.Helper()
	natstest.Eventually(t, 20*time.Second, func() bool {
		var page apiv1.ExecutionList
		status, _ := e.get(t, "sort=started_desc&limit=1", &page)
		return status == http.StatusOK
	}, "the visibility index is live")
}

// TestListsFromTheVisibilityIndex: GET /v1/executions filters by
// workflow, status, time ranges and search attributes, sorts by time and
// pages with its cursor; a list right after a write shows it; a rebuild
// drops the index and it lists the same again.
func TestListsFromTheVisibilityIndex(t *testing.T) {
	t.Parallel()
	forEachStore(t, testListsFromTheVisibilityIndex)
}

// forEachStore runs test with the index in SQLite and in PostgreSQL (when
// there is one to test against: see freshDatabase).
func forEachStore(t *testing.T, test func(t *testing.T, pg bool)) {
	t.Run("SQLite", func(t *testing.T) { t.Parallel(); test(t, false) })
	t.Run("PostgreSQL", func(t *testing.T) { t.Parallel(); test(t, true) })
}

func testListsFromTheVisibilityIndex(t *testing.T, pg bool) {
	e := startListEnv(t, pg)
	e.put(t, "b-1", "billing", 1, projections.StatusSucceeded, "acme")
	e.put(t, "b-2", "billing", 2, projections.StatusFailed, "globex")
	e.put(t, "b-3", "billing", 3, projections.StatusSucceeded, "acme")
	e.put(t, "b-4", "billing", 4, projections.StatusSucceeded, "initech")
	e.put(t, "o-1", "other", 5, projections.StatusSucceeded, "acme")
	e.live(t)

	require.Equal(t, []string{"b-4", "b-3", "b-1"}, e.ids(t, "workflow=billing&status=succeeded&sort=started_desc&limit=1"))
	require.Equal(t, []string{"b-1", "b-3", "b-4"}, e.ids(t, "workflow=billing&status=succeeded&sort=started_asc&limit=2"))
	require.Equal(t, []string{"b-1", "b-2", "b-3", "b-4", "o-1"}, e.ids(t, "limit=2"), "id order by default, as before the index")
	require.Equal(t, []string{"b-1", "b-3"}, e.ids(t, "attr=customer:acme"), "o-1's workflow names no search attribute")
	at := func(minute int) string {
		return url.QueryEscape(e.t0.Add(time.Duration(minute) * time.Minute).Format(time.RFC3339))
	}
	require.Equal(t, []string{"b-4", "b-3", "b-2"}, e.ids(t, "started_after="+at(2)+"&started_before="+at(5)),
		"a start range without sort: latest start first")
	require.Equal(t, []string{"o-1", "b-4"}, e.ids(t, "ended_after="+at(14)), "an end range: latest end first")
	require.Equal(t, []string{"b-4", "b-3"}, e.ids(t, "sort=ended_desc&workflow=billing&status=succeeded&ended_after="+at(13)+"&limit=1"))

	// The index's metrics: live, the revision of the last of the five
	// writes (or later), each list's duration.
	require.Equal(t, 1.0, metricstest.Value(t, e.reg, "jetflow_visibility_live", "namespace", "default"))
	require.GreaterOrEqual(t, metricstest.Value(t, e.reg, "jetflow_visibility_revision", "namespace", "default"), 5.0)
	require.GreaterOrEqual(t, metricstest.Value(t, e.reg, "jetflow_visibility_list_seconds", "namespace", "default"), 8.0,
		"the eight lists above, each timed")

	var page apiv1.ExecutionList
	status, _ := e.get(t, "workflow=billing&status=failed&sort=started_desc", &page)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, []apiv1.ExecutionSummary{{ID: "b-2", Workflow: "billing", Version: 1, Status: "failed", Steps: 1, Done: 1,
		StartedAt: e.t0.Add(2 * time.Minute), EndedAt: e.t0.Add(12 * time.Minute)}}, page.Executions)

	// Read after write: each list shows the write before it.
	for i := range 5 {
		id := fmt.Sprintf("n-%d", i)
		e.put(t, id, "billing", 10+i, projections.StatusStarted, "umbrella")
		got := e.ids(t, "sort=started_desc&limit=1&status=started")
		require.NotEmpty(t, got, "listed right after its write")
		require.Equal(t, id, got[0], "listed right after its write")
	}

	all := e.ids(t, "sort=started_asc&limit=1000")
	resp, err := http.Post(e.url+"/v1/admin/projections/rebuild", "application/json", nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp.Body.Close()
	e.live(t)
	require.Equal(t, all, e.ids(t, "sort=started_asc&limit=1000"), "the rebuilt index lists the same")
}

// counts asks GET /v1/executions/_counts.
func (e *listEnv) counts(t *testing.T, query string, out any) (int, http.Header) {
	t.Helper()
	return e.getJSON(t, "/v1/executions/_counts?"+query, out)
}

// TestCountsFromTheVisibilityIndex: GET /v1/executions/_counts counts
// every execution by status, of all workflows or of one, right after a
// write (as a list does), and follows status changes and deletions.
func TestCountsFromTheVisibilityIndex(t *testing.T) {
	t.Parallel()
	forEachStore(t, testCountsFromTheVisibilityIndex)
}

func testCountsFromTheVisibilityIndex(t *testing.T, pg bool) {
	e := startListEnv(t, pg)
	e.put(t, "b-1", "billing", 1, projections.StatusSucceeded, "acme")
	e.put(t, "b-2", "billing", 2, projections.StatusFailed, "globex")
	e.put(t, "b-3", "billing", 3, projections.StatusStarted, "acme")
	e.put(t, "o-1", "other", 5, projections.StatusSucceeded, "acme")
	e.live(t)
	count := func(query string) apiv1.ExecutionCounts {
		t.Helper()
		var c apiv1.ExecutionCounts
		status, _ := e.counts(t, query, &c)
		require.Equal(t, http.StatusOK, status, query)
		return c
	}
	require.Equal(t, apiv1.ExecutionCounts{Counts: map[string]int{"succeeded": 2, "failed": 1, "started": 1}, Total: 4}, count(""))
	require.Equal(t, apiv1.ExecutionCounts{Counts: map[string]int{"succeeded": 1, "failed": 1, "started": 1}, Total: 3}, count("workflow=billing"))
	require.Equal(t, apiv1.ExecutionCounts{Counts: map[string]int{}, Total: 0}, count("workflow=nothing"))

	// b-3 ends, o-1 is deleted: the next answer shows both.
	e.put(t, "b-3", "billing", 3, projections.StatusSucceeded, "acme")
	require.NoError(t, e.kv.Delete(t.Context(), "o-1"))
	require.Equal(t, apiv1.ExecutionCounts{Counts: map[string]int{"succeeded": 2, "failed": 1}, Total: 3}, count(""))

	var body apiv1.ErrorBody
	status, _ := e.counts(t, "workflow=no%20such", &body)
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, "workflow", body.Error.Field)
}

// TestListBeforeTheIndexIsLive: without a live index, a list the read
// models can answer is read from them, and any other is answered 503
// with Retry-After; bad parameters are 400 naming them.
func TestListBeforeTheIndexIsLive(t *testing.T) {
	t.Parallel()
	e := startUnindexedEnv(t)
	e.put(t, "s-1", "wf", 0, projections.StatusSucceeded, "acme")

	require.Equal(t, []string{"s-1"}, e.ids(t, "workflow=wf&sort=id"))
	for _, q := range []string{"sort=started_desc", "attr=customer:acme", "ended_before=2026-01-01T00:00:00Z"} {
		var body apiv1.ErrorBody
		status, hdr := e.get(t, q, &body)
		require.Equal(t, http.StatusServiceUnavailable, status, q)
		require.Equal(t, "unavailable", body.Error.Code, q)
		require.Equal(t, RetryAfter, hdr.Get("Retry-After"), q)
	}
	var body apiv1.ErrorBody
	status, hdr := e.counts(t, "", &body)
	require.Equal(t, http.StatusServiceUnavailable, status, "only the index counts")
	require.Equal(t, RetryAfter, hdr.Get("Retry-After"))
	for q, field := range map[string]string{
		"sort=newest":                        "sort",
		"started_after=yesterday":            "started_after",
		"ended_before=2026-01-01":            "ended_before",
		"attr=customer":                      "attr",
		"attr=cust%20omer:x":                 "attr",
		"sort=started_desc&after=not-a-page": "after",
		"sort=started_asc&after=" + url.QueryEscape(cursorOf(t, "started_desc")): "after",
		"limit=0": "limit",
	} {
		var body apiv1.ErrorBody
		status, _ := e.get(t, q, &body)
		require.Equal(t, http.StatusBadRequest, status, q)
		require.Equal(t, "invalid", body.Error.Code, q)
		require.Equal(t, field, body.Error.Field, q)
	}
}

// TestListFromTheReadModelsIsBounded: without a live index a list reads
// the read models, at most listScanMax a request (or for listScanTime,
// past listScanMin, on a slow machine): a filter that matches
// few of many answers partial pages, each with the cursor to go on from,
// and following the cursors finds every match, in id order.
func TestListFromTheReadModelsIsBounded(t *testing.T) {
	t.Parallel()
	e := startUnindexedEnv(t)
	const noise = 2*listScanMax + 100
	for i := range noise {
		e.put(t, fmt.Sprintf("aa-%05d", i), "noise", 0, projections.StatusSucceeded, "")
	}
	e.put(t, "mm-1", "needle", 0, projections.StatusSucceeded, "")
	e.put(t, "zz-1", "needle", 0, projections.StatusFailed, "")
	e.put(t, "zz-2", "needle", 0, projections.StatusStarted, "")

	var found []string
	after, pages, partial := "", 0, 0
	for {
		var page apiv1.ExecutionList
		q := "workflow=needle&limit=2&after=" + url.QueryEscape(after)
		status, _ := e.get(t, q, &page)
		require.Equal(t, http.StatusOK, status, q)
		pages++
		require.LessOrEqual(t, pages, (noise+3)/listScanMin+2, "each request examines at least listScanMin read models")
		if page.Partial {
			partial++
			require.NotEmpty(t, page.Next, "a partial page says where to go on")
		}
		for _, x := range page.Executions {
			found = append(found, x.ID)
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	require.Equal(t, []string{"mm-1", "zz-1", "zz-2"}, found)
	require.GreaterOrEqual(t, partial, 2, "no request examines more than listScanMax read models (%d of them here)", noise+3)
}

// startUnindexedEnv starts an api's handler with no visibility index
// (none is fed): lists read the read models.
func startUnindexedEnv(t *testing.T) *listEnv {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	srv, err := New(t.Context(), Config{Auth: AuthConfig{Disabled: true}}, js.Conn(), js, zerolog.Nop())
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	kv, err := js.KeyValue(t.Context(), bus.BucketExecutions)
	require.NoError(t, err)
	return &listEnv{url: hs.URL, kv: kv, t0: time.Now()}
}

// cursorOf is a cursor of a list in order sort.
func cursorOf(t *testing.T, sort string) string {
	t.Helper()
	return visibility.Cursor{Sort: visibility.Sort(sort), Time: 1, ID: "x"}.String()
}

// TestRebuildFeedsTheIndexAgain: a rebuild from 0 drops the api's
// visibility index and feeds it from the read models, so that a row the
// read models do not have (here written into the index by hand) is gone;
// one from a later sequence leaves the index as it is.
func TestRebuildFeedsTheIndexAgain(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	srv, err := New(t.Context(), Config{Auth: AuthConfig{Disabled: true}}, js.Conn(), js, zerolog.Nop())
	require.NoError(t, err)
	feed, err := openFeed(t.Context(), Config{VisibilityDir: t.TempDir()}, DefaultNamespace, js, srv.def.defs, zerolog.New(zerolog.NewTestWriter(t)))
	require.NoError(t, err)
	t.Cleanup(func() { feed.Store().Close() })
	srv.feeds[DefaultNamespace] = feed
	natstest.Serve(t, feed.Run)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	e := &listEnv{url: hs.URL, kv: srv.def.execs, t0: time.Date(2026, 4, 2, 10, 0, 0, 0, time.UTC)}
	e.put(t, "r-1", "wf", 1, projections.StatusSucceeded, "acme")
	e.live(t)
	ghost := visibility.Row{ID: "ghost", Workflow: "wf", Status: projections.StatusSucceeded, StartedAt: e.t0, Rev: 1 << 40}
	pos, err := feed.Store().Position(t.Context())
	require.NoError(t, err)
	require.NoError(t, feed.Store().Apply(t.Context(), visibility.Batch{Puts: []visibility.Row{ghost}, Position: pos}))
	require.Equal(t, []string{"r-1", "ghost"}, e.ids(t, "sort=started_desc"))

	rebuild := func(from string) {
		t.Helper()
		resp, err := http.Post(e.url+"/v1/admin/projections/rebuild?from_seq="+from, "application/json", nil)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		resp.Body.Close()
	}
	rebuild("5")
	require.Equal(t, []string{"r-1", "ghost"}, e.ids(t, "sort=started_desc"), "a rebuild from a later sequence leaves the index")
	rebuild("0")
	e.live(t)
	require.Equal(t, []string{"r-1"}, e.ids(t, "sort=started_desc"), "the index was fed again from the read models")
}

// freshDatabase creates a PostgreSQL database for one test on the server
// of JETFLOW_TEST_POSTGRES, dropped when the test ends, and returns its
// URL. Without the variable the test skips, unless
// JETFLOW_REQUIRE_POSTGRES=1, when it fails.
func freshDatabase(t *testing.T) string {
	t.Helper()
	base := storetest.PostgresURL(t)
	u, err := url.Parse(base)
	require.NoError(t, err)
	name := fmt.Sprintf("jetflow_api_test_%d_%d", os.Getpid(), dbSeq.Add(1))
	conn, err := pgx.Connect(t.Context(), base)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(t.Context(), "CREATE DATABASE "+name)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		conn, err := pgx.Connect(ctx, base)
		require.NoError(t, err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
		require.NoError(t, err)
	})
	u.Path = "/" + name
	return u.String()
}

var dbSeq atomic.Int64

// TestAnIndexStoreAwayAnswers503: a list or counts the index's store
// cannot answer (a PostgreSQL server away, a closed database) is 503 with
// Retry-After, saying to retry and nothing of the store's address.
func TestAnIndexStoreAwayAnswers503(t *testing.T) {
	t.Parallel()
	nc, js := natstest.Connect(t, natstest.RunJetStream(t))
	log := zerolog.New(zerolog.NewTestWriter(t))
	srv, err := New(t.Context(), Config{Auth: AuthConfig{Disabled: true}}, nc, js, log)
	require.NoError(t, err)
	feed, err := openFeed(t.Context(), Config{}, DefaultNamespace, js, srv.tenants[DefaultNamespace].defs, log)
	require.NoError(t, err)
	srv.feeds[DefaultNamespace] = feed
	natstest.Serve(t, feed.Run)
	natstest.Eventually(t, 30*time.Second, feed.Live, "the index is live")
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	require.NoError(t, feed.Store().Close()) // the store is away

	for _, path := range []string{"/v1/executions?sort=started_desc", "/v1/executions/_counts"} {
		resp, err := http.Get(hs.URL + path)
		require.NoError(t, err)
		var body apiv1.ErrorBody
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		resp.Body.Close()
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, path)
		require.Equal(t, RetryAfter, resp.Header.Get("Retry-After"), path)
		require.NotNil(t, body.Error, path)
		require.Equal(t, "unavailable", body.Error.Code, path)
		require.Contains(t, body.Error.Message, "the visibility index cannot be read now", path)
	}
}
