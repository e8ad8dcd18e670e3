package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/services/api/access"
	"jetflow.dev/services/api/access/accesstest"
)

// syncBuffer is a log sink the api's goroutines may write concurrently.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type authBundle struct {
	url    string
	js     jetstream.JetStream
	admin  string
	issuer *accesstest.Issuer
	log    *syncBuffer
	// tokens are every token the test used, to look for in logs and streams.
	tokens []string
}

// setupAuth runs the api (with an admin token file and a local OIDC
// issuer) against an embedded JetStream, without a dispatcher: commands
// are published and answered 202.
func setupAuth(t *testing.T) *authBundle {
	t.Helper()
	_, js := natstest.Connect(t, natstest.RunJetStream(t))
	nc := js.Conn()
	admin, err := access.NewAdminToken()
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "admin.token")
	require.NoError(t, os.WriteFile(file, []byte(admin+"\n"), 0o600))
	b := &authBundle{js: js, admin: admin, issuer: accesstest.NewIssuer(t), log: &syncBuffer{}, tokens: []string{admin}}
	log := zerolog.New(io.MultiWriter(b.log, zerolog.NewTestWriter(t))).Level(zerolog.DebugLevel)
	srv, err := New(t.Context(), Config{StartWait: 50 * time.Millisecond, Auth: AuthConfig{AdminTokenFile: file,
		OIDC: access.OIDCConfig{Issuer: b.issuer.URL, Audience: "jetflow"}}}, nc, js, log)
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	b.url = hs.URL
	return b
}

type answer struct {
	status int
	header http.Header
	err    apiError
	body   []byte
}

// call sends a request with token ("" for none) and namespace ("" for the header's absence).
func (b *authBundle) call(t *testing.T, method, path, token, namespace, body string) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, b.url+path, strings.NewReader(body))
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if namespace != "" {
		req.Header.Set(NamespaceHeader, namespace)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	a := answer{status: resp.StatusCode, header: resp.Header, body: data}
	var wrapper struct {
		Error apiError `json:"error"`
	}
	if json.Unmarshal(data, &wrapper) == nil {
		a.err = wrapper.Error
	}
	return a
}

// createKey makes a key through the api with the admin token.
func (b *authBundle) createKey(t *testing.T, name string, scopes []string, namespaces []string) (id, token string) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"name": name, "scopes": scopes, "namespaces": namespaces})
	require.NoError(t, err)
	a := b.call(t, http.MethodPost, "/v1/admin/keys", b.admin, "", string(body))
	require.Equal(t, http.StatusCreated, a.status, "%s", a.body)
	var k struct {
		ID    string `json:"id"`
		Token string `json:"token"`
		Hash  string `json:"hash"`
	}
	require.NoError(t, json.Unmarshal(a.body, &k))
	require.Empty(t, k.Hash, "the answer never holds the hash")
	b.tokens = append(b.tokens, k.Token)
	return k.ID, k.Token
}

// concrete fills a route's pattern with values that exist nowhere.
func concrete(pattern string) (method, path string) {
	method, path, _ = strings.Cut(pattern, " ")
	r := strings.NewReplacer("{id}", "nope", "{name}", "nope", "{version}", "1")
	return method, r.Replace(path)
}

