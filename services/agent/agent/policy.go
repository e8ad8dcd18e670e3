package agent

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"jetflow.dev/pkg/workflow"
)

// ErrRefused is matched (errors.Is) by the failure of an operation the
// agent's [Policy] does not allow: the operation did not run, and the
// failure is final (another attempt would be refused the same way).
var ErrRefused = errors.New("agent: operation refused by the agent's policy")

// refusal says why the policy refuses an operation.
type refusal struct{ msg string }

func (e *refusal) Error() string        { return e.msg }
func (e *refusal) Is(target error) bool { return target == ErrRefused }

func refuse(format string, args ...any) error { return &refusal{msg: fmt.Sprintf(format, args...)} }

// ErrInvalidPolicy is wrapped by [Policy.Validate]'s errors.
var ErrInvalidPolicy = errors.New("agent: invalid policy")

// Policy says which exec and http operations an agent runs; the zero
// Policy refuses exec steps and lets http steps reach any host. Its
// decisions are pure ([Policy.Decide]): they depend on the operation as
// the agent received it (secrets resolved) and nothing else.
type Policy struct {
	// AllowExec lets the agent run exec steps. Default false: an exec
	// step fails at once, without running, with a final error.
	AllowExec bool
	// ExecAllow, when not empty, limits exec steps to these commands.
	// An entry without '/' is a base name: it matches a command written
	// as that bare name, which the agent looks up in its own PATH (a
	// command written with a path, such as ./echo or /tmp/echo, does not
	// match it, whatever its base name). An entry with '/' must be an
	// absolute path: it matches a command written as that path, or a bare
	// command that the agent's PATH resolves to it. Paths are compared as
	// written (cleaned), without following symbolic links; a command with
	// a relative path (bin/tool, ./tool) matches no entry. An interpreter
	// in the list (sh, python) allows whatever it can run.
	ExecAllow []string
	// HTTPAllowHosts, when not empty, limits http steps, and every
	// redirect they follow, to URLs whose host matches one of these
	// patterns: "host" (any port), "host:port", "*.domain" (any name
	// under domain, at any depth, not domain itself; "*.domain:port"
	// too), or an IP address ("[::1]:8080" for IPv6 with a port). Names
	// are compared without case, as written in the URL: a pattern does
	// not check the address a name resolves to. Empty: any host.
	HTTPAllowHosts []string
}

var (
	hostPatternRe = regexp.MustCompile(`^(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$`)
	badCommandRe  = regexp.MustCompile(`[\s\x00]`)
)

// Validate checks the lists' entries.
func (p Policy) Validate() error {
	for _, c := range p.ExecAllow {
		switch {
		case c == "" || badCommandRe.MatchString(c):
			return fmt.Errorf("%w: exec allow-list entry %q: a command name or an absolute path, without spaces", ErrInvalidPolicy, c)
		case strings.Contains(c, "/") && (!filepath.IsAbs(c) || filepath.Clean(c) != c):
			return fmt.Errorf("%w: exec allow-list entry %q: a path must be absolute and clean (e.g. /usr/bin/echo)", ErrInvalidPolicy, c)
		}
	}
	if len(p.ExecAllow) > 0 && !p.AllowExec {
		return fmt.Errorf("%w: an exec allow-list is given but exec is not allowed (allow exec too, or give no list)", ErrInvalidPolicy)
	}
	for _, h := range p.HTTPAllowHosts {
		if _, _, err := parseHostPattern(h); err != nil {
			return fmt.Errorf("%w: http allowed host %q: %w", ErrInvalidPolicy, h, err)
		}
	}
	return nil
}

// Operation is what [Policy.Decide] decides about: an operation as the
// agent is about to run it.
type Operation struct {
	// Kind is the task's operation kind (exec, http, or another).
	Kind string
	// Command is an exec step's command as written, and CommandPath the
	// absolute path the agent's PATH resolves a bare command to ("" when
	// not found, or for a command with a path).
	Command, CommandPath string
	// URL is an http step's URL (or a redirect's).
	URL string
}

// OperationOf returns the operation a step would run; lookPath resolves a
// bare command (exec.LookPath, whose error means "not found").
func OperationOf(kind string, s workflow.Step, lookPath func(string) (string, error)) Operation {
	op := Operation{Kind: kind, Command: s.Command, URL: s.URL}
	if kind == workflow.KindExec && s.Command != "" && !strings.Contains(s.Command, "/") && lookPath != nil {
		if path, err := lookPath(s.Command); err == nil {
			if abs, err := filepath.Abs(path); err == nil {
				op.CommandPath = abs
			}
		}
	}
	return op
}

// Decide returns nil if p allows op, else an error wrapping [ErrRefused]
// that says why. It is pure.
func (p Policy) Decide(op Operation) error {
	switch op.Kind {
	case workflow.KindExec:
		if !p.AllowExec {
			return refuse("exec steps are not enabled on this agent (its operator enables them with -allow-exec)")
		}
		if len(p.ExecAllow) == 0 || p.commandAllowed(op) {
			return nil
		}
		return refuse("command %q is not in this agent's exec allow-list (-exec-allow)", op.Command)
	case workflow.KindHTTP:
		return p.DecideURL(op.URL)
	}
	return nil
}

func (p Policy) commandAllowed(op Operation) bool {
	bare := !strings.Contains(op.Command, "/")
	abs := filepath.IsAbs(op.Command)
	return slices.ContainsFunc(p.ExecAllow, func(entry string) bool {
		if !strings.Contains(entry, "/") {
			return bare && op.Command == entry
		}
		return (abs && filepath.Clean(op.Command) == entry) || (bare && op.CommandPath != "" && op.CommandPath == entry)
	})
}

// DecideURL is [Policy.Decide] for an http request to rawURL (a step's
// URL, or a redirect's).
func (p Policy) DecideURL(rawURL string) error {
	if len(p.HTTPAllowHosts) == 0 {
		return nil
	}
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" {
		return refuse("the URL has no host this agent's http allow-list could match")
	}
	host, port := strings.TrimSuffix(strings.ToLower(u.Hostname()), "."), u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[strings.ToLower(u.Scheme)]
	}
	for _, pattern := range p.HTTPAllowHosts {
		if hostMatches(pattern, host, port) {
			return nil
		}
	}
	return refuse("host %q is not in this agent's http allow-list (-http-allow-hosts)", u.Host)
}

var errNotHostPattern = errors.New("not a host name, *.domain or IP address, with an optional :port")

// parseHostPattern splits a host pattern into its (lower-case) host and
// port ("" for any).
func parseHostPattern(pattern string) (host, port string, err error) {
	host = strings.ToLower(pattern)
	if strings.ContainsAny(host, "/@?#") {
		return "", "", errNotHostPattern
	}
	if h, p, err := net.SplitHostPort(host); err == nil {
		n, perr := strconv.Atoi(p)
		if perr != nil || n < 1 || n > 65535 {
			return "", "", fmt.Errorf("port %q is not a port number", p)
		}
		host, port = h, p
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	if net.ParseIP(host) != nil {
		return host, port, nil
	}
	if !hostPatternRe.MatchString(host) {
		return "", "", errNotHostPattern
	}
	return host, port, nil
}

func hostMatches(pattern, host, port string) bool {
	ph, pp, err := parseHostPattern(pattern)
	if err != nil || (pp != "" && pp != port) {
		return false
	}
	if ip := net.ParseIP(ph); ip != nil {
		return ip.Equal(net.ParseIP(host))
	}
	if domain, ok := strings.CutPrefix(ph, "*."); ok {
		return strings.HasSuffix(host, "."+domain)
	}
	return host == ph
}
