package manifests

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// services are jetflow's long-running programs: each a Deployment and a
// compose service of its own.
var services = []string{"api", "dispatcher", "agent", "janitor"}

// kustomization is the part of kustomize's Kustomization the base uses;
// decoded strictly, a field it does not list is refused.
type kustomization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Labels     []struct {
		Pairs            map[string]string `json:"pairs"`
		IncludeSelectors bool              `json:"includeSelectors,omitempty"`
		IncludeTemplates bool              `json:"includeTemplates,omitempty"`
	} `json:"labels,omitempty"`
	Resources []string `json:"resources"`
	Images    []struct {
		Name    string `json:"name"`
		NewName string `json:"newName,omitempty"`
		NewTag  string `json:"newTag,omitempty"`
		Digest  string `json:"digest,omitempty"`
	} `json:"images,omitempty"`
}

// k8sObjects are the decoded manifests, by kind.
type k8sObjects struct {
	deployments []*appsv1.Deployment
	pdbs        []*policyv1.PodDisruptionBudget
	jobs        []*batchv1.Job
	services    []*corev1.Service
	configMaps  []*corev1.ConfigMap
	secrets     []*corev1.Secret
}

// problems collects what is wrong, each prefixed with where.
type problems []string

func (p *problems) add(where, format string, args ...any) {
	*p = append(*p, where+": "+fmt.Sprintf(format, args...))
}

// CheckK8s checks the kustomize base in dir (deployments/k8s) and returns
// what is wrong with it, nil if nothing.
func CheckK8s(dir string) []string {
	var p problems
	var k kustomization
	if err := decodeFile(filepath.Join(dir, "kustomization.yaml"), &k); err != nil {
		p.add("kustomization.yaml", "%v", err)
		return p
	}
	if k.Kind != "Kustomization" {
		p.add("kustomization.yaml", "kind %q, want Kustomization", k.Kind)
	}
	var objs k8sObjects
	for _, r := range k.Resources {
		p = append(p, decodeManifests(dir, r, &objs)...)
	}
	// A manifest beside the others that the base does not apply is a
	// mistake (nats-values.yaml is the NATS chart's, not a manifest).
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, f := range files {
		base := filepath.Base(f)
		if base != "kustomization.yaml" && base != "nats-values.yaml" && !slices.Contains(k.Resources, base) {
			p.add(base, "not listed in kustomization.yaml's resources")
		}
	}
	secrets, err := ScriptSecrets(filepath.Join(dir, "secrets.sh"))
	if err != nil {
		p.add("secrets.sh", "%v", err)
	}
	for _, s := range objs.secrets {
		p.add("Secret "+s.Name, "secret material is not committed: secrets.sh creates the Secrets")
	}
	p = append(p, checkObjects(objs, secrets)...)
	p = append(p, checkNATSValues(filepath.Join(dir, "nats-values.yaml"), secrets)...)
	return p
}

// decodeFile strictly decodes the YAML file into v.
func decodeFile(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return yaml.UnmarshalStrict(b, v)
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeManifests strictly decodes every document of the file into the
// typed object its apiVersion and kind name.
func decodeManifests(dir, file string, objs *k8sObjects) []string {
	var p problems
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		p.add(file, "%v", err)
		return p
	}
	for i, doc := range docSeparator.Split(string(b), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		where := fmt.Sprintf("%s (document %d)", file, i+1)
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			p.add(where, "%v", err)
			continue
		}
		var err error
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 Deployment":
			err = strictInto(doc, &objs.deployments)
		case "policy/v1 PodDisruptionBudget":
			err = strictInto(doc, &objs.pdbs)
		case "batch/v1 Job":
			err = strictInto(doc, &objs.jobs)
		case "v1 Service":
			err = strictInto(doc, &objs.services)
		case "v1 ConfigMap":
			err = strictInto(doc, &objs.configMaps)
		case "v1 Secret":
			err = strictInto(doc, &objs.secrets)
		default:
			err = fmt.Errorf("apiVersion %q kind %q: not a kind this check knows (add it)", meta.APIVersion, meta.Kind)
		}
		if err != nil {
			p.add(where, "%v", err)
		}
	}
	return p
}

// strictInto decodes doc into a new T, refusing unknown fields, and
// appends it to list.
func strictInto[T any](doc string, list *[]*T) error {
	v := new(T)
	if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
		return err
	}
	*list = append(*list, v)
	return nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for line := range strings.Lines(doc) {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
		}
	}
	return b.String()
}

var (
	applyLine = regexp.MustCompile(`(?m)^\s*apply\s+"?([a-z0-9][a-z0-9.-]*)"?\s`)
	roleLoop  = regexp.MustCompile(`(?m)^\s*for role in ([a-z ]+); do\s*\n\s*apply\s+"jetflow-creds-\$role"`)
)

