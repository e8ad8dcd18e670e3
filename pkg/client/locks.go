package client

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"

	"jetflow.dev/pkg/apiv1"
)

// Lock is a lock as the api shows it: its holders (since when) and its
// waiters in the order they asked.
type Lock = apiv1.Lock

// LockEntry is a holder or a waiter of a Lock.
type LockEntry = apiv1.LockEntry

// Locks lists every lock held or waited for.
func (c *Client) Locks(ctx context.Context) ([]Lock, error) {
	var out apiv1.LockList
	_, err := c.do(ctx, http.MethodGet, "/v1/locks", nil, nil, &out)
	return out.Locks, err
}

// Lock returns one lock (an *Error with status 404 if nobody holds or waits for it).
func (c *Client) Lock(ctx context.Context, name string) (Lock, error) {
	var out Lock
	_, err := c.do(ctx, http.MethodGet, "/v1/locks/"+url.PathEscape(name), nil, nil, &out)
	return out, err
}

// ClearLockRequest says whose hold to clear and why.
type ClearLockRequest = apiv1.ClearLockRequest

// ClearedLock is the answer to ClearLock.
type ClearedLock = apiv1.ClearedLock

// ClearLock force-clears a lock's holders: the first waiters acquire it.
func (c *Client) ClearLock(ctx context.Context, name string, req ClearLockRequest) (ClearedLock, error) {
	var out ClearedLock
	b, err := json.Marshal(req)
	if err != nil {
		return out, err
	}
	_, err = c.do(ctx, http.MethodDelete, "/v1/locks/"+url.PathEscape(name),
		http.Header{"Content-Type": {"application/json"}}, bytes.NewReader(b), &out)
	return out, err
}
