// Package claim owns the execution-id registry, the JF_EXECUTION_IDS
// bucket: every execution id ever used, with the start command that
// claimed it. Ids are unique forever: a claim is made with a KV create (two
// commands can never both own an id) and is kept, marked expired, after
// the janitor deleted the execution under its retention rule. Nothing
// deletes a claim.
//
// This package is the only one that reads or writes the bucket's records,
// encodes or decodes them, or knows under which key one is stored: the
// api, the dispatcher, the janitor and the benchmark all go through
// [Store].
package claim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
)

var (
	// ErrNotFound is returned for an execution id nobody claimed.
	ErrNotFound = errors.New("claim: execution id not claimed")
	// ErrConflict is what a [*ConflictError] is: the id is held by another
	// request.
	ErrConflict = errors.New("claim: execution id held by another request")
	// ErrInvalid is returned for an id that cannot be an execution id, or
	// a record that names no command or workflow.
	ErrInvalid = errors.New("claim: invalid claim")
)

// Record is the value stored under an execution id, as JSON. Its members
// never change meaning: records written by any earlier version still
// read, and a member this version does not know is kept by
// [Store.MarkExpired].
type Record struct {
	// CommandKey is the start command's key (CloudEvent source#id).
	CommandKey string `json:"command_key"`
	// Digest is what the command asked for (events.StartExecution.Digest);
	// "" in records written before it was recorded.
	Digest string `json:"digest,omitempty"`
	// Workflow is the execution's workflow.
	Workflow  string    `json:"workflow"`
	ClaimedAt time.Time `json:"claimed_at"`
	// ExpiredAt is when the janitor deleted the execution under its
	// retention rule; zero while it is kept. The id stays claimed.
	ExpiredAt time.Time `json:"expired_at,omitzero"`
}

// Started is the record of the claim that the start p records made: the
// dispatcher appends execution.started only for the command holding the
// id, so its command key and digest are the claim's. (ClaimedAt is not in
// the event and is left zero.)
func Started(p *events.ExecutionStarted) Record {
	return Record{CommandKey: p.CommandKey, Digest: p.CommandDigest, Workflow: p.Workflow}
}

// Expired reports whether the execution expired and was deleted.
func (r Record) Expired() bool { return !r.ExpiredAt.IsZero() }

// Check reports whether the start command with key and digest is the
// request that made r, the claim of id: nil when it is (the same request
// again), else a [*ConflictError] saying why not. A record written before
// digests were recorded agrees with any digest.
func (r Record) Check(id, key, digest string) error {
	switch {
	case r.CommandKey != key:
		return &ConflictError{ID: id, Held: r, Reason: fmt.Sprintf(
			"execution id %q is already used (workflow %s); execution ids are unique forever", id, r.Workflow)}
	case r.Digest != "" && digest != "" && r.Digest != digest:
		return &ConflictError{ID: id, Held: r, Reason: fmt.Sprintf(
			"execution %q was started by a request with the same key (CloudEvent source and id, or Idempotency-Key) and other data; "+
				"a key names one request: send the same data to get that execution, or use a new key (or id) for a new one", id)}
	}
	return nil
}

// ConflictError is a start refused because another request holds its
// execution id. Its Error is one line for people.
type ConflictError struct {
	// ID is the execution id.
	ID string
	// Held is the record that holds it.
	Held Record
	// Reason says why the start is not the request that holds the id.
	Reason string
}

func (e *ConflictError) Error() string { return e.Reason }

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// key is the KV key of the claim of id: the id itself, which the
// execution id rule (events.ValidExecutionID) keeps within what a key may
// hold.
func key(id string) (string, error) {
	if !events.ValidExecutionID(id) {
		return "", fmt.Errorf("%w: %q is not a valid execution id: %s", ErrInvalid, id, events.ExecutionIDRule)
	}
	return id, nil
}

// Subject is the NATS subject the claim of id is stored on, as NATS
// permissions see a write to it.
func Subject(id string) string { return bus.BucketSubject(bus.BucketExecutionIDs, id) }

// decode reads a record as stored.
func decode(b []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("decode execution id claim: %w", err)
	}
	return r, nil
}

// Store is the registry. It is safe for concurrent use.
type Store struct {
	kv jetstream.KeyValue
}