// ScriptSecrets returns the names of the Secrets secrets.sh (at path)
// creates: its apply lines, and the creds loop over the roles.
func ScriptSecrets(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, m := range applyLine.FindAllStringSubmatch(string(b), -1) {
		names = append(names, m[1])
	}
	if m := roleLoop.FindStringSubmatch(string(b)); m != nil {
		for _, role := range strings.Fields(m[1]) {
			names = append(names, "jetflow-creds-"+role)
		}
	}
	if len(names) == 0 {
		return nil, errors.New("creates no Secret that this check can read (apply NAME ... lines)")
	}
	return names, nil
}

// checkObjects checks the cross-references between the manifests.
func checkObjects(o k8sObjects, secrets []string) []string {
	var p problems
	configMaps := map[string]*corev1.ConfigMap{}
	for _, c := range o.configMaps {
		configMaps[c.Name] = c
	}
	creds := map[string]string{} // creds Secret -> Deployment using it
	kinds := map[string]int{}
	for _, d := range o.deployments {
		where := "Deployment " + d.Name
		kind := strings.TrimPrefix(d.Name, "jetflow-")
		if !slices.Contains(services, kind) {
			p.add(where, "not one of jetflow's services (jetflow-%s)", strings.Join(services, ", jetflow-"))
		}
		kinds[kind]++
		if d.Spec.Replicas == nil || *d.Spec.Replicas < 1 {
			p.add(where, "no replicas")
		} else if want := wantReplicas(kind); int(*d.Spec.Replicas) < want {
			p.add(where, "%d replicas, want at least %d", *d.Spec.Replicas, want)
		}
		if d.Spec.Selector == nil || len(d.Spec.Selector.MatchLabels) == 0 {
			p.add(where, "no selector")
		} else if !subset(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
			p.add(where, "its selector does not select its own pods")
		}
		pdbs := 0
		for _, b := range o.pdbs {
			if b.Spec.Selector != nil && len(b.Spec.Selector.MatchLabels) > 0 && subset(b.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
				pdbs++
			}
		}
		if pdbs != 1 {
			p.add(where, "%d PodDisruptionBudgets select its pods, want 1", pdbs)
		}
		if d.Spec.Template.Spec.TerminationGracePeriodSeconds == nil || *d.Spec.Template.Spec.TerminationGracePeriodSeconds < 20 {
			p.add(where, "terminationGracePeriodSeconds must be at least 20 (docs/configuration.md#stopping-a-service)")
		}
		s := checkPod(where, d.Spec.Template.Spec, kind, configMaps, secrets, &p)
		if s != "" {
			if other, ok := creds[s]; ok {
				p.add(where, "shares the creds Secret %s with %s: each service has its own identity", s, other)
			}
			creds[s] = d.Name
		}
	}
	for _, k := range services {
		if kinds[k] != 1 {
			p.add("manifests", "%d Deployments of jetflow-%s, want 1", kinds[k], k)
		}
	}
	for _, b := range o.pdbs {
		n := 0
		for _, d := range o.deployments {
			if b.Spec.Selector != nil && len(b.Spec.Selector.MatchLabels) > 0 && subset(b.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
				n++
			}
		}
		if n != 1 {
			p.add("PodDisruptionBudget "+b.Name, "selects the pods of %d Deployments, want 1", n)
		}
		if (b.Spec.MinAvailable == nil) == (b.Spec.MaxUnavailable == nil) {
			p.add("PodDisruptionBudget "+b.Name, "give minAvailable or maxUnavailable")
		}
	}
	for _, s := range o.services {
		where := "Service " + s.Name
		var target *appsv1.Deployment
		for _, d := range o.deployments {
			if len(s.Spec.Selector) > 0 && subset(s.Spec.Selector, d.Spec.Template.Labels) {
				target = d
			}
		}
		if target == nil {
			p.add(where, "selects no Deployment's pods")
			continue
		}
		for _, port := range s.Spec.Ports {
			if _, ok := containerPort(target.Spec.Template.Spec, port.TargetPort); !ok {
				p.add(where, "targetPort %s is no container port of %s", port.TargetPort.String(), target.Name)
			}
		}
	}
	if len(o.jobs) != 1 {
		p.add("manifests", "%d Jobs, want 1 (the bootstrap)", len(o.jobs))
	}
	for _, j := range o.jobs {
		where := "Job " + j.Name
		s := checkPod(where, j.Spec.Template.Spec, "bootstrap", configMaps, secrets, &p)
		if s != "jetflow-creds-admin" {
			p.add(where, "the bootstrap connects as the admin identity (jetflow-creds-admin), not %q", s)
		}
	}
	for _, c := range o.configMaps {
		if u, ok := c.Data["JETFLOW_NATS_URL"]; ok {
			if n := len(strings.Split(u, ",")); n < 3 {
				p.add("ConfigMap "+c.Name, "JETFLOW_NATS_URL lists %d servers: list every node of the cluster (3)", n)
			}
		}
	}
	return p
}