// TestEveryRouteNeedsItsScope goes over the routes table: without a
// token every route but /healthz is 401; a key of one scope passes the
// guard of exactly the routes that need that scope (any answer but 401
// and 403) and gets 403 naming the scope elsewhere; the admin passes all.
func TestEveryRouteNeedsItsScope(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	keys := map[access.Scope]string{}
	for _, sc := range access.Scopes {
		_, keys[sc] = b.createKey(t, "only-"+string(sc), []string{string(sc)}, []string{"default"})
	}
	for _, rt := range (&Server{}).routes() {
		t.Run(strings.NewReplacer(" ", "", "/", "_", "{", "", "}", "").Replace(rt.pattern), func(t *testing.T) {
			method, path := concrete(rt.pattern)
			a := b.call(t, method, path, "", "", "")
			if rt.scope == "" {
				require.Equal(t, http.StatusOK, a.status, "%s is public", rt.pattern)
				return
			}
			require.Equal(t, http.StatusUnauthorized, a.status, "%s without a token: %s", rt.pattern, a.body)
			require.Equal(t, `Bearer realm="jetflow"`, a.header.Get("WWW-Authenticate"))
			// The body is JSON for people too: < and > as they are.
			require.Contains(t, string(a.body), "Bearer <token>", "%s", a.body)
			require.Equal(t, "unauthenticated", a.err.Code)
			if rt.scope == access.ScopeAny {
				require.Contains(t, a.err.Message, "any scope")
			} else {
				require.Contains(t, a.err.Message, "scope "+string(rt.scope))
			}

			for _, sc := range access.Scopes {
				a := b.call(t, method, path, keys[sc], "", "")
				allowed := sc == rt.scope || sc == access.ScopeAdmin || rt.scope == access.ScopeAny
				if allowed {
					require.NotContains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, a.status,
						"%s with a %s key: %s", rt.pattern, sc, a.body)
					continue
				}
				require.Equal(t, http.StatusForbidden, a.status, "%s with a %s key: %s", rt.pattern, sc, a.body)
				require.Equal(t, "forbidden", a.err.Code)
				require.Equal(t, string(rt.scope), a.err.Scope)
				require.Contains(t, a.err.Message, "needs the scope "+string(rt.scope))
			}
			a = b.call(t, method, path, b.admin, "", "")
			require.NotContains(t, []int{http.StatusUnauthorized, http.StatusForbidden}, a.status, "%s as admin: %s", rt.pattern, a.body)
		})
	}
}

// TestRefusedTokens: a wrong, expired or revoked key, and a JWT that does
// not verify, are 401 with invalid_token; a good OIDC token passes.
func TestRefusedTokens(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	ctx := t.Context()
	id, tok := b.createKey(t, "reader", []string{"read"}, []string{"*"})
	require.Equal(t, http.StatusOK, b.call(t, "GET", "/v1/executions", tok, "", "").status)

	refused := func(token, why string) {
		t.Helper()
		a := b.call(t, "GET", "/v1/executions", token, "", "")
		require.Equal(t, http.StatusUnauthorized, a.status, "%s", a.body)
		require.Equal(t, `Bearer realm="jetflow", error="invalid_token"`, a.header.Get("WWW-Authenticate"))
		require.Equal(t, "unauthenticated", a.err.Code)
		require.Contains(t, a.err.Message, why)
		require.NotContains(t, string(a.body), token)
	}
	refused("jfk_"+id+"_"+strings.Repeat("0", 64), "secret of api key "+id+" is wrong")
	refused("jfk_0000000000000000_"+strings.Repeat("0", 64), "no api key has the id")
	refused("not-a-token", "neither an api key")

	t.Log("expired: a key stored with an expiry in the past")
	expID, expTok, err := access.NewKeyToken()
	require.NoError(t, err)
	b.tokens = append(b.tokens, expTok)
	kv, err := b.js.KeyValue(ctx, bus.BucketAPIKeys)
	require.NoError(t, err)
	stored, err := json.Marshal(access.Key{ID: expID, Name: "old", Scopes: []access.Scope{access.ScopeAdmin}, Namespaces: []string{"*"},
		CreatedAt: time.Now().Add(-2 * time.Hour), CreatedBy: "admin-token", ExpiresAt: time.Now().Add(-time.Hour), Hash: access.HashToken(expTok)})
	require.NoError(t, err)
	_, err = kv.Create(ctx, expID, stored)
	require.NoError(t, err)
	refused(expTok, "api key "+expID+" expired")

	t.Log("revoked: refused at once by the api that revoked it")
	a := b.call(t, http.MethodDelete, "/v1/admin/keys/"+id, b.admin, "", "")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	require.Contains(t, string(a.body), `"status": "revoked"`)
	refused(tok, "api key "+id+" was revoked")
	require.Equal(t, http.StatusNotFound, b.call(t, http.MethodDelete, "/v1/admin/keys/0000000000000000", b.admin, "", "").status)

	t.Log("the list shows every key, never a token or a hash")
	a = b.call(t, http.MethodGet, "/v1/admin/keys", b.admin, "", "")
	require.Equal(t, http.StatusOK, a.status)
	var list struct {
		Keys []map[string]any `json:"keys"`
	}
	require.NoError(t, json.Unmarshal(a.body, &list))
	require.Len(t, list.Keys, 2)
	for _, k := range list.Keys {
		require.NotContains(t, k, "hash")
		require.NotContains(t, k, "token")
	}
	require.Equal(t, "revoked", list.Keys[1]["status"])
	require.Equal(t, "expired", list.Keys[0]["status"])

	t.Log("OIDC: a token of the issuer passes; wrong audience, expired and forged are refused")
	good := accesstest.Claims{Subject: "alice", Audience: []string{"jetflow"},
		Extra: map[string]any{"scope": "jetflow:read", "jetflow_namespaces": []string{"default"}}}
	jwt := b.issuer.Token(t, good)
	b.tokens = append(b.tokens, jwt)
	require.Equal(t, http.StatusOK, b.call(t, "GET", "/v1/executions", jwt, "", "").status)
	a = b.call(t, "POST", "/v1/admin/projections/rebuild", jwt, "", "")
	require.Equal(t, http.StatusForbidden, a.status)
	require.Contains(t, a.err.Message, `the OIDC subject "alice" holds read`)
	other := good
	other.Audience = []string{"another-app"}
	refused(b.issuer.Token(t, other), "audience")
	other = good
	other.Expiry = time.Now().Add(-time.Minute)
	refused(b.issuer.Token(t, other), "expired")
	refused(b.issuer.Forged(t, good), "signature")
}

