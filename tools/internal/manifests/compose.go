package manifests

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

// natsNode names the compose services that are NATS nodes.
var natsNode = regexp.MustCompile(`^n[0-9]+$`)

// CheckCompose loads dir/compose.yaml as docker compose would (the
// compose schema, interpolation, env files) and returns what is wrong
// with it, nil if nothing.
//
// nats, if its version is not empty, is the NATS release the nodes must
// run.
func CheckCompose(ctx context.Context, dir string, nats natsWant) []string {
	var p problems
	const file = "compose.yaml"
	details := types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, file)}},
		Environment: types.Mapping{}, // the defaults written in the file, not this machine's
	}
	project, err := loader.LoadWithContext(ctx, details, func(o *loader.Options) {
		o.SetProjectName("jetflow", true)
	})
	if err != nil {
		p.add(file, "%v", err)
		return p
	}
	var nodes []string
	for name := range project.Services {
		if natsNode.MatchString(name) {
			nodes = append(nodes, name)
		}
	}
	slices.Sort(nodes)
	if len(nodes) != 3 {
		p.add(file, "%d NATS nodes (n1, n2, ...), want 3", len(nodes))
	}
	count := map[string]int{}
	credsOf := map[string]string{}
	apis := map[string]string{}                                       // api service -> the port it listens on
	for _, name := range slices.Sorted(maps.Keys(project.Services)) { // problems in one order, run after run
		s := project.Services[name]
		where := file + ": service " + name
		for _, port := range s.Ports {
			if port.HostIP != "127.0.0.1" {
				p.add(where, "publishes port %s on %q: publish on the host's loopback only (127.0.0.1)", port.Published, port.HostIP)
			}
		}
		if name == balancerService {
			continue // checked once every api is known
		}
		for _, v := range s.Volumes {
			if v.Type == types.VolumeTypeBind && strings.Contains(v.Source, string(filepath.Separator)+"secrets"+string(filepath.Separator)) &&
				(v.Bind == nil || bool(v.Bind.CreateHostPath)) {
				p.add(where, "%s: bind it with create_host_path: false (docker would make a missing file a directory)", v.Source)
			}
		}
		if natsNode.MatchString(name) {
			checkComposeNode(where, name, s, &p)
			if nats.version != "" && (!strings.HasPrefix(s.Image, "nats:") || imageVersion(s.Image) != nats.version) {
				p.add(where, "image %s, but %s: run that release (nats:%s-alpine)", s.Image, nats.because, strings.TrimPrefix(nats.version, "v"))
			}
			continue
		}
		kind := name
		if i := strings.LastIndex(kind, "-"); i > 0 && strings.Trim(kind[i+1:], "0123456789") == "" {
			kind = kind[:i]
		}
		if kind != "bootstrap" && !slices.Contains(services, kind) {
			p.add(where, "neither a NATS node nor one of jetflow's services")
			continue
		}
		replicas := 1
		if s.Deploy != nil && s.Deploy.Replicas != nil {
			replicas = *s.Deploy.Replicas
		}
		count[kind] += replicas
		if kind == "api" {
			if len(s.Ports) > 0 {
				p.add(where, "publishes a port: the apis are reached through the %s only", balancerService)
			}
			if _, port, err := net.SplitHostPort(envOf(s)["JETFLOW_HTTP_ADDR"]); err == nil {
				apis[name] = port
			}
		}
		if u, err := url.Parse(envOf(s)["JETFLOW_API_URL"]); kind == "dispatcher" && (err != nil || u.Hostname() != balancerService) {
			p.add(where, "JETFLOW_API_URL %q: name the %s, which routes around an api that is down", envOf(s)["JETFLOW_API_URL"], balancerService)
		}
		creds := checkComposeService(where, kind, s, nodes, &p)
		if creds != "" {
			if other, ok := credsOf[creds]; ok && kind != "api" {
				p.add(where, "shares %s with %s: each service has its own identity", creds, other)
			}
			credsOf[creds] = name
		}
	}
	if b, ok := project.Services[balancerService]; ok {
		checkComposeBalancer(dir, file+": service "+balancerService, b, apis, &p)
	} else {
		p.add(file, "no service %s in front of the %d apis", balancerService, len(apis))
	}
	for _, k := range append([]string{"bootstrap"}, services...) {
		want := wantReplicas(k)
		if k == "bootstrap" {
			want = 1
		}
		if count[k] < want {
			p.add(file, "%d %s processes, want at least %d", count[k], k, want)
		}
	}
	return p
}