func wantReplicas(kind string) int {
	if kind == "janitor" {
		return 1
	}
	return 2
}

// checkPod checks a pod of a service (or the bootstrap) and returns the
// name of the Secret its creds come from.
func checkPod(where string, spec corev1.PodSpec, kind string, configMaps map[string]*corev1.ConfigMap, secrets []string, p *problems) string {
	volumes := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
		if v.Secret != nil && !slices.Contains(secrets, v.Secret.SecretName) {
			p.add(where, "volume %s: Secret %q is not one secrets.sh creates", v.Name, v.Secret.SecretName)
		}
		if v.ConfigMap != nil && configMaps[v.ConfigMap.Name] == nil {
			p.add(where, "volume %s: no ConfigMap %q in the manifests", v.Name, v.ConfigMap.Name)
		}
	}
	if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		p.add(where, "runAsNonRoot is not set")
	}
	if len(spec.Containers) != 1 {
		p.add(where, "%d containers, want 1", len(spec.Containers))
		return ""
	}
	c := spec.Containers[0]
	where += " container " + c.Name
	bin := "jetflow-" + kind
	if kind == "bootstrap" {
		bin = "jetflow"
	}
	if len(c.Command) == 0 || filepath.Base(c.Command[0]) != bin {
		p.add(where, "command %q, want the %s binary", c.Command, bin)
	}
	env := map[string]string{}
	for _, e := range c.EnvFrom {
		switch {
		case e.ConfigMapRef != nil:
			cm := configMaps[e.ConfigMapRef.Name]
			if cm == nil {
				p.add(where, "envFrom: no ConfigMap %q in the manifests", e.ConfigMapRef.Name)
				continue
			}
			for k, v := range cm.Data {
				env[k] = v
			}
		case e.SecretRef != nil:
			if !slices.Contains(secrets, e.SecretRef.Name) {
				p.add(where, "envFrom: Secret %q is not one secrets.sh creates", e.SecretRef.Name)
			}
		}
	}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && !slices.Contains(secrets, e.ValueFrom.SecretKeyRef.Name) {
			p.add(where, "env %s: Secret %q is not one secrets.sh creates", e.Name, e.ValueFrom.SecretKeyRef.Name)
		}
	}
	credsSecret := ""
	mounts := map[string]string{} // mount path -> Secret
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		if !ok {
			p.add(where, "volumeMount %s: no such volume", m.Name)
			continue
		}
		if v.Secret != nil {
			mounts[m.MountPath] = v.Secret.SecretName
		}
	}
	if credsPath := env["JETFLOW_NATS_CREDS"]; credsPath == "" {
		p.add(where, "no JETFLOW_NATS_CREDS: every service connects with its own identity")
	} else if s, ok := mounts[filepath.Dir(credsPath)]; !ok {
		p.add(where, "JETFLOW_NATS_CREDS %s: no Secret is mounted at %s", credsPath, filepath.Dir(credsPath))
	} else {
		credsSecret = s
		if kind != "bootstrap" && s != "jetflow-creds-"+kind {
			p.add(where, "its creds come from %s, want jetflow-creds-%s", s, kind)
		}
	}
	if ca := env["JETFLOW_NATS_CA"]; ca != "" {
		if _, ok := mounts[filepath.Dir(ca)]; !ok {
			p.add(where, "JETFLOW_NATS_CA %s: no Secret is mounted at %s", ca, filepath.Dir(ca))
		}
	}
	if tf := env["JETFLOW_ADMIN_TOKEN_FILE"]; tf != "" && kind == "api" {
		if _, ok := mounts[filepath.Dir(tf)]; !ok {
			p.add(where, "JETFLOW_ADMIN_TOKEN_FILE %s: no Secret is mounted at %s", tf, filepath.Dir(tf))
		}
	}
	r := c.Resources
	for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := r.Requests[res]; !ok {
			p.add(where, "no %s request", res)
		}
	}
	if _, ok := r.Limits[corev1.ResourceMemory]; !ok {
		p.add(where, "no memory limit")
	}
	if _, ok := r.Limits[corev1.ResourceCPU]; ok {
		p.add(where, "a CPU limit throttles the process: a dispatcher starved for 1 s loses its partitions (docs/reliability.md); request CPU instead")
	}
	if kind == "bootstrap" {
		return credsSecret
	}
	// The probes: on the address the service listens on for them.
	addrVar := "JETFLOW_HEALTH_ADDR"
	if kind == "api" {
		addrVar = "JETFLOW_HTTP_ADDR"
	}
	listen := env[addrVar]
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		p.add(where, "%s %q: want host:port (the probes are off without it)", addrVar, listen)
	} else if host == "127.0.0.1" || host == "localhost" {
		p.add(where, "%s %q: the kubelet probes the pod's address, not its loopback", addrVar, listen)
	}
	for _, pr := range []struct {
		name, path string
		probe      *corev1.Probe
	}{{"livenessProbe", "/healthz", c.LivenessProbe}, {"readinessProbe", "/readyz", c.ReadinessProbe}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			p.add(where, "no %s (HTTP GET %s)", pr.name, pr.path)
			continue
		}
		if pr.probe.HTTPGet.Path != pr.path {
			p.add(where, "%s asks %s, want %s", pr.name, pr.probe.HTTPGet.Path, pr.path)
		}
		n, ok := containerPort(spec, pr.probe.HTTPGet.Port)
		if !ok {
			p.add(where, "%s: port %s is no container port", pr.name, pr.probe.HTTPGet.Port.String())
		} else if err == nil && strconv.Itoa(int(n)) != port {
			p.add(where, "%s: port %d, but %s listens on %s", pr.name, n, addrVar, port)
		}
	}
	return credsSecret
}

