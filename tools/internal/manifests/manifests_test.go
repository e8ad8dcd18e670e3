package manifests

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const deployments = "../../../deployments"

// TestDeploymentsAreValid: the committed manifests pass every check.
func TestDeploymentsAreValid(t *testing.T) {
	t.Parallel()
	require.Empty(t, Check(context.Background(), deployments))
}

// copyDeployments copies the k8s and compose directories, the Dockerfile,
// the workspace's go.work and its modules' go.mod files into a temporary
// directory, to break them there, and returns the copy's deployments
// directory.
func copyDeployments(t *testing.T) string {
	t.Helper()
	base := t.TempDir()
	root := filepath.Join(base, "deployments")
	for _, d := range []string{"k8s", "compose"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
		entries, err := os.ReadDir(filepath.Join(deployments, d))
		require.NoError(t, err)
		for _, e := range entries {
			if !e.IsDir() { // not the secrets setup.sh makes
				copyFile(t, filepath.Join(deployments, d, e.Name()), filepath.Join(root, d, e.Name()))
			}
		}
	}
	copyFile(t, filepath.Join(deployments, "Dockerfile"), filepath.Join(root, "Dockerfile"))
	copyFile(t, filepath.Join(deployments, "..", "go.work"), filepath.Join(base, "go.work"))
	modules, err := WorkspaceModules(filepath.Join(base, "go.work"))
	require.NoError(t, err)
	require.NotEmpty(t, modules)
	for _, m := range modules {
		require.NoError(t, os.MkdirAll(filepath.Join(base, m), 0o755))
		copyFile(t, filepath.Join(deployments, "..", m, "go.mod"), filepath.Join(base, m, "go.mod"))
	}
	return root
}

// changedCopy copies the deployments (copyDeployments) and replaces old,
// which must be in file (relative to the copy's deployments directory)
// once, with new there; it returns the copy's deployments directory.
func changedCopy(t *testing.T, file, old, new string) string {
	t.Helper()
	root := copyDeployments(t)
	path := filepath.Join(root, file)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, 1, strings.Count(string(b), old), "the text to change is in %s once", file)
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(b), old, new, 1)), 0o644))
	return root
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(to, b, 0o644))
}

