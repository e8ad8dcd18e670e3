package access_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/services/api/access"
)

// clock is a settable test clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

var admin = access.AdminPrincipal("00000000")

func TestKeyTokens(t *testing.T) {
	t.Parallel()

	id, tok, err := access.NewKeyToken()
	require.NoError(t, err)
	require.Regexp(t, `^jfk_[0-9a-f]{16}_[0-9a-f]{64}$`, tok)
	got, ok := access.KeyID(tok)
	require.True(t, ok)
	require.Equal(t, id, got)
	_, tok2, err := access.NewKeyToken()
	require.NoError(t, err)
	require.NotEqual(t, tok, tok2)
	for _, bad := range []string{"", "jfk_", "jfk_0123_abcd", tok + "0", strings.ToUpper(tok), "jfk_0123456789abcdef_" + strings.Repeat("g", 64)} {
		_, ok := access.KeyID(bad)
		require.False(t, ok, bad)
	}
	require.Len(t, access.HashToken(tok), 64)
	require.NotContains(t, access.HashToken(tok), tok)
}

func TestKeySpecCheck(t *testing.T) {
	t.Parallel()

	ok := access.KeySpec{Name: "ci-bot", Scopes: []access.Scope{access.ScopeRead}, Namespaces: []string{"default"}}
	field, _ := ok.Check()
	require.Empty(t, field)
	for _, tt := range []struct {
		name  string
		mod   func(*access.KeySpec)
		field string
	}{
		{"NoName", func(s *access.KeySpec) { s.Name = "" }, "name"},
		{"BadName", func(s *access.KeySpec) { s.Name = "a b" }, "name"},
		{"NoScopes", func(s *access.KeySpec) { s.Scopes = nil }, "scopes"},
		{"NoNamespaces", func(s *access.KeySpec) { s.Namespaces = nil }, "namespaces"},
		{"NegativeExpiry", func(s *access.KeySpec) { s.ExpiresIn = -time.Hour }, "expires_in"},
		{"ShortExpiry", func(s *access.KeySpec) { s.ExpiresIn = time.Second }, "expires_in"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := ok
			tt.mod(&s)
			field, msg := s.Check()
			require.Equal(t, tt.field, field)
			require.NotEmpty(t, msg)
		})
	}
}

// TestKeysLifecycle: a key is stored as a hash, found by its token,
// refused once expired, and refused once revoked: at once on the replica
// that revoked it, and on another within the cache TTL.
func TestKeysLifecycle(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := t.Context()
	clk := &clock{now: time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)}
	ks, err := access.OpenKeys(ctx, js, access.KeysConfig{CacheTTL: 5 * time.Second, Now: clk.Now})
	require.NoError(t, err)
	other, err := access.OpenKeys(ctx, js, access.KeysConfig{CacheTTL: 5 * time.Second, Now: clk.Now})
	require.NoError(t, err)

	k, tok, err := ks.Create(ctx, access.KeySpec{Name: "ci-bot", Scopes: []access.Scope{access.ScopeRead, access.ScopeStart},
		Namespaces: []string{"default"}, ExpiresIn: time.Hour}, admin)
	require.NoError(t, err)
	require.Equal(t, "admin-token", k.CreatedBy)
	require.Equal(t, clk.Now().Add(time.Hour), k.ExpiresAt)

	t.Log("the bucket holds the hash, never the token")
	kv, err := js.KeyValue(ctx, bus.BucketAPIKeys)
	require.NoError(t, err)
	e, err := kv.Get(ctx, k.ID)
	require.NoError(t, err)
	require.NotContains(t, string(e.Value()), tok)
	secret := tok[strings.LastIndex(tok, "_")+1:]
	require.NotContains(t, string(e.Value()), secret)
	require.Contains(t, string(e.Value()), access.HashToken(tok))

	got, err := ks.Lookup(ctx, tok)
	require.NoError(t, err)
	require.Equal(t, access.Principal{Subject: "ci-bot", Method: events.ActorAPIKey, KeyID: k.ID,
		Scopes: []access.Scope{access.ScopeRead, access.ScopeStart}, Namespaces: []string{"default"}}, got.Principal())
	_, err = other.Lookup(ctx, tok)
	require.NoError(t, err)

	t.Log("a wrong secret or an unknown id is refused")
	id, _ := access.KeyID(tok)
	_, err = ks.Lookup(ctx, "jfk_"+id+"_"+strings.Repeat("0", 64))
	require.ErrorIs(t, err, access.ErrBadToken)
	require.ErrorContains(t, err, "secret of api key "+id+" is wrong")
	_, err = ks.Lookup(ctx, "jfk_0000000000000000_"+strings.Repeat("0", 64))
	require.ErrorIs(t, err, access.ErrBadToken)
	require.ErrorContains(t, err, "no api key has the id")

	t.Log("revoked: refused at once here, within the TTL on the other replica")
	_, err = ks.Revoke(ctx, k.ID, admin)
	require.NoError(t, err)
	_, err = ks.Lookup(ctx, tok)
	require.ErrorIs(t, err, access.ErrBadToken)
	require.ErrorContains(t, err, "revoked")
	_, err = other.Lookup(ctx, tok)
	require.NoError(t, err, "the other replica trusts its cache for the TTL")
	clk.Add(5 * time.Second)
	_, err = other.Lookup(ctx, tok)
	require.ErrorContains(t, err, "revoked")
	again, err := ks.Revoke(ctx, k.ID, access.Principal{Subject: "someone-else"})
	require.NoError(t, err)
	require.Equal(t, "admin-token", again.RevokedBy, "revoking again changes nothing")

	t.Log("expired: refused from its expiry on, cache or not")
	k2, tok2, err := ks.Create(ctx, access.KeySpec{Name: "short", Scopes: []access.Scope{access.ScopeRead},
		Namespaces: []string{"*"}, ExpiresIn: time.Minute}, admin)
	require.NoError(t, err)
	_, err = ks.Lookup(ctx, tok2)
	require.NoError(t, err)
	clk.Add(time.Minute)
	_, err = ks.Lookup(ctx, tok2)
	require.ErrorIs(t, err, access.ErrBadToken)
	require.ErrorContains(t, err, "api key "+k2.ID+" expired")

	list, err := ks.List(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Empty(t, list[0].Public().Hash)
	_, err = ks.Revoke(ctx, "0000000000000000", admin)
	require.ErrorIs(t, err, access.ErrKeyNotFound)
}

