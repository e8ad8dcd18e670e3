package access

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
)

// KeyPrefix starts every api key: jfk_<id>_<secret>, the id 16 and the
// secret 64 hex digits (8 and 32 random bytes).
const KeyPrefix = "jfk_"

var keyRe = regexp.MustCompile(`^jfk_([0-9a-f]{16})_([0-9a-f]{64})$`)

// Errors of authentication. Their messages never hold the token.
var (
	// ErrNoToken: the request has no bearer token.
	ErrNoToken = errors.New("access: no bearer token")
	// ErrBadToken: the token is not one this api accepts (unknown,
	// malformed, expired, revoked, or a JWT that does not verify).
	ErrBadToken = errors.New("access: token refused")
	// ErrUnavailable: the token could not be checked now (the keys bucket
	// or the OIDC issuer cannot be reached).
	ErrUnavailable = errors.New("access: cannot check the token now")
	// ErrKeyNotFound: no key has that id.
	ErrKeyNotFound = errors.New("access: no such key")
)

// refused is an ErrBadToken with the reason a caller may be told.
func refused(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadToken, fmt.Sprintf(format, args...))
}

// NewKeyToken returns a new api key token and its id, from crypto/rand.
func NewKeyToken() (id, token string, err error) {
	b := make([]byte, 40)
	if _, err := rand.Read(b); err != nil {
		return "", "", fmt.Errorf("access: random key: %w", err)
	}
	id = hex.EncodeToString(b[:8])
	return id, KeyPrefix + id + "_" + hex.EncodeToString(b[8:]), nil
}