// Open binds to the bucket (created by the bootstrap, see package bus).
func Open(ctx context.Context, js jetstream.JetStream) (*Store, error) {
	kv, err := js.KeyValue(ctx, bus.BucketExecutionIDs)
	if err != nil {
		return nil, fmt.Errorf("open execution ids bucket: %w", err)
	}
	return &Store{kv: kv}, nil
}

// Get returns the claim of id, or ErrNotFound (also for an id that cannot
// be an execution id: nobody can have claimed it).
func (s *Store) Get(ctx context.Context, id string) (Record, error) {
	k, err := key(id)
	if err != nil {
		return Record{}, ErrNotFound
	}
	e, err := s.kv.Get(ctx, k)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, fmt.Errorf("read claim of %s: %w", id, err)
	}
	return decode(e.Value())
}

// Claim claims id for the start command r records, with a KV create: of
// any number of commands naming one id, one only ever gets it. It returns
// the record that holds the id: r when this call made it, the stored one
// when the same request (r.CommandKey and r.Digest, see [Record.Check])
// claimed it before, as a re-delivered or re-published command does; that
// record's Expired may then say that its execution has since been deleted.
// When another request holds the id it returns that request's record and
// a [*ConflictError].
func (s *Store) Claim(ctx context.Context, id string, r Record) (Record, error) {
	held, _, err := s.ClaimNew(ctx, id, r)
	return held, err
}

// ClaimNew is Claim, and also reports whether this call made the claim
// (made: nobody had claimed id before, so no start of it can have been
// recorded, whoever recorded it).
func (s *Store) ClaimNew(ctx context.Context, id string, r Record) (_ Record, made bool, _ error) {
	k, err := key(id)
	if err != nil {
		return Record{}, false, err
	}
	if r.CommandKey == "" || r.Workflow == "" {
		return Record{}, false, fmt.Errorf("%w: the claim of %s names no command or no workflow", ErrInvalid, id)
	}
	r.ClaimedAt = r.ClaimedAt.UTC()
	b, err := json.Marshal(r)
	if err != nil {
		return Record{}, false, err
	}
	if _, err := s.kv.Create(ctx, k, b); err == nil {
		return r, true, nil
	} else if !bus.KeyChanged(err) {
		return Record{}, false, fmt.Errorf("claim execution id %s: %w", id, err)
	}
	held, err := s.Get(ctx, id)
	if err != nil {
		return Record{}, false, err
	}
	return held, false, held.Check(id, r.CommandKey, r.Digest)
}

// MarkExpired records in the claim of id when its execution expired,
// keeping the claim (the id stays taken, and the api can tell an expired
// execution from an unknown one) and any member of it this version does
// not know. It is a compare-and-set: a record written meanwhile is read
// again. An id nobody claimed is left alone, and a record marked already
// keeps its first time.
func (s *Store) MarkExpired(ctx context.Context, id string, at time.Time) error {
	k, err := key(id)
	if err != nil {
		return err
	}
	for range 5 {
		e, err := s.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read claim of %s: %w", id, err)
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(e.Value(), &fields); err != nil {
			return fmt.Errorf("decode claim of %s: %w", id, err)
		}
		if _, done := fields["expired_at"]; done {
			return nil
		}
		fields["expired_at"], _ = json.Marshal(at.UTC())
		b, err := json.Marshal(fields)
		if err != nil {
			return err
		}
		_, err = s.kv.Update(ctx, k, b, e.Revision())
		if err == nil {
			return nil
		}
		if !bus.KeyChanged(err) {
			return fmt.Errorf("mark claim of %s expired: %w", id, err)
		}
	}
	return fmt.Errorf("mark claim of %s expired: too much contention", id)
}

// Each calls fn with every claimed id and its record, as the bucket holds
// them when it is called, and stops at the first error fn returns (which
// it returns). A record that does not decode is an error too.
func (s *Store) Each(ctx context.Context, fn func(id string, r Record) error) error {
	err := bus.EachEntry(ctx, s.kv, func(e jetstream.KeyValueEntry) error {
		r, err := decode(e.Value())
		if err != nil {
			return fmt.Errorf("claim of %s: %w", e.Key(), err)
		}
		return fn(e.Key(), r)
	}, jetstream.IgnoreDeletes())
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("read execution id claims: %w", err)
	}
	return err
}
