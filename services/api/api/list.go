package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/services/api/visibility"
)

// listParams are the query parameters of GET /v1/executions.
var listParams = []string{"workflow", "status", "damaged", "limit", "after", "sort",
	"started_after", "started_before", "ended_after", "ended_before", "attr"}

// listFreshWait bounds how long a list waits for the visibility index to
// apply what the read models held when it was asked (visibility.Feed.WaitFor).
// Past it, the list answers from the index as it is, a moment behind.
const listFreshWait = 2 * time.Second

// listExecutions answers GET /v1/executions from the visibility index of
// the request's namespace, once it is live. Until then (the api just
// started without -visibility-dir, or a rebuild feeds it again) a list
// the read models can answer (in id order, by workflow, status and
// damage) reads them, as the api did before the index, and any other
// list is answered 503 with Retry-After.
func (s *Server) listExecutions(w http.ResponseWriter, r *http.Request) {
	q, ok := parseList(w, r)
	if !ok {
		return
	}
	t := s.at(r)
	feed := s.feeds[t.name]
	if feed == nil || !feed.Live() {
		if q.Sort == visibility.SortID && q.StartedAfter.IsZero() && q.StartedBefore.IsZero() && q.EndedAfter.IsZero() && q.EndedBefore.IsZero() &&
			len(q.Attrs) == 0 {
			s.scanExecutions(w, r)
			return
		}
		w.Header().Set("Retry-After", RetryAfter)
		writeError(w, http.StatusServiceUnavailable, apiError{Code: "unavailable",
			Message: "the visibility index is being fed from the read models (the api started without -visibility-dir, or a rebuild); " +
				"retry in a moment (a list in id order without time ranges or attr is read from the read models meanwhile)"})
		return
	}
	began := time.Now()
	if err := s.fresh(r.Context(), t.execs, feed); err != nil {
		s.internal(w, r, err)
		return
	}
	page, err := feed.Store().Query(r.Context(), q)
	if err != nil {
		s.indexUnavailable(w, r, err)
		return
	}
	s.listDuration.WithLabelValues(t.name).Observe(time.Since(began).Seconds())
	out := apiv1.ExecutionList{Executions: make([]apiv1.ExecutionSummary, len(page.Rows)), Partial: page.Partial}
	for i, row := range page.Rows {
		out.Executions[i] = apiv1.ExecutionSummary{ID: row.ID, Workflow: row.Workflow, Version: row.Version, Status: string(row.Status),
			Error: row.Error, Steps: row.Steps, Done: row.Done, StartedAt: row.StartedAt, EndedAt: row.EndedAt, Damaged: row.Damaged}
	}
	if page.Next != nil {
		out.Next = page.Next.String()
	}
	writeJSON(w, http.StatusOK, out)
}

// indexUnavailable answers a list or counts the index's store could not
// answer (a PostgreSQL server away, a disk failing): 503 with
// Retry-After, as for NATS away; the error, which may name the store's
// host and user, goes to the log only.
func (s *Server) indexUnavailable(w http.ResponseWriter, r *http.Request, err error) {
	if stoppedUnder(r) {
		unavailableStopping(w)
		return
	}
	if r.Context().Err() != nil {
		return // the caller went away
	}
	zerolog.Ctx(r.Context()).Warn().Err(err).Str("path", r.URL.Path).Msg("visibility index unavailable")
	w.Header().Set("Retry-After", RetryAfter)
	writeError(w, http.StatusServiceUnavailable, apiError{Code: "unavailable",
		Message: "the visibility index cannot be read now (its store is away or failing; the api's log says why): retry in a moment"})
}

// countExecutions answers GET /v1/executions/_counts: how many executions
// of the index (or of one workflow's) are in each status, read from the
// counts the index keeps with its rows. Only the index can answer it:
// until it is live, 503 with Retry-After.
func (s *Server) countExecutions(w http.ResponseWriter, r *http.Request) {
	wf := r.URL.Query().Get("workflow")
	if wf != "" && !events.ValidWorkflowName(wf) {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "workflow", Message: fmt.Sprintf("%q is not a valid workflow name", wf)})
		return
	}
	t := s.at(r)
	feed := s.feeds[t.name]
	if feed == nil || !feed.Live() {
		w.Header().Set("Retry-After", RetryAfter)
		writeError(w, http.StatusServiceUnavailable, apiError{Code: "unavailable",
			Message: "the visibility index is being fed from the read models (the api started without a stored index, or a rebuild); retry in a moment"})
		return
	}
	if err := s.fresh(r.Context(), t.execs, feed); err != nil {
		s.internal(w, r, err)
		return
	}
	counts, err := feed.Store().Counts(r.Context(), wf)
	if err != nil {
		s.indexUnavailable(w, r, err)
		return
	}
	out := apiv1.ExecutionCounts{Counts: make(map[string]int, len(counts))}
	for st, n := range counts {
		out.Counts[string(st)] = n
		out.Total += n
	}
	writeJSON(w, http.StatusOK, out)
}