// TestBrokenManifestsAreFound: each mistake, made in a copy of the
// manifests, is reported, naming what is wrong.
func TestBrokenManifestsAreFound(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, file, old, new, want string
	}{
		{"UnknownFieldInDeployment", "k8s/api.yaml", "  replicas: 2\n", "  replicas: 2\n  replica: 2\n", `unknown field "replica"`},
		{"ProbeOnAMissingPort", "k8s/dispatcher.yaml", "              port: health\n            periodSeconds: 5", "              port: healthz\n            periodSeconds: 5", "readinessProbe: port healthz is no container port"},
		{"ProbeOnAnotherPortThanTheService", "k8s/janitor.yaml", `value: "0.0.0.0:9480"`, `value: "0.0.0.0:9481"`, "but JETFLOW_HEALTH_ADDR listens on 9481"},
		{"HealthOnLoopback", "k8s/agent.yaml", `value: "0.0.0.0:9480"`, `value: "127.0.0.1:9480"`, "not its loopback"},
		{"NoLivenessProbe", "k8s/agent.yaml", "          livenessProbe:\n", "          startupProbe:\n", "no livenessProbe"},
		{"PDBSelectsNothing", "k8s/agent.yaml", "  minAvailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: jetflow-agent", "  minAvailable: 1\n  selector:\n    matchLabels:\n      app.kubernetes.io/name: jetflow-agents", "PodDisruptionBudget jetflow-agent: selects the pods of 0 Deployments"},
		{"SecretNotCreated", "k8s/janitor.yaml", "secretName: jetflow-creds-janitor", "secretName: jetflow-creds-janitr", `Secret "jetflow-creds-janitr" is not one secrets.sh creates`},
		{"SharedCreds", "k8s/janitor.yaml", "secretName: jetflow-creds-janitor", "secretName: jetflow-creds-agent", "its creds come from jetflow-creds-agent"},
		{"NoMemoryLimit", "k8s/api.yaml", "            limits:\n              memory: 512Mi\n", "", "no memory limit"},
		{"CPULimit", "k8s/api.yaml", "              memory: 512Mi\n", "              memory: 512Mi\n              cpu: 500m\n", "a CPU limit throttles"},
		{"ServiceTargetPort", "k8s/api.yaml", "      targetPort: http", "      targetPort: web", "targetPort web is no container port"},
		{"TwoNATSServers", "k8s/config.yaml", ",tls://nats-2.nats-headless:4222", "", "lists 2 servers"},
		{"FileNotInKustomization", "k8s/kustomization.yaml", "  - janitor.yaml\n", "", "janitor.yaml: not listed"},
		{"CommittedSecret", "k8s/config.yaml", "apiVersion: v1\nkind: ConfigMap", "apiVersion: v1\nkind: Secret\nmetadata:\n  name: leaked\nstringData:\n  a: b\n---\napiVersion: v1\nkind: ConfigMap", "secret material is not committed"},
		{"NATSReplicas", "k8s/nats-values.yaml", "    replicas: 3", "    replicas: 1", "config.cluster.replicas is 1, want 3"},
		{"ComposeUnknownKey", "compose/compose.yaml", "  janitor:\n    <<: *jetflow\n", "  janitor:\n    <<: *jetflow\n    helthcheck: {}\n", "helthcheck"},
		{"ComposeNoHealthcheck", "compose/compose.yaml", "    healthcheck:\n      test: [\"CMD\", \"/usr/local/bin/jetflow\", \"probe\", \"http://127.0.0.1:9480/readyz\"]\n      interval: 5s\n      timeout: 3s\n      retries: 3\n      start_period: 30s\n\nvolumes:", "\nvolumes:", "service janitor: no health check"},
		{"ComposeWrongCreds", "compose/compose.yaml", "./secrets/auth/default/dispatcher.creds", "./secrets/auth/default/agent.creds", "service dispatcher: connects with"},
		{"ComposeSecretCreatesHostPath", "compose/compose.yaml", "source: ./secrets/auth/default/janitor.creds, target: /run/jetflow/nats.creds, read_only: true, bind: {create_host_path: false}}", "source: ./secrets/auth/default/janitor.creds, target: /run/jetflow/nats.creds, read_only: true}", "janitor.creds: bind it with create_host_path: false"},
		{"ComposeRunsAnotherServer", "compose/compose.yaml", "image: nats:2.15.3-alpine", "image: nats:2.14.2-alpine", "compose/compose.yaml: service n1: image nats:2.14.2-alpine, but the tests embed nats-server v2.15.3: run that release (nats:2.15.3-alpine)"},
		{"ComposeRunsAnotherImage", "compose/compose.yaml", "image: nats:2.15.3-alpine", "image: synadia/nats-server:2.15.3", "image synadia/nats-server:2.15.3, but the tests embed nats-server v2.15.3"},
		{"NATSImageNotTheTestedServer", "k8s/nats-values.yaml", "tag: 2.15.3-alpine", "tag: 2.15.2-alpine", "k8s/nats-values.yaml: runs nats:2.15.2-alpine, but the tests embed nats-server v2.15.3: run the release they test (nats:2.15.3-alpine)"},
		{"TestsEmbedAnotherServer", "../pkg/go.mod", "github.com/nats-io/nats-server/v2 v2.15.3", "github.com/nats-io/nats-server/v2 v2.16.0", "runs nats:2.15.3-alpine, but the tests embed nats-server v2.16.0"},
		// The highest of every module's requirements, indirect ones too,
		// in a module after the first: what the go command selects.
		{"ALaterModuleRequiresMore", "../services/janitor/go.mod", "github.com/nats-io/nats-server/v2 v2.15.3 // indirect", "github.com/nats-io/nats-server/v2 v2.16.0 // indirect", "runs nats:2.15.3-alpine, but the tests embed nats-server v2.16.0"},
		{"APreRelease", "k8s/nats-values.yaml", "tag: 2.15.3-alpine", "tag: 2.15.3-rc.1-alpine", "runs nats:2.15.3-rc.1-alpine, but the tests embed nats-server v2.15.3"},
		{"ReplacedByARelease", "../go.work", "use (", "replace github.com/nats-io/nats-server/v2 => github.com/nats-io/nats-server/v2 v2.15.2\n\nuse (", "runs nats:2.15.3-alpine, but the tests embed nats-server v2.15.2"},
		{"ReplacedByADirectory", "../go.work", "use (", "replace github.com/nats-io/nats-server/v2 => ../nats-server\n\nuse (", "go.work: github.com/nats-io/nats-server/v2 is replaced by the directory ../nats-server: the release the tests embed is not known"},
		{"DockerfileMissesAModule", "../go.work", "\t./tools\n", "\t./tools\n\t./services/scheduler\n", "module services/scheduler of go.work: its go.mod and go.sum are not copied"},
		{"DockerfileMissesAService", "Dockerfile", "for s in api dispatcher agent janitor; do", "for s in api dispatcher agent; do", "does not build jetflow-janitor"},
		{"DockerfileMissesAStage", "Dockerfile", "AS agent", "AS agents", `no stage "agent"`},
		{"ComposeNodeMissingFromURL", "compose/jetflow.env", ",tls://n3:4222", "", "does not list node n3"},
		{"ComposeNoBootstrapWait", "compose/compose.yaml", "  depends_on:\n    bootstrap:\n      condition: service_completed_successfully", "  depends_on:\n    bootstrap:\n      condition: service_started", "does not wait for the bootstrap"},
		{"ComposeAPIPublishesAPort", "compose/compose.yaml", "  api-2:\n    <<: *jetflow\n", "  api-2:\n    <<: *jetflow\n    ports:\n      - \"127.0.0.1:8081:8080\"\n", "service api-2: publishes a port: the apis are reached through the balancer only"},
		{"ComposePortOnEveryInterface", "compose/compose.yaml", "\"127.0.0.1:8080:8080\"", "\"8080:8080\"", "service balancer: publishes port 8080 on \"\": publish on the host's loopback only"},
		{"ComposeNoBalancer", "compose/compose.yaml", "  balancer:\n", "  proxy:\n", "no service balancer in front of the 2 apis"},
		{"ComposeBalancerUnpinned", "compose/compose.yaml", "image: caddy:2.11.4-alpine", "image: caddy:2-alpine", "want the official caddy image pinned to a release"},
		{"ComposeBalancerMissesAnAPI", "compose/Caddyfile", "reverse_proxy api-1:8080 api-2:8080 {", "reverse_proxy api-1:8080 {", "reverse_proxy to api-1:8080, want every api: api-1:8080 api-2:8080"},
		{"ComposeBalancerChecksLiveness", "compose/Caddyfile", "health_uri /readyz", "health_uri /healthz", "health_uri \"/healthz\", want /readyz"},
		{"ComposeBalancerNoPassiveCheck", "compose/Caddyfile", "fail_duration 10s", "", "no fail_duration"},
		{"ComposeWorkflowsReachOneAPI", "compose/jetflow.env", "JETFLOW_API_URL=http://balancer:8080", "JETFLOW_API_URL=http://api-1:8080", "JETFLOW_API_URL \"http://api-1:8080\": name the balancer"},
		{"ComposeOneDispatcher", "compose/compose.yaml", "    command: [\"/usr/local/bin/jetflow-dispatcher\"]\n    deploy:\n      replicas: 2", "    command: [\"/usr/local/bin/jetflow-dispatcher\"]\n    deploy:\n      replicas: 1", "1 dispatcher processes, want at least 2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			root := changedCopy(t, c.file, c.old, c.new)
			p := Check(context.Background(), root)
			require.NotEmpty(t, p, "the broken manifest passed")
			require.Contains(t, strings.Join(p, "\n"), c.want)
		})
	}
}

