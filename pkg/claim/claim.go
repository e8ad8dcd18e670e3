// Package claim owns the execution-id registry, the JF_EXECUTION_IDS
// bucket: every execution id ever used, with the start command that
// claimed it. Ids are unique forever: a claim is made with a KV create (two
// commands can never both own an id) and is kept, marked expired, after
// the janitor deleted the execution under its retention rule.
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

// ErrNotFound is returned for an execution id nobody claimed.
var ErrNotFound = errors.New("claim: execution id not claimed")

// Claim is the value stored under an execution id.
type Claim struct {
	// CommandKey is the start command's key (CloudEvent source#id).
	CommandKey string `json:"command_key"`
	// Digest is what the command asked for (events.StartExecution.Digest);
	// "" in claims written before it was recorded.
	Digest string `json:"digest,omitempty"`
	// Workflow is the execution's workflow.
	Workflow  string    `json:"workflow"`
	ClaimedAt time.Time `json:"claimed_at"`
	// ExpiredAt is when the janitor deleted the execution under its
	// retention rule; zero while it is kept. The id stays claimed.
	ExpiredAt time.Time `json:"expired_at,omitzero"`
}

// Decode reads a claim as stored.
func Decode(b []byte) (Claim, error) {
	var c Claim
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("decode execution id claim: %w", err)
	}
	return c, nil
}

// Expired reports whether the execution expired and was deleted.
func (c Claim) Expired() bool { return !c.ExpiredAt.IsZero() }

// Conflict says why a start command with key and digest is not the command
// that claimed the id ("" when it is: the same request again).
func (c Claim) Conflict(id, key, digest string) string {
	switch {
	case c.CommandKey != key:
		return fmt.Sprintf("execution id %q is already used (workflow %s); execution ids are unique forever", id, c.Workflow)
	case c.Digest != "" && digest != "" && c.Digest != digest:
		return fmt.Sprintf("execution %q was started by a request with the same key (CloudEvent source and id, or Idempotency-Key) and other data; "+
			"a key names one request: send the same data to get that execution, or use a new key (or id) for a new one", id)
	}
	return ""
}

// Store is the registry.
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

// KV is the bucket, for scans.
func (s *Store) KV() jetstream.KeyValue { return s.kv }

// Get returns the claim of id, or ErrNotFound.
func (s *Store) Get(ctx context.Context, id string) (Claim, error) {
	if !events.ValidExecutionID(id) {
		return Claim{}, ErrNotFound
	}
	e, err := s.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Claim{}, ErrNotFound
	}
	if err != nil {
		return Claim{}, fmt.Errorf("read claim of %s: %w", id, err)
	}
	return Decode(e.Value())
}

// Create claims id with c, unless it is claimed already: it returns the
// claim that holds the id (c when this call made it).
func (s *Store) Create(ctx context.Context, id string, c Claim) (Claim, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return Claim{}, err
	}
	if _, err := s.kv.Create(ctx, id, b); err == nil {
		return c, nil
	} else if !errors.Is(err, jetstream.ErrKeyExists) {
		return Claim{}, fmt.Errorf("claim execution id %s: %w", id, err)
	}
	return s.Get(ctx, id)
}

// MarkExpired records in the claim of id when its execution expired,
// keeping the claim (the id stays taken, and the api can tell an expired
// execution from an unknown one) and any field of it this version does not
// know. An id nobody claimed is left alone.
func (s *Store) MarkExpired(ctx context.Context, id string, at time.Time) error {
	for range 5 {
		e, err := s.kv.Get(ctx, id)
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
		_, err = s.kv.Update(ctx, id, b, e.Revision())
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("mark claim of %s expired: %w", id, err)
		}
	}
	return fmt.Errorf("mark claim of %s expired: too much contention", id)
}
