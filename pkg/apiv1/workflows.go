package apiv1

import (
	"encoding/json"
	"time"
)

// Applied answers POST /v1/workflows: the version that holds the
// definition.
type Applied struct {
	// Created is true when this request stored a new version (201).
	Created bool `json:"created"`
	// CreatedAt is when that version was first stored.
	CreatedAt time.Time `json:"created_at"`
	// Digest is the SHA-256 of the definition's canonical JSON.
	Digest  string `json:"digest"`
	Name    string `json:"name"`
	Version int    `json:"version"`
}

// WorkflowSummary is a row of GET /v1/workflows: a workflow's latest
// version.
type WorkflowSummary struct {
	Name          string `json:"name"`
	LatestVersion int    `json:"latest_version"`
	Description   string `json:"description,omitempty"`
	// UpdatedAt is when the latest version was stored.
	UpdatedAt time.Time `json:"updated_at"`
}

// WorkflowList answers GET /v1/workflows, sorted by name.
type WorkflowList struct {
	Workflows []WorkflowSummary `json:"workflows"`
}

// WorkflowVersion is one stored version of a workflow, as GET
// /v1/workflows/{name}/versions/{version} answers it.
type WorkflowVersion struct {
	Name      string    `json:"name"`
	Version   int       `json:"version"`
	Digest    string    `json:"digest"`
	CreatedAt time.Time `json:"created_at"`
	// Definition is the definition as JSON (docs/workflow-language.md);
	// pkg/workflow's Definition decodes it.
	Definition json.RawMessage `json:"definition"`
	// YAML is the same definition as YAML, its fields in the workflow
	// language's order: what jetflow apply reads back as this definition.
	// The text it was applied from is not kept (nor its comments).
	YAML string `json:"yaml"`
}

// Workflow answers GET /v1/workflows/{name}: the latest version (the one
// a start by name takes) and every version number stored (one stored by an
// apply that stopped before making it the latest is listed, not latest).
type Workflow struct {
	Latest   WorkflowVersion `json:"latest"`
	Name     string          `json:"name"`
	Versions []int           `json:"versions"`
}
