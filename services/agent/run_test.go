package main

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRunChecksPolicyAndSecretsFirst: a policy or a secret source that
// cannot work stops the agent at once, before it waits for NATS (none is
// running here), with a message naming the setting.
//
// Not parallel: run sets zerolog's global time format.
func TestRunChecksPolicyAndSecretsFirst(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope")
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
		msg  string
	}{
		"AllowExecNotABoolean":  {env: map[string]string{"JETFLOW_AGENT_ALLOW_EXEC": "maybe"}, msg: `JETFLOW_AGENT_ALLOW_EXEC="maybe": not a boolean`},
		"AllowListWithoutExec":  {args: []string{"-exec-allow", "echo,ls"}, msg: "exec is not allowed"},
		"RelativeAllowedPath":   {args: []string{"-allow-exec", "-exec-allow", "bin/tool"}, msg: "must be absolute"},
		"BadHostPattern":        {env: map[string]string{"JETFLOW_AGENT_HTTP_ALLOW_HOSTS": "api.example.com, https://x"}, msg: `"https://x"`},
		"MissingSecretsDir":     {args: []string{"-secrets-dir", missing}, msg: "secrets directory"},
		"BadSecretsEnvPrefix":   {env: map[string]string{"JETFLOW_AGENT_SECRETS_ENV_PREFIX": "A-B"}, msg: "secrets environment prefix"},
		"NoNATSStillValidFirst": {args: []string{"-allow-exec=false", "-exec-allow", "sh"}, msg: "exec is not allowed"},
	} {
		env := map[string]string{"JETFLOW_NATS_URL": "nats://127.0.0.1:1"}
		for k, v := range tc.env {
			env[k] = v
		}
		ctx, cancel := context.WithCancel(t.Context())
		var logs bytes.Buffer
		err := run(ctx, tc.args, func(k string) string { return env[k] }, &logs)
		cancel()
		require.ErrorContains(t, err, tc.msg, name)
	}
}