// TestNamespaces: a request names its namespace in Jetflow-Namespace
// (default without); one not granted is 403, or 404 for a lookup by id
// or name, answered exactly like a missing one; one granted that this api
// does not serve is 404 naming it.
func TestNamespaces(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	_, teamA := b.createKey(t, "team-a-reader", []string{"read", "operate"}, []string{"team-a"})
	_, dflt := b.createKey(t, "default-reader", []string{"read"}, []string{"default"})

	a := b.call(t, "GET", "/v1/executions", teamA, "", "")
	require.Equal(t, http.StatusForbidden, a.status)
	require.Equal(t, "forbidden", a.err.Code)
	require.Equal(t, "default", a.err.Namespace)
	require.Contains(t, a.err.Message, `is not granted the namespace "default"`)
	a = b.call(t, "POST", "/v1/executions/x1/actions", teamA, "default", `{"action":"cancel"}`)
	require.Equal(t, http.StatusForbidden, a.status)

	for _, path := range []string{"/v1/executions/x1", "/v1/executions/x1/events", "/v1/workflows/deploy", "/v1/workflows/deploy/versions/2", "/v1/locks/db"} {
		hidden := b.call(t, "GET", path, teamA, "", "")
		missing := b.call(t, "GET", path, dflt, "", "")
		require.Equal(t, http.StatusNotFound, hidden.status, path)
		require.Equal(t, missing.status, hidden.status, path)
		require.Equal(t, string(missing.body), string(hidden.body), "%s: not granted looks like missing", path)
	}

	a = b.call(t, "GET", "/v1/executions", teamA, "team-a", "")
	require.Equal(t, http.StatusNotFound, a.status)
	require.Equal(t, NamespaceHeader, a.err.Field)
	require.Contains(t, a.err.Message, `namespace "team-a" is not served by this api (it serves default)`)
	a = b.call(t, "GET", "/v1/executions", b.admin, "Team_A", "")
	require.Equal(t, http.StatusBadRequest, a.status)
	require.Equal(t, NamespaceHeader, a.err.Field)
	require.Equal(t, http.StatusOK, b.call(t, "GET", "/v1/executions", dflt, "default", "").status)

	t.Log("an admin of one namespace cannot make a key for another, nor for all, nor see theirs")
	_, teamAdmin := b.createKey(t, "team-a-admin", []string{"admin"}, []string{"team-a"})
	a = b.call(t, "POST", "/v1/admin/keys", teamAdmin, "", `{"name":"x","scopes":["read"],"namespaces":["*"]}`)
	require.Equal(t, http.StatusForbidden, a.status)
	require.Contains(t, a.err.Message, "cannot grant more than its creator holds")
	a = b.call(t, "POST", "/v1/admin/keys", teamAdmin, "", `{"name":"x","scopes":["read"],"namespaces":["team-a"],"expires_in":"30d"}`)
	require.Equal(t, http.StatusCreated, a.status, "%s", a.body)
	var made struct {
		Token     string    `json:"token"`
		CreatedBy string    `json:"created_by"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	require.NoError(t, json.Unmarshal(a.body, &made))
	b.tokens = append(b.tokens, made.Token)
	require.Equal(t, "team-a-admin", made.CreatedBy)
	require.WithinDuration(t, time.Now().Add(30*24*time.Hour), made.ExpiresAt, time.Minute)
	a = b.call(t, "GET", "/v1/admin/keys", teamAdmin, "", "")
	var list struct {
		Keys []access.Key `json:"keys"`
	}
	require.NoError(t, json.Unmarshal(a.body, &list))
	for _, k := range list.Keys {
		require.Equal(t, []string{"team-a"}, k.Namespaces, "%s is not team-a's", k.Name)
	}

	t.Log("bad key requests")
	for body, field := range map[string]string{
		`{"name":"x","scopes":["root"],"namespaces":["default"]}`:                     "scopes",
		`{"name":"x","scopes":["read"],"namespaces":["*","default"]}`:                 "namespaces",
		`{"name":"x y","scopes":["read"],"namespaces":["default"]}`:                   "name",
		`{"name":"x","scopes":["read"],"namespaces":["default"],"expires_in":"soon"}`: "expires_in",
		`{"name":"x","scopes":["read"],"namespaces":["default"],"token":"mine"}`:      "token",
	} {
		a := b.call(t, "POST", "/v1/admin/keys", b.admin, "", body)
		require.Equal(t, http.StatusBadRequest, a.status, body)
		require.Equal(t, field, a.err.Field, body)
	}
}

// TestActorAndNoTokenInCommandsOrLogs: the api's commands go on its own
// subjects with the caller's actor (an actor in a CloudEvent's data is
// refused), and no token ever reaches the commands stream or the log.
func TestActorAndNoTokenInCommandsOrLogs(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	ctx := t.Context()
	a := b.call(t, "POST", "/v1/workflows", b.admin, "", "name: hello\nsteps:\n  - id: hi\n    kind: log\n    message: hi\n")
	require.Equal(t, http.StatusCreated, a.status, "%s", a.body)
	id, tok := b.createKey(t, "ci-bot", []string{"start"}, []string{"default"})

	a = b.call(t, "POST", "/v1/executions", tok, "", `{"workflow":"hello","id":"x1"}`)
	require.Equal(t, http.StatusAccepted, a.status, "%s", a.body)
	ce := `{"specversion":"1.0","id":"c1","source":"test","type":"io.jetflow.execution.start",` +
		`"data":{"workflow":"hello","actor":{"subject":"root","method":"api-key"}}}`
	req, err := http.NewRequestWithContext(ctx, "POST", b.url+"/v1/executions", strings.NewReader(ce))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/cloudevents+json")
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s", body)
	require.Contains(t, string(body), "actor is set by the api")

	cmds, err := history.ReadStream(ctx, b.js, bus.StreamCommands, bus.CommandsPrefix+".>", 0, 0)
	require.NoError(t, err)
	require.Len(t, cmds, 1)
	start := cmds[0].Data.(*events.StartExecution)
	require.Equal(t, &events.Actor{Subject: "ci-bot", Method: events.ActorAPIKey, KeyID: id}, start.Actor)
	st, err := b.js.Stream(ctx, bus.StreamCommands)
	require.NoError(t, err)
	m, err := st.GetLastMsgForSubject(ctx, bus.SubjectAPIStart)
	require.NoError(t, err, "published on the api's start subject")
	require.Equal(t, bus.SubjectAPIStart, m.Subject)

	requireNoToken(t, b.js, b.log.String(), b.tokens, bus.StreamCommands)
}

// requireNoToken scans logs and every message of streams for tokens.
func requireNoToken(t *testing.T, js jetstream.JetStream, logs string, tokens []string, streams ...string) {
	t.Helper()
	require.NotEmpty(t, logs)
	for _, tok := range tokens {
		require.NotContains(t, logs, tok, "a token in the log")
	}
	for _, name := range streams {
		st, err := js.Stream(context.Background(), name)
		require.NoError(t, err)
		info, err := st.Info(context.Background())
		require.NoError(t, err)
		require.NotZero(t, info.State.Msgs, "%s holds messages", name)
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
			m, err := st.GetMsg(context.Background(), seq)
			if err != nil {
				continue // deleted
			}
			raw := string(m.Data) + m.Subject
			for k, v := range m.Header {
				raw += k + strings.Join(v, " ")
			}
			for _, tok := range tokens {
				require.NotContains(t, raw, tok, "a token in %s at %d", name, seq)
			}
		}
	}
}

// TestRepairNeedsTheAdminScope: the repair action passes over an event of
// a history, so the operate scope that may cancel or resume is not
// enough; and its ignore_seq is required with it, refused with others.
func TestRepairNeedsTheAdminScope(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	_, operate := b.createKey(t, "oncall", []string{"operate"}, []string{"default"})
	const path = "/v1/executions/nope/actions"

	a := b.call(t, http.MethodPost, path, operate, "", `{"action":"repair","ignore_seq":7}`)
	require.Equal(t, http.StatusForbidden, a.status, "%s", a.body)
	require.Equal(t, "forbidden", a.err.Code)
	require.Equal(t, "admin", a.err.Scope)

	a = b.call(t, http.MethodPost, path, b.admin, "", `{"action":"repair"}`)
	require.Equal(t, http.StatusBadRequest, a.status, "%s", a.body)
	require.Equal(t, "ignore_seq", a.err.Field)
	a = b.call(t, http.MethodPost, path, operate, "", `{"action":"cancel","ignore_seq":7}`)
	require.Equal(t, http.StatusBadRequest, a.status, "%s", a.body)
	require.Equal(t, "ignore_seq", a.err.Field)

	// With the admin scope it goes through to the execution lookup.
	a = b.call(t, http.MethodPost, path, b.admin, "", `{"action":"repair","ignore_seq":7}`)
	require.Equal(t, http.StatusNotFound, a.status, "%s", a.body)
}

// TestWhoami: any valid token learns who it is (subject, method, key id,
// scopes, namespaces), whatever its scopes and whatever namespace the
// request names; the answer never holds the token; no token is a 401.
func TestWhoami(t *testing.T) {
	t.Parallel()
	b := setupAuth(t)
	id, tok := b.createKey(t, "reader", []string{"read"}, []string{"team-a"})
	for _, ns := range []string{"", "team-b"} {
		a := b.call(t, http.MethodGet, "/v1/whoami", tok, ns, "")
		require.Equal(t, http.StatusOK, a.status, "%s", a.body)
		var who apiv1.Whoami
		require.NoError(t, json.Unmarshal(a.body, &who))
		require.Equal(t, apiv1.Whoami{Subject: "reader", Method: events.ActorAPIKey, KeyID: id, Scopes: []string{"read"}, Namespaces: []string{"team-a"}}, who)
		require.NotContains(t, string(a.body), tok)
	}

	a := b.call(t, http.MethodGet, "/v1/whoami", b.admin, "", "")
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	var who apiv1.Whoami
	require.NoError(t, json.Unmarshal(a.body, &who))
	require.Equal(t, "admin-token", who.Subject)
	require.Equal(t, []string{"admin"}, who.Scopes)
	require.Equal(t, []string{"*"}, who.Namespaces)
	require.NotContains(t, string(a.body), b.admin)

	a = b.call(t, http.MethodGet, "/v1/whoami", "", "", "")
	require.Equal(t, http.StatusUnauthorized, a.status)
	require.Contains(t, a.err.Message, "a token, of any scope")
	a = b.call(t, http.MethodGet, "/v1/whoami", "jfk_0123456789abcdef_wrong", "", "")
	require.Equal(t, http.StatusUnauthorized, a.status)
}
