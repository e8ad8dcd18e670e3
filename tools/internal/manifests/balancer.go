package manifests

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
)

// balancerService is the compose service in front of the apis.
const balancerService = "balancer"

// caddyImage is the official caddy image pinned to a release: a tag that
// moves (latest, 2, 2.11) would change the balancer under a deployment.
var caddyImage = regexp.MustCompile(`^caddy:[0-9]+\.[0-9]+\.[0-9]+(-alpine)?$`)

// caddyConfig is where the caddy image reads its Caddyfile.
const caddyConfig = "/etc/caddy/Caddyfile"

// checkComposeBalancer checks the balancer: the pinned official caddy
// image, a committed Caddyfile mounted read-only whose reverse_proxy lists
// every api (on the port it listens on) and checks their /readyz, a
// health check, a restart policy, one port published on the host's
// loopback, and a start after the apis. apis maps each api service to
// its port.
func checkComposeBalancer(dir, where string, s types.ServiceConfig, apis map[string]string, p *problems) {
	if !caddyImage.MatchString(s.Image) {
		p.add(where, "image %q: want the official caddy image pinned to a release (caddy:X.Y.Z-alpine)", s.Image)
	}
	if s.HealthCheck == nil || s.HealthCheck.Disable || len(s.HealthCheck.Test) == 0 {
		p.add(where, "no health check")
	}
	if s.Restart == "" || s.Restart == "no" {
		p.add(where, "no restart policy")
	}
	if len(s.Ports) != 1 {
		p.add(where, "publishes %d ports, want 1: the apis' one address", len(s.Ports))
	}
	for name := range apis {
		if _, ok := s.DependsOn[name]; !ok {
			p.add(where, "does not start after %s", name)
		}
	}
	src := ""
	for _, v := range s.Volumes {
		if v.Target == caddyConfig {
			src = v.Source
			if v.Type != types.VolumeTypeBind || !v.ReadOnly {
				p.add(where, "%s: bind the committed Caddyfile read-only", caddyConfig)
			}
		}
	}
	if src == "" {
		p.add(where, "nothing is mounted at %s: mount the committed Caddyfile", caddyConfig)
		return
	}
	if rel, err := filepath.Rel(dir, src); err != nil || strings.HasPrefix(rel, "..") || strings.Contains(rel, "secrets") {
		p.add(where, "%s: the Caddyfile is committed beside compose.yaml", src)
		return
	}
	b, err := os.ReadFile(src)
	if err != nil {
		p.add(where, "%v", err)
		return
	}
	for _, s := range checkCaddyfile(string(b), apis) {
		p.add(where+": "+filepath.Base(src), "%s", s)
	}
}

// checkCaddyfile checks that the Caddyfile's reverse_proxy balances over
// exactly the apis (host:port as compose names them) and checks their
// readiness actively and passively. It reads the few directives it needs
// and nothing else: caddy itself validates the rest when it starts.
func checkCaddyfile(text string, apis map[string]string) []string {
	var p []string
	var lines [][]string
	for _, l := range strings.Split(text, "\n") {
		if i := strings.Index(l, "#"); i >= 0 {
			l = l[:i]
		}
		if f := strings.Fields(l); len(f) > 0 {
			lines = append(lines, f)
		}
	}
	i := slices.IndexFunc(lines, func(f []string) bool { return f[0] == "reverse_proxy" })
	if i < 0 {
		return []string{"no reverse_proxy"}
	}
	var upstreams []string
	for _, u := range lines[i][1:] {
		if u != "{" {
			upstreams = append(upstreams, u)
		}
	}
	var want []string
	for name, port := range apis {
		want = append(want, net.JoinHostPort(name, port))
	}
	slices.Sort(want)
	got := slices.Clone(upstreams)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		p = append(p, fmt.Sprintf("reverse_proxy to %s, want every api: %s", strings.Join(upstreams, " "), strings.Join(want, " ")))
	}
	directive := map[string][]string{}
	for _, f := range lines[i+1:] {
		if f[0] == "}" {
			break
		}
		directive[f[0]] = f[1:]
	}
	if uri := directive["health_uri"]; len(uri) != 1 || uri[0] != "/readyz" {
		p = append(p, fmt.Sprintf("health_uri %q, want /readyz: an api that is not ready must be left out", strings.Join(uri, " ")))
	}
	for _, d := range []string{"health_interval", "fail_duration", "lb_try_duration"} {
		if len(directive[d]) == 0 {
			p = append(p, "no "+d+": an api that is down must be routed around at once")
		}
	}
	return p
}
