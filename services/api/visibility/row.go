package visibility

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// MaxAttrValue is the longest search attribute value indexed, in bytes: a
// longer one (an input member holding a document) is left out, so a
// row's size stays bounded.
const MaxAttrValue = 256

// model is the part of a read model a row is made from: decoding only
// that spares the step instances' inputs and outputs, which make most of
// a large read model's bytes.
type model struct {
	ID        string                                  `json:"id"`
	Workflow  string                                  `json:"workflow"`
	Version   int                                     `json:"version"`
	Status    projections.Status                      `json:"status"`
	Input     json.RawMessage                         `json:"input"`
	Error     string                                  `json:"error"`
	Vars      map[string]json.RawMessage              `json:"vars"`
	Steps     []struct{ Status projections.OpStatus } `json:"steps"`
	StartedAt time.Time                               `json:"started_at"`
	EndedAt   time.Time                               `json:"ended_at"`
	UpdatedAt time.Time                               `json:"updated_at"`
	Damaged   *projections.Damage                     `json:"damaged"`
	Truncated *projections.Truncation                 `json:"truncated"`
	// counts, with Steps unread, are the step table's counts the
	// projector stored before it (decodeHead).
	counts *projections.StepCounts
}

// decodeModel reads a stored read model. Of one the projector stored,
// whose step counts come before its step table, the table is not read
// (decodeHead); any other is decoded whole.
func decodeModel(b []byte) (model, error) {
	if m, ok := decodeHead(b); ok {
		return m, nil
	}
	var m model
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("decode read model: %w", err)
	}
	return m, nil
}

// decodeHead reads the members of a read model stored with its step
// counts before its step table, up to the table (projections.StoredHead):
// the table is most of a large model's bytes, and reading it at every
// write made each step of a large execution cost more.
func decodeHead(b []byte) (model, bool) {
	var m model
	counts, ok := projections.DecodeStoredHead(b, &m)
	if !ok {
		return model{}, false
	}
	m.Steps, m.counts = nil, &counts
	return m, true
}

// RowOf is the row of a read model x, with the values of the search
// attributes attrs (its workflow version's). It is the list's summary of
// an execution, whether the list comes from the index or from the read
// models.
func RowOf(x projections.Execution, attrs []workflow.SearchAttribute) Row {
	m := model{ID: x.ID, Workflow: x.Workflow, Version: x.Version, Status: x.Status, Input: x.Input, Error: x.Error, Vars: x.Vars,
		StartedAt: x.StartedAt, EndedAt: x.EndedAt, UpdatedAt: x.UpdatedAt, Damaged: x.Damaged, Truncated: x.Truncated}
	m.Steps = make([]struct{ Status projections.OpStatus }, len(x.Steps))
	for i, st := range x.Steps {
		m.Steps[i].Status = st.Status
	}
	return m.row(attrs)
}

func (m model) row(attrs []workflow.SearchAttribute) Row {
	r := Row{ID: m.ID, Workflow: m.Workflow, Version: m.Version, Status: m.Status, Error: m.Error, Damaged: m.Damaged,
		StartedAt: m.StartedAt.UTC(), EndedAt: m.EndedAt.UTC(), UpdatedAt: m.UpdatedAt.UTC(), Steps: len(m.Steps)}
	for _, st := range m.Steps {
		if st.Status.Done() { // succeeded or skipped, as the instances a truncation leaves out
			r.Done++
		}
	}
	if c := m.counts; c != nil {
		r.Steps, r.Done = c.Steps, c.Done
	}
	if t := m.Truncated; t != nil {
		r.Steps += t.Steps
		if !t.Summary { // the steps left out are finished ones
			r.Done += t.Steps
		}
	}
	for _, a := range attrs {
		var raw json.RawMessage
		switch a.From {
		case workflow.SearchFromInput:
			var in map[string]json.RawMessage
			if json.Unmarshal(m.Input, &in) != nil {
				continue
			}
			raw = in[a.Name]
		case workflow.SearchFromVars:
			raw = m.Vars[a.Name]
		}
		if v, ok := AttrValue(raw); ok {
			if r.Attrs == nil {
				r.Attrs = map[string]string{}
			}
			r.Attrs[a.Name] = v
		}
	}
	return r
}

// AttrValue is the value a search attribute is indexed and searched by:
// a JSON string's text, a number's or boolean's JSON (120, 1.5, true). A
// null, object or array (among them a value the read model replaced by a
// note, being too large), or a value over MaxAttrValue bytes, is not
// indexed.
func AttrValue(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || len(raw) > 6*MaxAttrValue+2 {
		return "", false
	}
	var v string
	switch c := raw[0]; {
	case c == '"':
		if json.Unmarshal(raw, &v) != nil {
			return "", false
		}
	case c == 't' || c == 'f' || c == '-' || (c >= '0' && c <= '9'):
		v = string(raw)
	default:
		return "", false
	}
	if len(v) > MaxAttrValue {
		return "", false
	}
	return v, true
}