// TestTheWrongNATSImageIsBlamed: an image off the release the tests embed
// is reported where it is, and the file that is right is not blamed for
// differing from it.
func TestTheWrongNATSImageIsBlamed(t *testing.T) {
	t.Parallel()
	root := changedCopy(t, "k8s/nats-values.yaml", "tag: 2.15.3-alpine", "tag: 2.15.2-alpine")
	p := Check(context.Background(), root)
	require.Len(t, p, 1, "only the Kubernetes values: %q", p)
	require.True(t, strings.HasPrefix(p[0], "k8s/nats-values.yaml: "), p[0])
}

// TestNATSImageWithoutTheWorkspace: a workspace that cannot be read is
// reported, and the compose file is still held to the Kubernetes values.
func TestNATSImageWithoutTheWorkspace(t *testing.T) {
	t.Parallel()
	root := changedCopy(t, "compose/compose.yaml", "image: nats:2.15.3-alpine", "image: nats:2.14.2-alpine")
	require.NoError(t, os.Remove(filepath.Join(root, "..", "pkg", "go.mod")))
	got := strings.Join(Check(context.Background(), root), "\n")
	require.Contains(t, got, "go.work: ")
	require.Contains(t, got, "pkg/go.mod")
	require.Contains(t, got, "image nats:2.14.2-alpine, but k8s/nats-values.yaml runs nats:2.15.3-alpine")
}

// TestNATSImagesOfOtherVariants: the image's variant (alpine, a version of
// it, scratch) is not part of the release, a module requiring less than
// the others does not lower it, and a replacement of the version the
// modules require, by a release, is the release embedded.
func TestNATSImagesOfOtherVariants(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ file, old, new string }{
		{"k8s/nats-values.yaml", "tag: 2.15.3-alpine", "tag: 2.15.3-alpine3.22"},
		{"../pkg/go.mod", "github.com/nats-io/nats-server/v2 v2.15.3", "github.com/nats-io/nats-server/v2 v2.15.2"},
		{"../go.work", "use (", "replace github.com/nats-io/nats-server/v2 v2.15.3 => github.com/nats-io/nats-server/v2 v2.15.3\n\nuse ("},
		{"../go.work", "use (", "replace github.com/nats-io/nats-server/v2 v2.14.0 => ../nats-server\n\nuse ("}, // not the version required
	} {
		root := changedCopy(t, c.file, c.old, c.new)
		require.Empty(t, Check(context.Background(), root), "%s: %s", c.file, c.new)
	}
}

// TestImageVersion: the release of an image or its tag.
func TestImageVersion(t *testing.T) {
	t.Parallel()
	for image, want := range map[string]string{
		"nats:2.15.3-alpine":      "v2.15.3",
		"2.15.3-alpine":           "v2.15.3",
		"nats:2.15.3":             "v2.15.3",
		"nats:2.15.3-alpine3.22":  "v2.15.3",
		"nats:2.15.3-scratch":     "v2.15.3",
		"nats:2.15.3-rc.1-alpine": "v2.15.3-rc.1",
		"nats:latest":             "vlatest",
		"nats:":                   "v",
		"registry.example:5000/nats:2.15.3-alpine": "v2.15.3",
	} {
		require.Equal(t, want, imageVersion(image), image)
	}
}
