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
	head, counts, ok = storedHead(b)
	if !ok || !json.Valid(head) {
		return nil, counts, false
	}
	return head, counts, true
}

// DecodeStoredHead decodes the head of a stored read model b (StoredHead)
// into v, as json.Unmarshal does, and returns the counts stored before
// the table; ok is false when b has no head (decode b whole) or its head
// does not decode into v (which may then hold part of it: decode b whole
// into a v made anew). It is StoredHead and json.Unmarshal with one
// check of the head's bytes, not two: json.Unmarshal checks its input
// whole before it decodes it, and the head of a small model is most of
// it (the janitor's index and the visibility index read a model's head
// at each write of it).
func DecodeStoredHead(b []byte, v any) (counts StepCounts, ok bool) {
	head, counts, ok := storedHead(b)
	if !ok || json.Unmarshal(head, v) != nil {
		return counts, false
	}
	return counts, true
}

// storedHead is StoredHead but for the check that the head is JSON: a
// head that is not comes back ok.
func storedHead(b []byte) (head []byte, counts StepCounts, ok bool) {
	// A scan of the top object's members that skips each value by its
	// brackets and strings, with no token and no allocation (encoding/json's
	// Decoder took a dozen allocations a member, and the visibility index
	// reads a model's head at each of its writes); the head is then
	// checked whole, as the Decoder checked each member, and the counts
	// decoded. It reads what the Decoder read, and stops where it stopped
	// (FuzzStoredHead holds the two to the same answers), but for a head
	// the Decoder took that does not decode as a whole (a member nested
	// exactly encoding/json's 10,000 deep, one more as part of the
	// head), which it refuses: its callers could not decode it anyway.
	i := skipSpace(b, 0)
	if i == len(b) || b[i] != '{' {
		return nil, counts, false
	}
	i++
	seen := false
	for first := true; ; first = false {
		i = skipSpace(b, i)
		if i == len(b) || b[i] == '}' || b[i] == ']' {
			return nil, counts, false // no table
		}
		end := i // the member before (or the brace), and the space after it
		if !first {
			if b[i] != ',' {
				return nil, counts, false
			}
			i = skipSpace(b, i+1)
		}
		kstart := i
		if i = skipString(b, i); i < 0 {
			return nil, counts, false
		}
		key, kok := memberKey(b[kstart:i])
		switch {
		case !kok:
			return nil, counts, false
		case key == keySteps:
			if !seen {
				return nil, counts, false
			}
			head = make([]byte, 0, end+1)
			head = append(append(head, b[:end]...), '}')
			return head, counts, true
		}
		if i = skipSpace(b, i); i == len(b) || b[i] != ':' {
			return nil, counts, false
		}
		vstart := skipSpace(b, i+1)
		if i = skipValue(b, vstart); i < 0 {
			return nil, counts, false
		}
		if key == keyCounts {
			counts, seen = StepCounts{}, true
			if json.Unmarshal(b[vstart:i], &counts) != nil {
				return nil, counts, false
			}
		}
	}
}

// The members StoredHead tells apart.
type headKey uint8

const (
	keyOther  headKey = iota
	keySteps          // "steps": the table
	keyCounts         // "step_counts"
)

// skipSpace returns the index of the first byte of b from i on that is
// not JSON whitespace (len(b) if none).
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index just after the JSON string at b[i], -1
// if there is none (its escapes are not checked here).
func skipString(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// skipValue returns the index just after the JSON value at b[i], -1 if
// its brackets and strings do not close. Scalars are taken up to the
// next delimiter: the head's own check finds any that is malformed.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	depth := 0
	for ; i < len(b); i++ {
		switch b[i] {
		case '"':
			end := skipString(b, i)
			if end < 0 || depth == 0 {
				return end
			}
			i = end - 1 // the closing quote
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				return i // the end of the object the value is in
			}
			if depth--; depth == 0 {
				return i + 1
			}
		case ',', ' ', '\t', '\n', '\r', ':':
			if depth == 0 {
				return i
			}
		}
	}
	if depth == 0 {
		return i
	}
	return -1
}

// memberKey tells which member a key, as its JSON string, names: as it
// is unless it has escapes, which json.Unmarshal then reads (rarely: the
// keys of read models have none). !ok: the escapes are malformed.
func memberKey(raw []byte) (headKey, bool) {
	name := raw[1 : len(raw)-1]
	if bytes.IndexByte(name, '\\') >= 0 {
		var key string
		if json.Unmarshal(raw, &key) != nil {
			return keyOther, false
		}
		name = []byte(key)
	}
	switch string(name) {
	case "steps":
		return keySteps, true
	case "step_counts":
		return keyCounts, true
	}
	return keyOther, true
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