// checkComposeNode checks a NATS node: the official image, its name, a
// health check and a restart policy.
func checkComposeNode(where, name string, s types.ServiceConfig, p *problems) {
	if !strings.HasPrefix(s.Image, "nats:") {
		p.add(where, "image %q, want the official nats image", s.Image)
	}
	if i := slices.Index(s.Command, "--name"); i < 0 || i+1 >= len(s.Command) || s.Command[i+1] != name {
		p.add(where, "command %q: give --name %s (the node's server name)", s.Command, name)
	}
	if s.HealthCheck == nil || s.HealthCheck.Disable || len(s.HealthCheck.Test) == 0 {
		p.add(where, "no health check")
	}
	if s.Restart == "" || s.Restart == "no" {
		p.add(where, "no restart policy")
	}
}

// checkComposeService checks a jetflow process and returns the creds file
// it connects with.
func checkComposeService(where, kind string, s types.ServiceConfig, nodes []string, p *problems) string {
	bin := "jetflow-" + kind
	if kind == "bootstrap" {
		bin = "jetflow"
	}
	if len(s.Command) == 0 || filepath.Base(s.Command[0]) != bin {
		p.add(where, "command %q, want the %s binary", s.Command, bin)
	}
	env := envOf(s)
	urls := strings.Split(env["JETFLOW_NATS_URL"], ",")
	for _, n := range nodes {
		if !slices.ContainsFunc(urls, func(u string) bool {
			pu, err := url.Parse(strings.TrimSpace(u))
			return err == nil && pu.Hostname() == n
		}) {
			p.add(where, "JETFLOW_NATS_URL %q does not list node %s: list every node", env["JETFLOW_NATS_URL"], n)
		}
	}
	if s.Restart == "" || s.Restart == "no" {
		p.add(where, "no restart policy")
	}
	mounts := map[string]string{} // target -> source
	for _, v := range s.Volumes {
		mounts[v.Target] = v.Source
	}
	creds := ""
	if target := env["JETFLOW_NATS_CREDS"]; target == "" {
		p.add(where, "no JETFLOW_NATS_CREDS: every service connects with its own identity")
	} else if src, ok := mounts[target]; !ok {
		p.add(where, "JETFLOW_NATS_CREDS %s: nothing is mounted there", target)
	} else {
		creds = filepath.Base(src)
		role := kind
		if kind == "bootstrap" {
			role = "admin"
		}
		if creds != role+".creds" {
			p.add(where, "connects with %s, want %s.creds", src, role)
		}
	}
	for _, v := range []string{"JETFLOW_NATS_CA", "JETFLOW_ADMIN_TOKEN_FILE"} {
		if target := env[v]; target != "" && (kind == "api" || v == "JETFLOW_NATS_CA") {
			if _, ok := mounts[target]; !ok {
				p.add(where, "%s %s: nothing is mounted there", v, target)
			}
		}
	}
	if kind == "bootstrap" {
		if s.Restart != "on-failure" {
			p.add(where, "restart %q: a one-shot step restarts on failure only", s.Restart)
		}
		return creds
	}
	if d, ok := s.DependsOn["bootstrap"]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
		p.add(where, "does not wait for the bootstrap to complete successfully")
	}
	addrVar := "JETFLOW_HEALTH_ADDR"
	if kind == "api" {
		addrVar = "JETFLOW_HTTP_ADDR"
	}
	_, port, err := net.SplitHostPort(env[addrVar])
	if err != nil {
		p.add(where, "%s %q: want host:port (the probes are off without it)", addrVar, env[addrVar])
	}
	hc := s.HealthCheck
	if hc == nil || hc.Disable || len(hc.Test) < 2 {
		p.add(where, "no health check")
		return creds
	}
	probe := fmt.Sprintf(":%s/readyz", port)
	if hc.Test[0] != "CMD" || !slices.ContainsFunc(hc.Test, func(a string) bool { return strings.HasSuffix(a, probe) }) {
		p.add(where, "health check %q does not ask /readyz on %s's port %s", hc.Test, addrVar, port)
	}
	return creds
}

// envOf is a service's environment, its env files included.
func envOf(s types.ServiceConfig) map[string]string {
	env := map[string]string{}
	for k, v := range s.Environment {
		if v != nil {
			env[k] = *v
		}
	}
	return env
}
