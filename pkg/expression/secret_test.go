package expression_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/expression"
)

var secretRoots = append(append([]string{}, expression.Roots...), expression.SecretRoot)

// TestCompileSecretReferences: ${secret.NAME} is accepted alone in its
// ${...}, with a valid name, where the roots allow secrets; anything else
// that uses the secret root is refused with a message saying why.
func TestCompileSecretReferences(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name  string
		in    any
		roots []string
		err   error // nil: compiles
	}{
		{"Alone", "${secret.TOKEN}", secretRoots, nil},
		{"Spaces", "${ secret.TOKEN }", secretRoots, nil},
		{"InText", "Bearer ${secret.TOKEN} for ${input.host}", secretRoots, nil},
		{"DashAndUnderscore", "${secret.api-key_2}", secretRoots, nil},
		{"Nested", map[string]any{"a": []any{"x", "${secret.A}"}}, secretRoots, nil},
		{"NotAllowedHere", "${secret.TOKEN}", nil, expression.ErrSecretNotAllowed},
		{"NotAllowedInExpression", "${secret.TOKEN + 'x'}", nil, expression.ErrSecretNotAllowed},
		{"InExpression", "${secret.TOKEN + 'x'}", secretRoots, expression.ErrSecretInExpression},
		{"Index", `${secret["TOKEN"]}`, secretRoots, expression.ErrSecretInExpression},
		{"Bare", "${secret}", secretRoots, expression.ErrSecretInExpression},
		{"Function", "${upper(secret.TOKEN)}", secretRoots, expression.ErrSecretInExpression},
		{"DottedName", "${secret.a.b}", secretRoots, expression.ErrSecretName},
		{"EmptyName", "${secret.}", secretRoots, expression.ErrSecretName},
		{"TooLong", fmt.Sprintf("${secret.%0129d}", 0), secretRoots, expression.ErrSecretName},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := expression.Compile(tc.in, tc.roots)
			if tc.err == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.err)
			var ee *expression.Error
			require.ErrorAs(t, err, &ee)
		})
	}
	require.ErrorIs(t, expression.CompileCondition("${secret.X}", secretRoots), expression.ErrSecretNotAllowed)
	require.ErrorIs(t, expression.CompileCondition("secret.X == 'a'", nil), expression.ErrSecretNotAllowed)
	require.ErrorContains(t, expression.Compile("${inptu.x}", secretRoots), "unknown name inptu")
}

// TestRenderSecrets: the dispatcher keeps references as ${secret.NAME} and
// gives the agent a template per string that holds one, with every other
// '$' doubled: text from the input can never read as a reference.
func TestRenderSecrets(t *testing.T) {
	t.Parallel()
	e := env()
	e["input"].(map[string]any)["evil"] = "${secret.OTHER}"
	e["input"].(map[string]any)["cost"] = "5$"

	tests := []struct {
		name  string
		in    any
		out   any
		tmpls map[string]string
	}{
		{"NoSecret", "host ${input.host}", "host db1", nil},
		{"NoSecretKeepsType", "${input.n}", float64(3), nil},
		{"Alone", "${secret.TOKEN}", "${secret.TOKEN}", map[string]string{"": "${secret.TOKEN}"}},
		{"InText", "Bearer ${secret.TOKEN} on ${input.host}", "Bearer ${secret.TOKEN} on db1",
			map[string]string{"": "Bearer ${secret.TOKEN} on db1"}},
		{"DollarDoubled", "$HOME ${secret.T}", "$HOME ${secret.T}", map[string]string{"": "$$HOME ${secret.T}"}},
		{"EscapedLiteral", "$${x} ${secret.T}", "${x} ${secret.T}", map[string]string{"": "$${x} ${secret.T}"}},
		{"InjectedReferenceIsText", "${input.evil} ${secret.T}", "${secret.OTHER} ${secret.T}",
			map[string]string{"": "$${secret.OTHER} ${secret.T}"}},
		{"DollarBeforeReference", "${input.cost}${secret.T}", "5$${secret.T}", map[string]string{"": "5$$${secret.T}"}},
		{"NumberInText", "${input.n}:${secret.T}", "3:${secret.T}", map[string]string{"": "3:${secret.T}"}},
		{"Nested", map[string]any{"auth": map[string]any{"token": "${secret.T}", "user": "${input.host}"}, "a/b": []any{1, "x ${secret.U}"}},
			map[string]any{"auth": map[string]any{"token": "${secret.T}", "user": "db1"}, "a/b": []any{1, "x ${secret.U}"}},
			map[string]string{"/auth/token": "${secret.T}", "/a~1b/1": "x ${secret.U}"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			out, tmpls, err := expression.RenderSecrets(tc.in, e)
			require.NoError(t, err)
			require.Equal(t, tc.out, out)
			require.Equal(t, tc.tmpls, tmpls)
			if s, ok := tc.in.(string); ok {
				text, tmpl, err := expression.RenderSecretString(s, e)
				require.NoError(t, err)
				require.Equal(t, fmt.Sprint(tc.out), text)
				require.Equal(t, tc.tmpls[""], tmpl)
			}
		})
	}
	_, _, err := expression.RenderSecrets("${secret.T} ${vars.missing.x}", e)
	var ee *expression.Error
	require.ErrorAs(t, err, &ee)
}