// TestAdminTokens: the file's tokens are admins of every namespace; the
// file is read again when it changes (rotation), within the refresh.
func TestAdminTokens(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "admin.token")
	first, err := access.NewAdminToken()
	require.NoError(t, err)
	require.Regexp(t, `^jfa_[0-9a-f]{64}$`, first)
	require.NoError(t, os.WriteFile(path, []byte("# the bootstrap admin\n\n"+first+"\n"), 0o600))
	clk := &clock{now: time.Now()}
	at, err := access.OpenAdminTokens(path, 5*time.Second, clk.Now)
	require.NoError(t, err)

	p, ok := at.Match(first)
	require.True(t, ok)
	require.Equal(t, "admin-token", p.Subject)
	require.Equal(t, events.ActorAPIKey, p.Method)
	require.Equal(t, "admin-token-"+access.HashToken(first)[:8], p.KeyID)
	require.True(t, p.Has(access.ScopeAdmin))
	require.True(t, p.Grants("any-namespace"))
	_, ok = at.Match(first[:len(first)-1])
	require.False(t, ok)
	_, ok = at.Match("")
	require.False(t, ok)

	t.Log("rotation: the new token works and the old one stops, once the file is read again")
	second, err := access.NewAdminToken()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, []byte(second+"\n"), 0o600))
	clk.Add(5 * time.Second)
	_, ok = at.Match(second)
	require.True(t, ok)
	_, ok = at.Match(first)
	require.False(t, ok)

	require.NoError(t, os.WriteFile(path, []byte("# nothing\n"), 0o600))
	_, err = access.OpenAdminTokens(path, 0, nil)
	require.ErrorContains(t, err, "holds no token")
	_, err = access.OpenAdminTokens(filepath.Join(t.TempDir(), "missing"), 0, nil)
	require.Error(t, err)
}

// TestAuthenticate: the header's forms, and which kind of token goes where.
func TestAuthenticate(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	ctx := context.Background()
	ks, err := access.OpenKeys(ctx, js, access.KeysConfig{})
	require.NoError(t, err)
	_, tok, err := ks.Create(ctx, access.KeySpec{Name: "reader", Scopes: []access.Scope{access.ScopeRead}, Namespaces: []string{"default"}}, admin)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "admin.token")
	adminTok, err := access.NewAdminToken()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, []byte(adminTok), 0o600))
	at, err := access.OpenAdminTokens(path, 0, nil)
	require.NoError(t, err)
	a := &access.Authenticator{Keys: ks, Admin: at}

	p, err := a.Authenticate(ctx, "Bearer "+tok)
	require.NoError(t, err)
	require.Equal(t, "reader", p.Subject)
	p, err = a.Authenticate(ctx, "bearer "+adminTok)
	require.NoError(t, err)
	require.Equal(t, "admin-token", p.Subject)

	for _, tt := range []struct {
		name, header string
		err          error
		msg          string
	}{
		{"None", "", access.ErrNoToken, ""},
		{"Basic", "Basic dXNlcjpwYXNz", access.ErrBadToken, "Authorization: Bearer <token>"},
		{"EmptyBearer", "Bearer ", access.ErrBadToken, "Authorization: Bearer <token>"},
		{"Garbage", "Bearer hunter2", access.ErrBadToken, "neither an api key"},
		{"JWTWithoutOIDC", "Bearer a.b.c", access.ErrBadToken, "no OIDC issuer"},
		{"MalformedKey", "Bearer jfk_zz", access.ErrBadToken, "malformed api key"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := a.Authenticate(ctx, tt.header)
			require.ErrorIs(t, err, tt.err)
			require.ErrorContains(t, err, tt.msg)
			if tok := strings.TrimPrefix(tt.header, "Bearer "); len(tok) > 3 {
				require.NotContains(t, err.Error(), tok, "errors never hold the token")
			}
		})
	}
}