// containerPort finds the port (a number or a name) among the pod's
// container ports.
func containerPort(spec corev1.PodSpec, port intstr.IntOrString) (int32, bool) {
	for _, c := range spec.Containers {
		for _, cp := range c.Ports {
			if (port.Type == intstr.String && cp.Name == port.StrVal) || (port.Type == intstr.Int && cp.ContainerPort == port.IntVal) {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

// subset says whether every label of sel is in labels.
func subset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// checkNATSValues checks the NATS chart's values: a 3-node JetStream
// cluster on file storage, TLS from a Secret secrets.sh makes, jetflow's
// operator configuration included and mounted.
func checkNATSValues(path string, secrets []string) []string {
	var p problems
	const where = "nats-values.yaml"
	b, err := os.ReadFile(path)
	if err != nil {
		p.add(where, "%v", err)
		return p
	}
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		p.add(where, "%v", err)
		return p
	}
	want := map[string]any{
		"config.cluster.enabled":               true,
		"config.cluster.replicas":              float64(3),
		"config.cluster.tls.enabled":           true,
		"config.cluster.tls.merge.verify":      true,
		"config.jetstream.enabled":             true,
		"config.jetstream.fileStore.enabled":   true,
		"config.nats.tls.enabled":              true,
		"config.merge.00$include":              "../jetflow-auth/server.conf",
		"tlsCA.enabled":                        true,
		"config.jetstream.memoryStore.enabled": false,
	}
	for key, w := range want {
		if got := lookup(v, key); got != w {
			p.add(where, "%s is %v, want %v", key, got, w)
		}
	}
	if tag, _ := lookup(v, "container.image.tag").(string); tag == "" {
		p.add(where, "container.image.tag is not set: pin the NATS server version jetflow is tested against")
	}
	for _, key := range []string{"config.cluster.tls.secretName", "config.nats.tls.secretName", "tlsCA.secretName"} {
		if s, _ := lookup(v, key).(string); !slices.Contains(secrets, s) {
			p.add(where, "%s %q is not a Secret secrets.sh creates", key, s)
		}
	}
	// The include's file comes from the Secret jetflow-nats-auth, mounted
	// where the include looks (relative to /etc/nats-config).
	if !bytes.Contains(b, []byte("secretName: jetflow-nats-auth")) || !bytes.Contains(b, []byte("mountPath: /etc/jetflow-auth")) {
		p.add(where, "the Secret jetflow-nats-auth is not mounted at /etc/jetflow-auth (the include's directory)")
	}
	return p
}

// NATSImageTag returns the NATS server image tag nats-values.yaml pins.
func NATSImageTag(path string) (string, error) {
	var v map[string]any
	if err := decodeYAMLFile(path, &v); err != nil {
		return "", err
	}
	tag, _ := lookup(v, "container.image.tag").(string)
	return tag, nil
}

func decodeYAMLFile(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return yaml.Unmarshal(b, v)
}

// lookup follows a dotted path through nested maps.
func lookup(v map[string]any, path string) any {
	var cur any = v
	for _, k := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[k]
	}
	return cur
}
