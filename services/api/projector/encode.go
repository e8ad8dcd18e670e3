package projector

import (
	"encoding/json"
	"fmt"
	"hash/maphash"
	"time"
	"unsafe"

	"jetflow.dev/pkg/projections"
)

// A read model is rewritten for every few of its events, and most of a
// large model's bytes are its step table, of which one or two instances
// change between two writes. Encoded whole at every write, a step cost
// more the longer its execution was (a 200-step execution's steps cost
// three times a 10-step one's, a quarter of it encoding and decoding read
// models). So the projector keeps each cached model's step encodings and
// encodes again only the instances that changed, and stores the step
// table last, after its counts, for readers that want only those
// (the visibility index).

// encodeModel encodes x as stored (projections.EncodeStored), its step
// table with c (nil: encoded anew).
func encodeModel(x projections.Execution, c *stepCache) ([]byte, error) {
	table, err := c.encode(x.Steps)
	if err != nil {
		return nil, err
	}
	return projections.EncodeStored(x, table)
}

// stepCache is the encoding of each instance of one model's step table
// as last encoded, with a fingerprint of the instance it encodes
// (stepPrint): a copy of each instance would double what a cached large
// model holds, and the cache is bounded by bytes.
type stepCache struct {
	prints []uint64
	enc    [][]byte
}

// cacheStepsOver is the smallest step table whose encodings a cached
// model keeps: encoding a small one anew costs too little to measure.
const cacheStepsOver = 32

// encode returns the JSON array of steps, as json.Marshal writes it,
// encoding again only the instances whose fingerprint differs from that
// of the one at the same place last time, and keeps the result for next
// time. A nil c, or a table of no more than cacheStepsOver instances
// (then c keeps nothing), is encoded whole.
func (c *stepCache) encode(steps []projections.Step) ([]byte, error) {
	if c == nil || len(steps) <= cacheStepsOver {
		if c != nil {
			c.prints, c.enc = nil, nil
		}
		return json.Marshal(steps)
	}
	if len(c.enc) > len(steps) {
		clear(c.enc[len(steps):])
		c.prints, c.enc = c.prints[:len(steps)], c.enc[:len(steps)]
	}
	n := 1 + len(steps)
	for i := range steps {
		st := &steps[i]
		print := stepPrint(st)
		if i < len(c.enc) && c.prints[i] == print {
			n += len(c.enc[i])
			continue
		}
		b, err := json.Marshal(st)
		if err != nil {
			c.prints, c.enc = nil, nil // part updated: its fingerprints may no longer match its encodings
			return nil, fmt.Errorf("encode step %s: %w", st.ID, err)
		}
		n += len(b)
		if i < len(c.enc) {
			c.prints[i], c.enc[i] = print, b
		} else {
			c.prints, c.enc = append(c.prints, print), append(c.enc, b)
		}
	}
	out := make([]byte, 0, n)
	out = append(out, '[')
	for i, b := range c.enc {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, b...)
	}
	return append(out, ']'), nil
}

// size estimates the bytes c holds.
func (c *stepCache) size() int {
	if c == nil {
		return 0
	}
	n := cap(c.prints)*8 + cap(c.enc)*int(unsafe.Sizeof([]byte(nil)))
	for _, b := range c.enc {
		n += cap(b)
	}
	return n
}

// printSeed seeds the fingerprints of this process.
var printSeed = maphash.MakeSeed()

// stepPrint is a 64-bit fingerprint of every field of st that
// encoding/json writes (TestStepPrintCoversEveryField holds it to every
// exported field): two instances with the same fingerprint encode the
// same but for a collision of a 64-bit hash, seeded anew in each process.
// A time in another location counts as different (its encoding names the
// offset). Strings and values are hashed in one call each: a streaming
// hash, fed field by field, cost more than encoding the changed
// instances.
func stepPrint(st *projections.Step) uint64 {
	h := uint64(len(st.ID))
	str := func(s string) { h = mix(h, maphash.String(printSeed, s)) }
	num := func(v int64) { h = mix(h, uint64(v)) }
	at := func(t time.Time) {
		_, off := t.Zone()
		num(t.Unix())
		num(int64(t.Nanosecond()) | int64(off)<<32)
	}
	flags := func(bs ...bool) {
		var f int64
		for i, b := range bs {
			if b {
				f |= 1 << i
			}
		}
		num(f)
	}
	str(st.ID)
	str(st.Kind)
	str(string(st.Status))
	num(int64(st.Attempt))
	str(st.TaskID)
	num(int64(st.TaskSeq))
	str(st.Queue)
	str(st.Agent)
	num(int64(st.Delivery))
	h = mix(h, maphash.Bytes(printSeed, st.Input))
	h = mix(h, maphash.Bytes(printSeed, st.Output))
	str(st.Error)
	str(st.Child)
	str(st.ChildWorkflow)
	flags(st.Stopped, st.Final, st.Lost, st.AfterEnd != nil)
	if a := st.AfterEnd; a != nil {
		str(string(a.Outcome))
		str(a.Error)
		str(a.Agent)
		at(a.At)
	}
	str(st.Token)
	num(int64(st.RetryBase))
	num(int64(st.Entered))
	num(int64(st.Completed))
	at(st.WaitUntil)
	at(st.SleptFrom)
	at(st.ScheduledAt)
	at(st.SentAt)
	at(st.StartedAt)
	at(st.EndedAt)
	return h
}

// mix folds v into the hash h (a multiply-xorshift step: each field moves
// every bit of what follows).
func mix(h, v uint64) uint64 {
	h = (h ^ v) * 0x9e3779b97f4a7c15
	return h ^ h>>32
}
