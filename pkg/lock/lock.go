// Package lock keeps jetflow's workflow locks in the JF_LOCKS key-value
// bucket: one key per lock name, whose value is a [Record] of the lock's
// holders, its waiters in the order they asked, and how many holders it
// allows. Every change is a compare-and-set: a Create for a lock nobody
// holds, an Update with the revision that was read, a Delete with the last
// revision when the lock is free again. A write based on a stale read
// fails and is retried on a fresh read, so two writers can never both
// win, and no more than Limit scopes are ever listed as holders.
//
// Only the dispatcher changes the bucket (and records each change in the
// history of the execution concerned); the api and the janitor read it.
package lock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
)

// Entry is a scope of an execution that holds or waits for a lock.
type Entry struct {
	ExecutionID string `json:"execution_id"`
	Workflow    string `json:"workflow"`
	// Path is "" for the whole workflow, else the workflow step's path.
	Path string `json:"path,omitempty"`
	// Request numbers the scope's requests (the history counts them): a
	// scope that asks again after a release is a new entry, so that a late
	// removal of its old entry can never take away the new one.
	Request int `json:"request"`
	// Since is when it became a holder (holders) or asked (waiters).
	Since time.Time `json:"since"`
}

// Same reports whether e and o are the same request of the same scope.
func (e Entry) Same(o Entry) bool {
	return e.ExecutionID == o.ExecutionID && e.Path == o.Path && e.Request == o.Request
}

// Record is the value of a lock's key.
type Record struct {
	// Limit is how many holders the lock allows (1: a mutex).
	Limit   int     `json:"limit"`
	Holders []Entry `json:"holders"`
	// Waiters are in the order they asked: the first is promoted first.
	Waiters []Entry `json:"waiters,omitempty"`
}

// Holds reports whether e is a holder.
func (r Record) Holds(e Entry) bool { return slices.ContainsFunc(r.Holders, e.Same) }

// Waits reports whether e is a waiter.
func (r Record) Waits(e Entry) bool { return slices.ContainsFunc(r.Waiters, e.Same) }

// Errors.
var (
	// ErrInvalidName is returned for a name that cannot be a lock's key.
	ErrInvalidName = errors.New("lock: invalid lock name")
	// ErrBusy means the compare-and-set kept losing to other writers.
	ErrBusy = errors.New("lock: too many concurrent changes, try again")
)

// maxTries bounds the compare-and-set retries of one change.
const maxTries = 200

// Table is the lock bucket.
type Table struct {
	kv  jetstream.KeyValue
	now func() time.Time
}

// Open binds to the lock bucket (created by bus.Ensure).
func Open(ctx context.Context, js jetstream.JetStream, now func() time.Time) (*Table, error) {
	kv, err := js.KeyValue(ctx, bus.BucketLocks)
	if err != nil {
		return nil, fmt.Errorf("open locks bucket: %w", err)
	}
	if now == nil {
		now = time.Now
	}
	return &Table{kv: kv, now: now}, nil
}

// KV is the underlying bucket (for watches).
func (t *Table) KV() jetstream.KeyValue { return t.kv }

// Get returns a lock's record and revision; found is false if nobody
// holds or waits for it.
func (t *Table) Get(ctx context.Context, name string) (r Record, rev uint64, found bool, err error) {
	if !events.ValidLockName(name) {
		return r, 0, false, fmt.Errorf("%w %q: %s", ErrInvalidName, name, events.LockNameRule)
	}
	e, err := t.kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return r, 0, false, nil
	}
	if err != nil {
		return r, 0, false, fmt.Errorf("read lock %s: %w", name, err)
	}
	r, err = Decode(e.Value())
	if err != nil {
		return r, 0, false, fmt.Errorf("lock %s: %w", name, err)
	}
	return r, e.Revision(), true, nil
}

// Decode parses a lock's value.
func Decode(b []byte) (Record, error) {
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("decode lock record: %w", err)
	}
	return r, nil
}

// List returns every lock by name.
func (t *Table) List(ctx context.Context) (map[string]Record, error) {
	out := map[string]Record{}
	lister, err := t.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list locks: %w", err)
	}
	for name := range lister.Keys() {
		r, _, found, err := t.Get(ctx, name)
		if err != nil {
			return nil, err
		}
		if found {
			out[name] = r
		}
	}
	return out, nil
}

// Enqueue asks for lock name on behalf of e: e becomes a holder at once if
// fewer than the limit hold it and nobody waits before it; otherwise it
// waits at the end of the queue. Asking again changes nothing and reports
// where e is. limit is used when the lock's record is created; an existing
// record keeps its own limit.
func (t *Table) Enqueue(ctx context.Context, name string, limit int, e Entry) (held bool, err error) {
	limit = min(max(limit, 1), events.MaxSemaphore)
	for range maxTries {
		r, rev, found, err := t.Get(ctx, name)
		if err != nil {
			return false, err
		}
		switch {
		case r.Holds(e):
			return true, nil
		case r.Waits(e):
			return false, nil
		}
		e.Since = t.now().UTC()
		if !found {
			r = Record{Limit: limit, Holders: []Entry{e}}
			if _, err := t.kv.Create(ctx, name, encode(r)); err != nil {
				if conflict(err) {
					continue
				}
				return false, fmt.Errorf("create lock %s: %w", name, err)
			}
			return true, nil
		}
		held = len(r.Holders) < max(r.Limit, 1) && len(r.Waiters) == 0
		if held {
			r.Holders = append(r.Holders, e)
		} else {
			r.Waiters = append(r.Waiters, e)
		}
		if _, err := t.kv.Update(ctx, name, encode(r), rev); err != nil {
			if conflict(err) {
				continue
			}
			return false, fmt.Errorf("update lock %s: %w", name, err)
		}
		return held, nil
	}
	return false, ErrBusy
}

// Remove takes e out of lock name's holders and waiters, and promotes the
// first waiters to holders while the limit allows. When nobody is left the
// key is deleted with its last revision. It reports whether e was listed
// and which waiters it promoted.
func (t *Table) Remove(ctx context.Context, name string, e Entry) (removed bool, promoted []Entry, err error) {
	for range maxTries {
		r, rev, found, err := t.Get(ctx, name)
		if err != nil {
			return false, nil, err
		}
		if !found || (!r.Holds(e) && !r.Waits(e)) {
			return false, nil, nil
		}
		r.Holders = slices.DeleteFunc(slices.Clone(r.Holders), e.Same)
		r.Waiters = slices.DeleteFunc(slices.Clone(r.Waiters), e.Same)
		promoted = nil
		now := t.now().UTC()
		for len(r.Holders) < max(r.Limit, 1) && len(r.Waiters) > 0 {
			w := r.Waiters[0]
			w.Since = now
			r.Holders, r.Waiters = append(r.Holders, w), r.Waiters[1:]
			promoted = append(promoted, w)
		}
		if len(r.Holders) == 0 && len(r.Waiters) == 0 {
			err = t.kv.Delete(ctx, name, jetstream.LastRevision(rev))
		} else {
			_, err = t.kv.Update(ctx, name, encode(r), rev)
		}
		if err != nil {
			if conflict(err) {
				continue
			}
			return false, nil, fmt.Errorf("release lock %s: %w", name, err)
		}
		return true, promoted, nil
	}
	return false, nil, ErrBusy
}

func encode(r Record) []byte {
	if r.Holders == nil {
		r.Holders = []Entry{}
	}
	b, _ := json.Marshal(r)
	return b
}

// conflict reports whether err means another writer changed the key first.
func conflict(err error) bool { return bus.KeyChanged(err) }
