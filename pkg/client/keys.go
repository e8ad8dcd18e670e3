package client

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"
)

// KeyRequest asks for a new api key.
type KeyRequest struct {
	Name       string   `json:"name"`
	Scopes     []string `json:"scopes"`
	Namespaces []string `json:"namespaces"`
	// ExpiresIn is a duration (720h) or days (30d); "" for no expiry.
	ExpiresIn string `json:"expires_in,omitempty"`
}

// Key is an api key as the api shows it (never its hash).
type Key struct {
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	Scopes     []string  `json:"scopes"`
	Namespaces []string  `json:"namespaces"`
	CreatedAt  time.Time `json:"created_at"`
	CreatedBy  string    `json:"created_by"`
	ExpiresAt  time.Time `json:"expires_at,omitzero"`
	RevokedAt  time.Time `json:"revoked_at,omitzero"`
	RevokedBy  string    `json:"revoked_by,omitempty"`
	// Status is active, expired or revoked.
	Status string `json:"status"`
	// Token is set only in the answer to CreateKey: it is shown once.
	Token string `json:"token,omitempty"`
}

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
	var out struct {
		Keys []Key `json:"keys"`
	}
	_, err := c.do(ctx, http.MethodGet, "/v1/admin/keys", nil, nil, &out)
	return out.Keys, err
}

// RevokeKey revokes api key id.
func (c *Client) RevokeKey(ctx context.Context, id string) (Key, error) {
	var out Key
	_, err := c.do(ctx, http.MethodDelete, "/v1/admin/keys/"+url.PathEscape(id), nil, nil, &out)
	return out, err
}