// KeyID returns the id of an api key token (false if it is none).
func KeyID(token string) (string, bool) {
	m := keyRe.FindStringSubmatch(token)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// HashToken is the SHA-256 of a token, in hex: all that is stored of it.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// Key is an api key as stored (its token is never stored, only Hash).
type Key struct {
	ID         string    `json:"id"`
	Name       string    `json:"name"`
	Scopes     []Scope   `json:"scopes"`
	Namespaces []string  `json:"namespaces"`
	CreatedAt  time.Time `json:"created_at"`
	// CreatedBy is the subject of whoever created it.
	CreatedBy string    `json:"created_by"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	RevokedAt time.Time `json:"revoked_at,omitzero"`
	RevokedBy string    `json:"revoked_by,omitempty"`
	// Hash is HashToken of the token.
	Hash string `json:"hash,omitempty"`
}

// Public is the key without its hash, as the api lists it.
func (k Key) Public() Key {
	k.Hash = ""
	return k
}

// Principal is who a request with this key is.
func (k Key) Principal() Principal {
	return Principal{Subject: k.Name, Method: events.ActorAPIKey, KeyID: k.ID, Scopes: k.Scopes, Namespaces: k.Namespaces}
}

// usable says why the key cannot be used at now (nil if it can).
func (k Key) usable(now time.Time) error {
	switch {
	case !k.RevokedAt.IsZero():
		return refused("api key %s was revoked at %s", k.ID, k.RevokedAt.UTC().Format(time.RFC3339))
	case !k.ExpiresAt.IsZero() && !now.Before(k.ExpiresAt):
		return refused("api key %s expired at %s", k.ID, k.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return nil
}

// KeyNameRule says what a key may be called.
const KeyNameRule = "use 1 to 64 letters, digits, '.', '_', '@' or '-', starting with a letter or digit"

var keyNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// KeySpec is what a new key is asked for.
type KeySpec struct {
	Name       string
	Scopes     []Scope
	Namespaces []string
	// ExpiresIn, if not zero, is how long the key lasts.
	ExpiresIn time.Duration
}

// Check reports what is wrong with s: the field and why ("" if nothing).
func (s KeySpec) Check() (field, msg string) {
	switch {
	case !keyNameRe.MatchString(s.Name):
		return "name", fmt.Sprintf("%q: %s", s.Name, KeyNameRule)
	case len(s.Scopes) == 0:
		return "scopes", "name at least one scope: " + scopeNames()
	case len(s.Namespaces) == 0:
		return "namespaces", `name at least one namespace, or "*" for all`
	case s.ExpiresIn < 0:
		return "expires_in", "must not be negative"
	case s.ExpiresIn > 0 && s.ExpiresIn < time.Minute:
		return "expires_in", "must be at least a minute"
	}
	return "", ""
}

// KeysConfig configures a [Keys].
type KeysConfig struct {
	// CacheTTL is how long a key looked up is trusted without reading the
	// bucket again: a key revoked on another api replica stops working
	// within it. Default 5s; at most 1m.
	CacheTTL time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

func (c KeysConfig) withDefaults() (KeysConfig, error) {
	if c.CacheTTL == 0 {
		c.CacheTTL = 5 * time.Second
	}
	if c.CacheTTL < 0 || c.CacheTTL > time.Minute {
		return c, fmt.Errorf("access: key cache TTL %s: give a duration up to 1m", c.CacheTTL)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c, nil
}

// maxCached bounds the lookups kept: the cache is emptied beyond it.
const maxCached = 10000

type cachedKey struct {
	key     Key
	fetched time.Time
}

// Keys is the store of api keys (the JF_API_KEYS bucket, one entry per
// key id) with a short cache of lookups. It is safe for concurrent use.
type Keys struct {
	cfg   KeysConfig
	kv    jetstream.KeyValue
	mu    sync.Mutex
	cache map[string]cachedKey // by HashToken of the token
}

// OpenKeys binds to the keys bucket.
func OpenKeys(ctx context.Context, js jetstream.JetStream, cfg KeysConfig) (*Keys, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, bus.BucketAPIKeys)
	if err != nil {
		return nil, fmt.Errorf("open api keys bucket: %w", err)
	}
	return &Keys{cfg: cfg, kv: kv, cache: map[string]cachedKey{}}, nil
}

// Create stores a new key made by p and returns it with its token,
// which is not kept anywhere: the caller shows it once.
func (ks *Keys) Create(ctx context.Context, spec KeySpec, by Principal) (Key, string, error) {
	id, token, err := NewKeyToken()
	if err != nil {
		return Key{}, "", err
	}
	now := ks.cfg.Now().UTC()
	k := Key{ID: id, Name: spec.Name, Scopes: spec.Scopes, Namespaces: spec.Namespaces, CreatedAt: now,
		CreatedBy: by.Subject, Hash: HashToken(token)}
	if spec.ExpiresIn > 0 {
		k.ExpiresAt = now.Add(spec.ExpiresIn)
	}
	b, err := json.Marshal(k)
	if err != nil {
		return Key{}, "", err
	}
	if _, err := ks.kv.Create(ctx, id, b); err != nil {
		return Key{}, "", fmt.Errorf("store api key: %w", err)
	}
	return k, token, nil
}

// Get reads a key by id (ErrKeyNotFound if there is none).
func (ks *Keys) Get(ctx context.Context, id string) (Key, uint64, error) {
	var k Key
	e, err := ks.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return k, 0, ErrKeyNotFound
	}
	if err != nil {
		return k, 0, fmt.Errorf("read api key %s: %w", id, err)
	}
	if err := json.Unmarshal(e.Value(), &k); err != nil {
		return k, 0, fmt.Errorf("read api key %s: %w", id, err)
	}
	return k, e.Revision(), nil
}

// List returns every key, revoked and expired ones included.
func (ks *Keys) List(ctx context.Context) ([]Key, error) {
	lister, err := ks.kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list api keys: %w", err)
	}
	var out []Key
	for id := range lister.Keys() {
		k, _, err := ks.Get(ctx, id)
		if errors.Is(err, ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, nil
}

// Revoke marks key id revoked by p (revoking it again changes nothing).
// This replica forgets it at once; others within the cache TTL.
func (ks *Keys) Revoke(ctx context.Context, id string, by Principal) (Key, error) {
	for {
		k, rev, err := ks.Get(ctx, id)
		if err != nil {
			return k, err
		}
		if !k.RevokedAt.IsZero() {
			return k, nil
		}
		k.RevokedAt, k.RevokedBy = ks.cfg.Now().UTC(), by.Subject
		b, err := json.Marshal(k)
		if err != nil {
			return k, err
		}
		_, err = ks.kv.Update(ctx, id, b, rev)
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == 10164) {
			continue // changed meanwhile: read it again
		}
		if err != nil {
			return k, fmt.Errorf("revoke api key %s: %w", id, err)
		}
		ks.mu.Lock()
		delete(ks.cache, k.Hash)
		ks.mu.Unlock()
		return k, nil
	}
}

// Lookup returns the key whose token this is, if it is usable: not
// revoked, not expired. A key read from the bucket is trusted for the
// cache TTL; its expiry is checked on every lookup.
func (ks *Keys) Lookup(ctx context.Context, token string) (Key, error) {
	id, ok := KeyID(token)
	if !ok {
		return Key{}, refused("malformed api key (jfk_<id>_<secret>)")
	}
	hash := HashToken(token)
	now := ks.cfg.Now()
	ks.mu.Lock()
	c, hit := ks.cache[hash]
	ks.mu.Unlock()
	if !hit || now.Sub(c.fetched) >= ks.cfg.CacheTTL || now.Before(c.fetched) {
		k, _, err := ks.Get(ctx, id)
		if errors.Is(err, ErrKeyNotFound) {
			return Key{}, refused("no api key has the id %s", id)
		}
		if err != nil {
			return Key{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		if subtle.ConstantTimeCompare([]byte(hash), []byte(k.Hash)) != 1 {
			return Key{}, refused("the secret of api key %s is wrong", id)
		}
		c = cachedKey{key: k, fetched: now}
		ks.mu.Lock()
		if len(ks.cache) >= maxCached {
			ks.cache = map[string]cachedKey{}
		}
		ks.cache[hash] = c
		ks.mu.Unlock()
	}
	if err := c.key.usable(now); err != nil {
		return Key{}, err
	}
	return c.key, nil
}

// isJWT reports whether token looks like a JWS in compact form.
func isJWT(token string) bool { return strings.Count(token, ".") == 2 }
