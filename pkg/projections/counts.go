package projections

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// StepCounts counts the step instances of a stored read model's step
// table: the projector stores them before the table (member
// "step_counts"), and the table last, so that a reader that wants only
// the other members and how far the execution is (the visibility index,
// the janitor's sweep) can stop before the table (StoredHead), which
// makes most of a large model's bytes.
type StepCounts struct {
	// Steps counts the instances in the table, Done those that are done
	// (succeeded, or skipped: OpStatus.Done). Instances left out of a
	// truncated model are not counted (see Execution.Truncated).
	Steps int `json:"steps"`
	Done  int `json:"done"`
}

// CountSteps counts steps.
func CountSteps(steps []Step) StepCounts {
	c := StepCounts{Steps: len(steps)}
	for i := range steps {
		if steps[i].Status.Done() {
			c.Done++
		}
	}
	return c
}

// StoredHead returns the members of a stored read model b that come
// before its step table, as a JSON object to decode as any model is (the
// same names, in any case, as json.Unmarshal reads them), and the counts
// stored before the table: ok when b has its step counts before its step
// table, as the projector stores it. Otherwise (a model stored before
// the counts were, or written by hand, whose table may come before other
// members; a document that is not an object) it returns !ok: decode b
// whole. Neither the table nor members after it (the projector writes
// none) are read, nor checked: a document broken after the start of its
// table still gives its head.
func StoredHead(b []byte) (head []byte, counts StepCounts, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, counts, false
	}
	seen := false
	var skip json.RawMessage // reused: RawMessage decodes into its own capacity
	for dec.More() {
		end := dec.InputOffset() // just after the member before (or the brace)
		t, err := dec.Token()
		key, isKey := t.(string)
		if err != nil || !isKey {
			return nil, counts, false
		}
		switch key {
		case "steps":
			if !seen {
				return nil, counts, false
			}
			head = make([]byte, 0, end+1)
			return append(append(head, b[:end]...), '}'), counts, true
		case "step_counts":
			counts, seen = StepCounts{}, true
			if dec.Decode(&counts) != nil {
				return nil, counts, false
			}
		default:
			if dec.Decode(&skip) != nil {
				return nil, counts, false
			}
		}
	}
	return nil, counts, false
}

// stored is a read model as stored: the execution, then the counts of
// its step table, then the table. encoding/json puts the fields of an
// embedded struct first, in their order, and Steps here hides the
// execution's own.
type stored struct {
	Execution
	StepCounts StepCounts      `json:"step_counts"`
	Steps      json.RawMessage `json:"steps"`
}

// storedTail ends the encoding of a stored model whose step table is left
// to be appended (Steps nil).
var storedTail = []byte(`,"steps":null}`)

// EncodeStored encodes x as a read model is stored: its members as
// json.Marshal writes them, then "step_counts" (CountSteps), then its
// step table, last. table is the table's JSON when the caller has it
// (the projector encodes again only the instances that changed), nil to
// encode x.Steps here.
func EncodeStored(x Execution, table []byte) ([]byte, error) {
	if table == nil {
		var err error
		if table, err = json.Marshal(x.Steps); err != nil {
			return nil, err
		}
	}
	head, err := json.Marshal(stored{Execution: x, StepCounts: CountSteps(x.Steps)})
	if err != nil {
		return nil, err
	}
	if !bytes.HasSuffix(head, storedTail) {
		return nil, fmt.Errorf("encode read model %s: the step table is not last", x.ID)
	}
	// Appended as it is: given to encoding/json as a RawMessage, the
	// table would be scanned again, which for a large one costs most of
	// what encoding only its changed instances saves.
	keep := len(head) - len("null}")
	b := make([]byte, 0, keep+len(table)+1)
	b = append(append(b, head[:keep]...), table...)
	return append(b, '}'), nil
}
