package api

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/workflow"
)

// applyWorkflow registers a definition (YAML or JSON body). A changed
// definition becomes a new version; an unchanged one is a no-op (200).
func (s *Server) applyWorkflow(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, workflow.MaxSize+1))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, apiError{Code: "too_large", Message: fmt.Sprintf("definition exceeds %d bytes", workflow.MaxSize)})
		return
	}
	def, err := workflow.Parse(body)
	var verr *workflow.ValidationError
	if errors.As(err, &verr) {
		first := verr.Problems[0]
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid_definition", Message: verr.Error(), Field: first.Field, Problems: rawProblems(verr.Problems)})
		return
	}
	rec, created, err := s.at(r).defs.Apply(r.Context(), def)
	if errors.Is(err, catalog.ErrVersionTaken) {
		writeError(w, http.StatusConflict, apiError{Code: "conflict", Field: "version",
			Message: fmt.Sprintf("workflow %s version %d already holds another definition; versions never change: give a new version number, or none", def.Name, def.Version)})
		return
	}
	if errors.Is(err, catalog.ErrNoVersionLeft) {
		writeError(w, http.StatusConflict, apiError{Code: "conflict", Field: "version",
			Message: fmt.Sprintf("workflow %s holds version %d, the highest a version can have, and the registry numbers new ones past its highest: give this definition a free version number with version:", def.Name, workflow.MaxVersion)})
		return
	}
	if err != nil {
		s.internal(w, r, err)
		return
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, apiv1.Applied{Name: rec.Name, Version: rec.Version, Digest: rec.Digest,
		Created: created, CreatedAt: rec.CreatedAt})
}

// workflowSummary shows a workflow's latest version as listed.
func workflowSummary(s catalog.Summary) apiv1.WorkflowSummary {
	return apiv1.WorkflowSummary{Name: s.Name, LatestVersion: s.LatestVersion, Description: s.Description, UpdatedAt: s.UpdatedAt}
}

// workflowVersion shows a stored version of a workflow: its definition
// as JSON, and as YAML (rendered: the api keeps the definition, not the
// text it was applied from).
func workflowVersion(rec catalog.Record) (apiv1.WorkflowVersion, error) {
	def, err := rawJSON(rec.Definition)
	if err != nil {
		return apiv1.WorkflowVersion{}, fmt.Errorf("encode definition %s version %d: %w", rec.Name, rec.Version, err)
	}
	text, err := rec.Definition.YAML()
	if err != nil {
		return apiv1.WorkflowVersion{}, fmt.Errorf("definition %s version %d as YAML: %w", rec.Name, rec.Version, err)
	}
	return apiv1.WorkflowVersion{Name: rec.Name, Version: rec.Version, Digest: rec.Digest, CreatedAt: rec.CreatedAt, Definition: def, YAML: string(text)}, nil
}

func (s *Server) listWorkflows(w http.ResponseWriter, r *http.Request) {
	list, err := s.at(r).defs.List(r.Context())
	if err != nil {
		s.internal(w, r, err)
		return
	}
	out := make([]apiv1.WorkflowSummary, len(list))
	for i, sum := range list {
		out[i] = workflowSummary(sum)
	}
	writeJSON(w, http.StatusOK, apiv1.WorkflowList{Workflows: out})
}

// workflowName reads the workflow name in the path, answering 400 itself
// when it cannot be one.
func workflowName(w http.ResponseWriter, r *http.Request) (string, bool) {
	return pathValue(w, r, "name", "workflow name", events.WorkflowNameRule, events.ValidWorkflowName)
}

// executionID returns the request's {id}, or answers 400 naming the rule
// an execution id follows (an id that cannot exist is a mistake to say,
// not a 404).
func executionID(w http.ResponseWriter, r *http.Request) (string, bool) {
	return pathValue(w, r, "id", "execution id", events.ExecutionIDRule, events.ValidExecutionID)
}

// pathValue returns the request's path value key, or answers 400 naming
// the field and the rule (what) it breaks.
func pathValue(w http.ResponseWriter, r *http.Request, key, what, rule string, valid func(string) bool) (string, bool) {
	v := r.PathValue(key)
	if !valid(v) {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: key,
			Message: fmt.Sprintf("%q is not a valid %s: %s", v, what, rule)})
		return "", false
	}
	return v, true
}

func (s *Server) getWorkflow(w http.ResponseWriter, r *http.Request) {
	name, ok := workflowName(w, r)
	if !ok {
		return
	}
	// The latest is the one a start by name takes (the pointer's), not
	// always the highest stored: an apply that stopped before moving the
	// pointer leaves a version past it (catalog.Store.Get). Read first, so
	// that the versions read after it hold it.
	defs := s.at(r).defs
	rec, err := defs.Get(r.Context(), name, 0)
	if err != nil && !errors.Is(err, catalog.ErrNotFound) {
		s.internal(w, r, err)
		return
	}
	versions, verr := defs.Versions(r.Context(), name)
	if verr != nil && !errors.Is(verr, catalog.ErrNotFound) {
		s.internal(w, r, verr)
		return
	}
	if err != nil || verr != nil {
		msg := fmt.Sprintf("workflow %q is not registered", name)
		if verr == nil { // versions stored, none made the latest
			msg += ": no apply of it completed (apply it again)"
		}
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Field: "name", Message: msg})
		return
	}
	nums := make([]int, len(versions))
	for i, v := range versions {
		nums[i] = v.Version
	}
	latest, err := workflowVersion(rec)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, apiv1.Workflow{Name: latest.Name, Latest: latest, Versions: nums})
}

func (s *Server) getWorkflowVersion(w http.ResponseWriter, r *http.Request) {
	if _, ok := workflowName(w, r); !ok {
		return
	}
	v, err := strconv.Atoi(r.PathValue("version"))
	if err != nil || v < 1 {
		writeError(w, http.StatusBadRequest, apiError{Code: "invalid", Field: "version", Message: "version must be a positive integer"})
		return
	}
	rec, err := s.at(r).defs.Get(r.Context(), r.PathValue("name"), v)
	if errors.Is(err, catalog.ErrNotFound) {
		writeError(w, http.StatusNotFound, apiError{Code: "not_found", Field: "version",
			Message: fmt.Sprintf("workflow %q has no version %d", r.PathValue("name"), v)})
		return
	}
	if err != nil {
		s.internal(w, r, err)
		return
	}
	out, err := workflowVersion(rec)
	if err != nil {
		s.internal(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
