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
	tag, _ := NATSImageTag(filepath.Join(root, "k8s", "nats-values.yaml")) // CheckK8s says what is wrong with it
	if tag != "" {
		p = append(p, CheckNATSVersion(tag, filepath.Join(root, "..", "go.work"))...)
	}
	for _, s := range CheckCompose(ctx, filepath.Join(root, "compose"), tag) {
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
		return fmt.Errorf("%d problems in %s", len(p), root)
	}
	fmt.Fprintf(stdout, "%s: k8s and compose manifests valid\n", root)
	return nil
}
