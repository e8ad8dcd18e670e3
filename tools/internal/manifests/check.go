package manifests

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Check checks every deployment kind under root (deployments/) that this
// package knows, and the Dockerfile and the NATS image against the Go
// workspace beside root (../go.work), and returns what is wrong, nil if
// nothing.
func Check(ctx context.Context, root string) []string {
	var p []string
	for _, s := range CheckK8s(filepath.Join(root, "k8s")) {
		p = append(p, "k8s/"+s)
	}
	targets, err := composeBuildTargets(filepath.Join(root, "compose", "compose.yaml"))
	if err != nil {
		p = append(p, "compose/compose.yaml: "+err.Error())
	}
	p = append(p, CheckDockerfile(filepath.Join(root, "Dockerfile"), filepath.Join(root, "..", "go.work"), targets)...)
	// Each file's NATS image is checked against the release the tests
	// embed, so that a wrong one is blamed, not the other.
	tag, _ := NATSImageTag(filepath.Join(root, "k8s", "nats-values.yaml")) // CheckK8s says what is wrong with it
	var want natsWant
	if embedded, err := EmbeddedNATSVersion(filepath.Join(root, "..", "go.work")); err != nil {
		p = append(p, "go.work: "+err.Error())
		if tag != "" {
			want = natsWant{version: imageVersion(tag), because: "k8s/nats-values.yaml runs nats:" + tag}
		}
	} else {
		want = natsWant{version: embedded, because: "the tests embed nats-server " + embedded}
		if tag != "" {
			p = append(p, checkNATSVersion(tag, embedded)...)
		}
	}
	for _, s := range CheckCompose(ctx, filepath.Join(root, "compose"), want) {
		p = append(p, "compose/"+s)
	}
	return p
}

// Main is jetflow-manifests: it checks the deployments directory given
// (deployments by default) and fails if anything is wrong.
func Main(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) > 1 {
		return errors.New("usage: jetflow-manifests [DEPLOYMENTS_DIR]")
	}
	root := "deployments"
	if len(args) == 1 {
		root = args[0]
	}
	if _, err := os.Stat(filepath.Join(root, "k8s", "kustomization.yaml")); err != nil {
		return fmt.Errorf("%s is not the deployments directory: %w", root, err)
	}
	p := Check(ctx, root)
	for _, s := range p {
		fmt.Fprintln(stdout, s)
	}
	if len(p) > 0 {
		return fmt.Errorf("%d %s in %s", len(p), plural(len(p), "problem", "problems"), root)
	}
	fmt.Fprintf(stdout, "%s: k8s and compose manifests valid\n", root)
	return nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
