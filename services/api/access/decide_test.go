package access_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/services/api/access"
)

func key(scopes []access.Scope, namespaces ...string) access.Principal {
	return access.Principal{Subject: "k", Method: events.ActorAPIKey, KeyID: "0123456789abcdef", Scopes: scopes, Namespaces: namespaces}
}

// TestDecide is the authorization decision: the route's scope first
// (admin implies every scope), then the namespace, unless the route is
// not about one.
func TestDecide(t *testing.T) {
	t.Parallel()

	s := func(scopes ...access.Scope) []access.Scope { return scopes }
	for _, tt := range []struct {
		name   string
		p      access.Principal
		need   access.Scope
		ns     string
		global bool
		want   access.Denial
		msg    string
	}{
		{"ReadReads", key(s(access.ScopeRead), "default"), access.ScopeRead, "default", false, access.Allowed, ""},
		{"ReadCannotStart", key(s(access.ScopeRead), "default"), access.ScopeStart, "default", false, access.MissingScope,
			`this needs the scope start; the key "k" holds read`},
		{"StartCannotRead", key(s(access.ScopeStart), "default"), access.ScopeRead, "default", false, access.MissingScope, "needs the scope read"},
		{"SignalCannotOperate", key(s(access.ScopeSignal), "default"), access.ScopeOperate, "default", false, access.MissingScope, "needs the scope operate"},
		{"OperateCannotAdmin", key(s(access.ScopeOperate), "default"), access.ScopeAdmin, "default", false, access.MissingScope, "needs the scope admin"},
		{"NoScopes", key(nil, "default"), access.ScopeRead, "default", false, access.MissingScope, "holds none"},
		{"SeveralScopes", key(s(access.ScopeRead, access.ScopeSignal), "default"), access.ScopeSignal, "default", false, access.Allowed, ""},
		{"AdminImpliesAll", key(s(access.ScopeAdmin), "default"), access.ScopeOperate, "default", false, access.Allowed, ""},
		{"NamespaceNotGranted", key(s(access.ScopeRead), "team-a"), access.ScopeRead, "default", false, access.NamespaceNotGranted,
			`the key "k" is not granted the namespace "default"`},
		{"ScopeBeforeNamespace", key(s(access.ScopeRead), "team-a"), access.ScopeStart, "default", false, access.MissingScope, "scope start"},
		{"AllNamespaces", key(s(access.ScopeRead), "*"), access.ScopeRead, "team-b", false, access.Allowed, ""},
		{"OneOfSeveral", key(s(access.ScopeRead), "team-a", "team-b"), access.ScopeRead, "team-b", false, access.Allowed, ""},
		{"GlobalIgnoresNamespace", key(s(access.ScopeAdmin), "team-a"), access.ScopeAdmin, "default", true, access.Allowed, ""},
		{"GlobalStillNeedsScope", key(s(access.ScopeRead), "*"), access.ScopeAdmin, "default", true, access.MissingScope, "scope admin"},
		{"OIDCSubject", access.Principal{Subject: "alice", Method: events.ActorOIDC, Scopes: s(access.ScopeRead)}, access.ScopeRead, "default", false,
			access.NamespaceNotGranted, `the OIDC subject "alice" is not granted the namespace "default"`},
		{"Anonymous", access.Anonymous, access.ScopeAdmin, "team-z", false, access.Allowed, ""},
		{"AnyTokenPasses", key(nil, "team-a"), access.ScopeAny, "default", true, access.Allowed, ""},
		{"AnyTokenStillNeedsTheNamespace", key(s(access.ScopeStart), "team-a"), access.ScopeAny, "default", false, access.NamespaceNotGranted, "namespace"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			d := access.Decide(tt.p, tt.need, tt.ns, tt.global)
			require.Equal(t, tt.want, d.Denial)
			if tt.msg == "" {
				require.Empty(t, d.Message)
			} else {
				require.Contains(t, d.Message, tt.msg)
			}
		})
	}
}

// TestCanGrant: nobody hands out more than it holds.
func TestCanGrant(t *testing.T) {
	t.Parallel()

	all := []access.Scope{access.ScopeAdmin}
	for _, tt := range []struct {
		name       string
		creator    access.Principal
		scopes     []access.Scope
		namespaces []string
		why        string
	}{
		{"AdminOfAll", key(all, "*"), []access.Scope{access.ScopeRead}, []string{"*"}, ""},
		{"AdminOfOne", key(all, "team-a"), []access.Scope{access.ScopeAdmin}, []string{"team-a"}, ""},
		{"AdminOfOneForAll", key(all, "team-a"), []access.Scope{access.ScopeRead}, []string{"*"}, `namespaces "*"`},
		{"AdminOfOneForAnother", key(all, "team-a"), []access.Scope{access.ScopeRead}, []string{"team-a", "team-b"}, `namespace "team-b"`},
		{"ScopeNotHeld", key([]access.Scope{access.ScopeRead}, "*"), []access.Scope{access.ScopeStart}, []string{"default"}, "scope start"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			why := access.CanGrant(tt.creator, tt.scopes, tt.namespaces)
			if tt.why == "" {
				require.Empty(t, why)
				require.True(t, access.CanManage(tt.creator, tt.namespaces))
				return
			}
			require.Contains(t, why, tt.why)
		})
	}
	require.False(t, access.CanManage(key(all, "team-a"), []string{"team-b"}))
	require.False(t, access.CanManage(key([]access.Scope{access.ScopeRead}, "*"), []string{"default"}), "only admins manage keys")
}

func TestParse(t *testing.T) {
	t.Parallel()

	scopes, err := access.ParseScopes([]string{"read", " signal", "read"})
	require.NoError(t, err)
	require.Equal(t, []access.Scope{access.ScopeRead, access.ScopeSignal}, scopes)
	_, err = access.ParseScopes([]string{"root"})
	require.ErrorContains(t, err, `scope "root" is not one of read, start, signal, operate, admin`)
	_, err = access.ParseScopes(nil)
	require.Error(t, err)
	_, err = access.ParseScopes([]string{"any"})
	require.ErrorContains(t, err, `scope "any" is not one of`, "no key is made with the scope any routes need")
	require.Equal(t, "scope any: no key holds it", access.CanGrant(access.Principal{Scopes: []access.Scope{access.ScopeAdmin},
		Namespaces: []string{access.AllNamespaces}}, []access.Scope{access.ScopeAny}, nil), "not even the admin grants it")

	ns, err := access.ParseNamespaces([]string{"default", "team-a", "default"})
	require.NoError(t, err)
	require.Equal(t, []string{"default", "team-a"}, ns)
	_, err = access.ParseNamespaces([]string{"*", "default"})
	require.ErrorContains(t, err, "give it alone")
	_, err = access.ParseNamespaces([]string{"Team_A"})
	require.ErrorContains(t, err, access.NamespaceRule)
	_, err = access.ParseNamespaces(nil)
	require.Error(t, err)
}