// TestResolveSecrets: the agent's side. A rendered template resolves to
// the text with the secrets' values; data that looked like a reference
// stays text; a malformed template is refused.
func TestResolveSecrets(t *testing.T) {
	t.Parallel()
	values := map[string]string{"T": "tok$en", "U": "u"}
	lookup := func(name string) (string, error) {
		v, ok := values[name]
		if !ok {
			return "", fmt.Errorf("no secret %s", name)
		}
		return v, nil
	}

	tests := []struct {
		name  string
		tmpl  string
		want  string
		names []string
		err   string
	}{
		{"Alone", "${secret.T}", "tok$en", []string{"T"}, ""},
		{"Text", "Bearer ${secret.T}!", "Bearer tok$en!", []string{"T"}, ""},
		{"Two", "${secret.U}:${secret.T}:${secret.U}", "u:tok$en:u", []string{"U", "T"}, ""},
		{"Dollars", "$$HOME $$${secret.U}", "$HOME $u", []string{"U"}, ""},
		{"EscapedReference", "$${secret.T}", "${secret.T}", nil, ""},
		{"Empty", "", "", nil, ""},
		{"Missing", "${secret.NOPE}", "", []string{"NOPE"}, "no secret NOPE"},
		{"LoneDollar", "a$b", "", nil, "a lone $"},
		{"NotASecret", "${input.x}", "", nil, "a lone $"},
		{"Unclosed", "${secret.T", "", nil, "unclosed"},
		{"BadName", "${secret.a.b}", "", nil, "not a secret name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := expression.ResolveSecrets(tc.tmpl, lookup)
			names, nerr := expression.TemplateSecrets(tc.tmpl)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				if tc.names == nil {
					require.True(t, errors.Is(nerr, expression.ErrSecretTemplate))
				}
				return
			}
			require.NoError(t, err)
			require.NoError(t, nerr)
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.names, names)
		})
	}
}

// TestRenderThenResolve: whatever the input holds, resolving the rendered
// template gives the text the definition meant, with the secret in place
// of its reference and nothing else resolved.
func TestRenderThenResolve(t *testing.T) {
	t.Parallel()
	for _, data := range []string{"", "$", "$$", "${secret.T}", "$${secret.T}", "a}b", "${", "$}{"} {
		e := map[string]any{"input": map[string]any{"d": data}}
		_, tmpl, err := expression.RenderSecretString("<${input.d}|${secret.T}|${input.d}>", e)
		require.NoError(t, err, data)
		got, err := expression.ResolveSecrets(tmpl, func(string) (string, error) { return "S", nil })
		require.NoError(t, err, data)
		require.Equal(t, "<"+data+"|S|"+data+">", got, data)
	}
}

func TestHasSecrets(t *testing.T) {
	t.Parallel()
	require.True(t, expression.HasSecrets(map[string]any{"a": []any{"x ${secret.A}"}}))
	require.False(t, expression.HasSecrets("$${secret.A} ${input.secret}"))
	require.False(t, expression.HasSecrets(nil))
	require.True(t, expression.ValidSecretName("API_token-2"))
	require.False(t, expression.ValidSecretName("../etc"))
	require.False(t, expression.ValidSecretName(""))
}
