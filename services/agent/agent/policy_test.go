package agent_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/agent/agent"
)

// TestPolicyDecide: the decision table of the agent's policy. Every
// refusal wraps agent.ErrRefused and says why.
func TestPolicyDecide(t *testing.T) {
	t.Parallel()

	execOn := agent.Policy{AllowExec: true}
	listed := agent.Policy{AllowExec: true, ExecAllow: []string{"echo", "/usr/local/bin/deploy"}}
	hosts := agent.Policy{HTTPAllowHosts: []string{"api.example.com", "*.internal.example", "hooks.example.org:8443", "127.0.0.1", "[::1]:9000"}}
	exec := func(cmd, path string) agent.Operation {
		return agent.Operation{Kind: workflow.KindExec, Command: cmd, CommandPath: path}
	}
	http := func(u string) agent.Operation { return agent.Operation{Kind: workflow.KindHTTP, URL: u} }

	tests := []struct {
		name   string
		policy agent.Policy
		op     agent.Operation
		refuse string // "" allowed; else a text of the refusal
	}{
		{"ExecOffByDefault", agent.Policy{}, exec("echo", "/bin/echo"), "exec steps are not enabled on this agent"},
		{"ExecOn", execOn, exec("anything", ""), ""},
		{"ExecOnAbsolute", execOn, exec("/opt/x/run", ""), ""},
		{"ListedBareName", listed, exec("echo", "/bin/echo"), ""},
		{"ListedBareNameNotOnPath", listed, exec("echo", ""), ""},
		{"BaseNameWithAPathDoesNotMatch", listed, exec("/tmp/evil/echo", ""), `command "/tmp/evil/echo" is not in this agent's exec allow-list`},
		{"RelativePathDoesNotMatch", listed, exec("./echo", ""), "not in this agent's exec allow-list"},
		{"ListedAbsolutePath", listed, exec("/usr/local/bin/deploy", ""), ""},
		{"ListedAbsolutePathUncleaned", listed, exec("/usr/local/bin/../bin/deploy", ""), ""},
		{"BareCommandResolvedToListedPath", listed, exec("deploy", "/usr/local/bin/deploy"), ""},
		{"BareCommandResolvedElsewhere", listed, exec("deploy", "/home/u/bin/deploy"), "not in this agent's exec allow-list"},
		{"NotListed", listed, exec("rm", "/bin/rm"), `command "rm" is not in`},
		{"ShellNotListed", listed, exec("sh", "/bin/sh"), "not in this agent's exec allow-list"},
		{"HTTPAnyHost", agent.Policy{}, http("https://anywhere.example.net/x"), ""},
		{"HTTPExactHost", hosts, http("https://api.example.com/v1"), ""},
		{"HTTPExactHostAnyPort", hosts, http("http://API.example.com:8080/v1"), ""},
		{"HTTPTrailingDot", hosts, http("https://api.example.com./v1"), ""},
		{"HTTPOtherHost", hosts, http("https://evil.example.com/"), `host "evil.example.com" is not in this agent's http allow-list`},
		{"HTTPSuffixIsNotSubdomain", hosts, http("https://notapi.example.com/"), "not in this agent's http allow-list"},
		{"HTTPWildcardSubdomain", hosts, http("https://db.internal.example/"), ""},
		{"HTTPWildcardDeep", hosts, http("https://a.b.internal.example/"), ""},
		{"HTTPWildcardNotApex", hosts, http("https://internal.example/"), "not in this agent's http allow-list"},
		{"HTTPWildcardLookalike", hosts, http("https://evilinternal.example/"), "not in this agent's http allow-list"},
		{"HTTPPort", hosts, http("https://hooks.example.org:8443/x"), ""},
		{"HTTPWrongPort", hosts, http("https://hooks.example.org/x"), "not in this agent's http allow-list"},
		{"HTTPIPv4", hosts, http("http://127.0.0.1:4222/"), ""},
		{"HTTPIPv6WithPort", hosts, http("http://[::1]:9000/"), ""},
		{"HTTPIPv6OtherPort", hosts, http("http://[::1]:9001/"), "not in this agent's http allow-list"},
		{"HTTPUserInfoIsNotTheHost", hosts, http("https://api.example.com@evil.example.com/"), `host "evil.example.com"`},
		{"HTTPNoHost", hosts, http("/relative"), "no host"},
		{"OtherKinds", agent.Policy{}, agent.Operation{Kind: "provision-vm"}, ""},
		{"NoopAndLog", agent.Policy{}, agent.Operation{Kind: workflow.KindLog}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.NoError(t, tc.policy.Validate())
			err := tc.policy.Decide(tc.op)
			if tc.refuse == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, agent.ErrRefused)
			require.ErrorContains(t, err, tc.refuse)
		})
	}
}

func TestPolicyValidate(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name   string
		policy agent.Policy
		msg    string
	}{
		{"Zero", agent.Policy{}, ""},
		{"Full", agent.Policy{AllowExec: true, ExecAllow: []string{"echo", "/usr/bin/env"}, HTTPAllowHosts: []string{"a.example", "*.b.example:443", "10.0.0.1:80", "::1"}}, ""},
		{"ListWithoutExec", agent.Policy{ExecAllow: []string{"echo"}}, "exec is not allowed"},
		{"EmptyCommand", agent.Policy{AllowExec: true, ExecAllow: []string{""}}, "without spaces"},
		{"CommandWithSpace", agent.Policy{AllowExec: true, ExecAllow: []string{"rm -rf"}}, "without spaces"},
		{"RelativePath", agent.Policy{AllowExec: true, ExecAllow: []string{"bin/tool"}}, "must be absolute"},
		{"UncleanPath", agent.Policy{AllowExec: true, ExecAllow: []string{"/usr/bin/../bin/x"}}, "must be absolute and clean"},
		{"HostWithScheme", agent.Policy{HTTPAllowHosts: []string{"https://a.example"}}, "not a host name"},
		{"HostWithPath", agent.Policy{HTTPAllowHosts: []string{"a.example/x"}}, "not a host name"},
		{"WildcardInside", agent.Policy{HTTPAllowHosts: []string{"a.*.example"}}, "not a host name"},
		{"BadPort", agent.Policy{HTTPAllowHosts: []string{"a.example:99999"}}, "not a port number"},
		{"EmptyHost", agent.Policy{HTTPAllowHosts: []string{""}}, "not a host name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.policy.Validate()
			if tc.msg == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, agent.ErrInvalidPolicy)
			require.ErrorContains(t, err, tc.msg)
		})
	}
}

func TestOperationOf(t *testing.T) {
	t.Parallel()
	look := func(name string) (string, error) {
		if name == "echo" {
			return "/bin/echo", nil
		}
		return "", errors.New("not found")
	}
	require.Equal(t, agent.Operation{Kind: workflow.KindExec, Command: "echo", CommandPath: "/bin/echo"},
		agent.OperationOf(workflow.KindExec, workflow.Step{Command: "echo"}, look))
	require.Equal(t, agent.Operation{Kind: workflow.KindExec, Command: "nope"},
		agent.OperationOf(workflow.KindExec, workflow.Step{Command: "nope"}, look))
	require.Equal(t, agent.Operation{Kind: workflow.KindExec, Command: "/bin/echo"},
		agent.OperationOf(workflow.KindExec, workflow.Step{Command: "/bin/echo"}, look), "a path is not looked up")
	require.Equal(t, agent.Operation{Kind: workflow.KindHTTP, URL: "https://a.example"},
		agent.OperationOf(workflow.KindHTTP, workflow.Step{URL: "https://a.example"}, look))
}
