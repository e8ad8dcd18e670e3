package redact

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// Mask replaces a writeOnly input value in read models and api answers.
const Mask = "[redacted]"

// Input returns input with the value at each path (see
// [workflow.Definition.WriteOnlyPaths]) replaced by [Mask], and the text of
// every string and number it replaced (what a [Replacer] must hide
// elsewhere: a step's input or output, a variable, an error). input is
// returned as it is when no path leads to a value.
func Input(input json.RawMessage, paths [][]string) (json.RawMessage, []string) {
	if len(paths) == 0 || len(input) == 0 {
		return input, nil
	}
	v, err := decode(input)
	if err != nil {
		return input, nil
	}
	var found []string
	changed := false
	for _, p := range paths {
		var c bool
		v, c = maskPath(v, p, &found)
		changed = changed || c
	}
	if !changed {
		return input, nil
	}
	out, err := marshal(v)
	if err != nil {
		return input, nil
	}
	return out, found
}

// maskPath replaces the values at path in v, collecting their texts.
func maskPath(v any, path []string, found *[]string) (any, bool) {
	if len(path) == 0 {
		if v == nil {
			return v, false
		}
		collect(v, found)
		return Mask, true
	}
	changed := false
	switch t := v.(type) {
	case map[string]any:
		out := maps.Clone(t)
		for k, e := range t {
			if path[0] != workflow.AnyMember && k != path[0] {
				continue
			}
			var c bool
			out[k], c = maskPath(e, path[1:], found)
			changed = changed || c
		}
		return out, changed
	case []any:
		if path[0] != workflow.AnyMember {
			return v, false
		}
		out := slices.Clone(t)
		for i, e := range t {
			var c bool
			out[i], c = maskPath(e, path[1:], found)
			changed = changed || c
		}
		return out, changed
	}
	return v, false
}

// collect adds the text of every string and number in v.
func collect(v any, found *[]string) {
	switch t := v.(type) {
	case string:
		if t != "" && t != Mask && !slices.Contains(*found, t) {
			*found = append(*found, t)
		}
	case json.Number:
		if !slices.Contains(*found, t.String()) {
			*found = append(*found, t.String())
		}
	case map[string]any:
		for _, e := range t {
			collect(e, found)
		}
	case []any:
		for _, e := range t {
			collect(e, found)
		}
	}
}

// Inputs hides an execution's writeOnly input values (those its input
// schema marks writeOnly) in what read models and the api show: the
// input's members at their paths, and their values wherever else they
// appear as text. The zero Inputs hides nothing.
type Inputs struct {
	paths [][]string
	r     *Replacer
}

// ForStart returns the Inputs of the execution e started, from the
// definition and the input it records. It hides nothing when the schema
// marks nothing writeOnly.
func ForStart(e *events.ExecutionStarted) Inputs {
	if e == nil || !bytes.Contains(e.Definition, []byte(`"writeOnly"`)) {
		return Inputs{} // the common case, without decoding the definition
	}
	var d workflow.Definition
	var schema struct {
		Input map[string]any `json:"input"`
	}
	if json.Unmarshal(e.Definition, &schema) != nil {
		return Inputs{}
	}
	d.Input = schema.Input
	paths := d.WriteOnlyPaths()
	if len(paths) == 0 {
		return Inputs{}
	}
	_, values := Input(e.Input, paths)
	masks := make(map[string]string, len(values))
	for _, v := range values {
		masks[v] = Mask
	}
	return Inputs{paths: paths, r: New(masks)}
}

// FromHistory is [ForStart] for the execution whose history (from its
// start) is evs; it hides nothing if evs holds no start.
func FromHistory(evs []events.Event) Inputs {
	for _, ev := range evs {
		if start, ok := ev.Data.(*events.ExecutionStarted); ok {
			return ForStart(start)
		}
	}
	return Inputs{}
}

// Empty reports whether in hides nothing.
func (in Inputs) Empty() bool { return len(in.paths) == 0 }

// Execution returns x as a read model may show it: its input with the
// writeOnly members masked, and their values masked in its output and
// error, its steps' inputs, outputs and errors, its variables, signals and
// the reasons of operators' actions; Redacted set. x itself is not
// modified.
func (in Inputs) Execution(x projections.Execution) projections.Execution {
	if in.Empty() {
		return x
	}
	r := in.r
	x.Redacted = true
	x.Input, _ = Input(x.Input, in.paths)
	x.Input = r.JSON(x.Input)
	x.Output, x.Error = r.JSON(x.Output), r.String(x.Error)
	if x.Steps != nil {
		x.Steps = slices.Clone(x.Steps)
		for i := range x.Steps {
			st := &x.Steps[i]
			st.Input, st.Output, st.Error = r.JSON(st.Input), r.JSON(st.Output), r.String(st.Error)
		}
	}
	if x.RetiredSteps != nil { // left behind by a move to another version, with their values
		x.RetiredSteps = slices.Clone(x.RetiredSteps)
		for i := range x.RetiredSteps {
			st := &x.RetiredSteps[i]
			st.Input, st.Output, st.Error = r.JSON(st.Input), r.JSON(st.Output), r.String(st.Error)
		}
	}
	if x.Vars != nil {
		vars := make(map[string]json.RawMessage, len(x.Vars))
		for k, v := range x.Vars {
			vars[k] = r.JSON(v)
		}
		x.Vars = vars
	}
	if x.Signals != nil {
		x.Signals = slices.Clone(x.Signals)
		for i := range x.Signals {
			x.Signals[i].Data = r.JSON(x.Signals[i].Data)
		}
	}
	if x.Cancellation != nil {
		c := *x.Cancellation
		c.Reason = r.String(c.Reason)
		x.Cancellation = &c
	}
	if x.Replays != nil {
		x.Replays = slices.Clone(x.Replays)
		for i := range x.Replays {
			x.Replays[i].Reason = r.String(x.Replays[i].Reason)
		}
	}
	if x.VersionChanges != nil {
		x.VersionChanges = slices.Clone(x.VersionChanges)
		for i := range x.VersionChanges {
			x.VersionChanges[i].Reason = r.String(x.VersionChanges[i].Reason)
		}
	}
	return x
}

// EventData returns the data of an event of the execution as the api may
// show it: the start's input with its writeOnly members masked, and their
// values masked wherever they appear (a step's recorded input or output,
// a failure's error...).
func (in Inputs) EventData(typ events.Type, data json.RawMessage) json.RawMessage {
	if in.Empty() || len(data) == 0 {
		return data
	}
	if typ == events.TypeExecutionStarted {
		var m map[string]json.RawMessage
		if json.Unmarshal(data, &m) == nil && m["input"] != nil {
			masked, _ := Input(m["input"], in.paths)
			m["input"] = masked
			if b, err := marshal(m); err == nil {
				data = b
			}
		}
	}
	return in.r.JSON(data)
}
