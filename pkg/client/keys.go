package client

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"

	"jetflow.dev/pkg/apiv1"
)

// KeyRequest asks for a new api key.
type KeyRequest = apiv1.KeyRequest

// Key is an api key as the api shows it (never its hash); its Token is
// set only in the answer to CreateKey: it is shown once.
type Key = apiv1.Key

// CreateKey makes an api key (admin scope); the answer holds its token.
func (c *Client) CreateKey(ctx context.Context, r KeyRequest) (Key, error) {
	var out Key
	b, err := json.Marshal(r)
	if err != nil {
		return out, err
	}
	_, err = c.do(ctx, http.MethodPost, "/v1/admin/keys", http.Header{"Content-Type": {"application/json"}}, bytes.NewReader(b), &out)
	return out, err
}

// Keys lists the api keys the caller could have made.
func (c *Client) Keys(ctx context.Context) ([]Key, error) {
	var out apiv1.KeyList
	_, err := c.do(ctx, http.MethodGet, "/v1/admin/keys", nil, nil, &out)
	return out.Keys, err
}

// RevokeKey revokes api key id.
func (c *Client) RevokeKey(ctx context.Context, id string) (Key, error) {
	var out Key
	_, err := c.do(ctx, http.MethodDelete, "/v1/admin/keys/"+url.PathEscape(id), nil, nil, &out)
	return out, err
}

// Whoami is the caller as the api authenticated its token: subject,
// method, key id, scopes and namespaces.
type Whoami = apiv1.Whoami

// Whoami asks the api who the client's token is (any valid token may).
func (c *Client) Whoami(ctx context.Context) (Whoami, error) {
	var out Whoami
	_, err := c.do(ctx, http.MethodGet, "/v1/whoami", nil, nil, &out)
	return out, err
}