// fresh waits until the index holds what the read models held now: a list
// after a write the caller saw shows it, as a list read from the read
// models did.
func (s *Server) fresh(ctx context.Context, execs jetstream.KeyValue, feed *visibility.Feed) error {
	wctx, cancel := context.WithTimeout(ctx, s.cfg.freshWait)
	defer cancel()
	st, err := execs.Status(wctx)
	if err != nil {
		return fmt.Errorf("read the executions bucket's state: %w", err)
	}
	bs, ok := st.(*jetstream.KeyValueBucketStatus)
	if !ok {
		return nil
	}
	last := bs.StreamInfo().State.LastSeq
	err = feed.WaitFor(wctx, last)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		s.log.Warn().Uint64("revision", feed.Revision()).Uint64("bucket_revision", last).Dur("waited", s.cfg.freshWait).
			Msg("visibility: the index is behind the read models; listing from it as it is")
		return nil
	}
	return err
}

// attrNameRe is what a search attribute's name may be (workflow.SearchAttribute).
var attrNameRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// parseList reads GET /v1/executions's parameters; on a bad one it
// answers 400 naming it and returns false.
func parseList(w http.ResponseWriter, r *http.Request) (visibility.Query, bool) {
	params := r.URL.Query()
	q := visibility.Query{Limit: 50, Workflow: params.Get("workflow"), Status: projections.Status(params.Get("status"))}
	bad := func(field, format string, args ...any) (visibility.Query, bool) {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: field, Message: fmt.Sprintf(format, args...)})
		return q, false
	}
	if l := params.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			return bad("limit", "limit must be between 1 and 1000")
		}
		q.Limit = n
	}
	if v := params.Get("damaged"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil || !b {
			return bad("damaged", "damaged=%q: use damaged=true to list the damaged executions only", v)
		}
		q.Damaged = true
	}
	if q.Workflow != "" && !events.ValidWorkflowName(q.Workflow) {
		return bad("workflow", "%q is not a valid workflow name", q.Workflow)
	}
	if q.Status != "" && !slices.Contains(projections.ListedStatuses, q.Status) {
		names := make([]string, len(projections.ListedStatuses))
		for i, st := range projections.ListedStatuses {
			names[i] = string(st)
		}
		return bad("status", "status %q is not one of %s", q.Status, strings.Join(names, ", "))
	}
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"started_after", &q.StartedAfter}, {"started_before", &q.StartedBefore}, {"ended_after", &q.EndedAfter}, {"ended_before", &q.EndedBefore}} {
		v := params.Get(p.name)
		if v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return bad(p.name, "%s %q is not an RFC 3339 time (e.g. 2026-01-02T03:04:05Z)", p.name, v)
		}
		*p.dst = t
	}
	attrs := params["attr"]
	if len(attrs) > visibility.MaxAttrs {
		return bad("attr", "at most %d attr filters, not %d", visibility.MaxAttrs, len(attrs))
	}
	for _, a := range attrs {
		name, value, ok := strings.Cut(a, ":")
		if !ok || !attrNameRe.MatchString(name) {
			return bad("attr", "attr %q: give name:value, the name of a search attribute its workflow sets (e.g. attr=customer:acme)", a)
		}
		q.Attrs = append(q.Attrs, visibility.Attr{Name: name, Value: value})
	}
	// The default order is by id (the list's order before the index);
	// with a time range and no sort, the latest of that time first.
	switch sort := params.Get("sort"); {
	case sort != "":
		q.Sort = visibility.Sort(sort)
		if !q.Sort.Valid() {
			names := make([]string, len(visibility.Sorts))
			for i, s := range visibility.Sorts {
				names[i] = string(s)
			}
			return bad("sort", "sort %q is not one of %s", sort, strings.Join(names, ", "))
		}
	case !q.StartedAfter.IsZero() || !q.StartedBefore.IsZero():
		q.Sort = visibility.SortStartedDesc
	case !q.EndedAfter.IsZero() || !q.EndedBefore.IsZero():
		q.Sort = visibility.SortEndedDesc
	default:
		q.Sort = visibility.SortID
	}
	if a := params.Get("after"); a != "" {
		c, err := visibility.ParseCursor(q.Sort, a)
		if err != nil {
			return bad("after", "after %q is %v", a, err)
		}
		q.After = &c
	}
	return q, true
}
