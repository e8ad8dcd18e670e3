package manifests

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"golang.org/x/mod/modfile"
)

var (
	fromLine = regexp.MustCompile(`(?mi)^FROM\s+\S+\s+AS\s+(\S+)\s*$`)
	copyMod  = regexp.MustCompile(`(?m)^COPY\s+(\S+)/go\.mod\s+(\S+)/go\.sum\s+(\S+)/\s*$`)
	// the service loop of the build stage: for s in api dispatcher ...; do
	serviceLoop = regexp.MustCompile(`for s in ([a-z ]+); do`)
)

// CheckDockerfile checks the Dockerfile against the Go workspace (workFile,
// go.work): its modules layer copies every module's go.mod and go.sum (go
// mod download fails on a module of go.work it cannot find), it builds
// every service, and it has the stages named in stages (those the compose
// file builds).
func CheckDockerfile(dockerfile, workFile string, stages []string) []string {
	var p problems
	const where = "Dockerfile"
	b, err := os.ReadFile(dockerfile)
	if err != nil {
		p.add(where, "%v", err)
		return p
	}
	w, err := os.ReadFile(workFile)
	if err != nil {
		p.add(where, "%v", err)
		return p
	}
	work, err := modfile.ParseWork(workFile, w, nil)
	if err != nil {
		p.add(where, "%v", err)
		return p
	}
	text := string(b)
	copied := map[string]bool{}
	for _, m := range copyMod.FindAllStringSubmatch(text, -1) {
		if m[1] != m[2] || m[1] != m[3] {
			p.add(where, "COPY %s/go.mod %s/go.sum %s/: one directory", m[1], m[2], m[3])
		}
		copied[m[1]] = true
	}
	for _, u := range work.Use {
		dir := path.Clean(filepath.ToSlash(u.Path))
		if !copied[dir] {
			p.add(where, "module %s of go.work: its go.mod and go.sum are not copied before go mod download", dir)
		}
	}
	var built []string
	if m := serviceLoop.FindStringSubmatch(text); m != nil {
		built = strings.Fields(m[1])
	}
	for _, s := range services {
		if !slices.Contains(built, s) {
			p.add(where, "does not build jetflow-%s (the loop: for s in %s; do)", s, strings.Join(services, " "))
		}
	}
	if !strings.Contains(text, "./tools/cmd/jetflow") {
		p.add(where, "does not build the jetflow CLI (the bootstrap and the probes run it)")
	}
	if !strings.Contains(text, "jetflow.dev/pkg/svc.stamped=${VERSION}") {
		p.add(where, "does not stamp VERSION as make build does (-X jetflow.dev/pkg/svc.stamped)")
	}
	var have []string
	for _, m := range fromLine.FindAllStringSubmatch(text, -1) {
		have = append(have, m[1])
	}
	for _, s := range stages {
		if !slices.Contains(have, s) {
			p.add(where, "no stage %q (compose.yaml builds it; stages: %s)", s, strings.Join(have, ", "))
		}
	}
	return p
}

// composeBuildTargets returns the Dockerfile stages compose.yaml builds.
func composeBuildTargets(compose string) ([]string, error) {
	b, err := os.ReadFile(compose)
	if err != nil {
		return nil, err
	}
	var targets []string
	for _, m := range regexp.MustCompile(`(?m)^\s+target:\s+(\S+)\s*$`).FindAllStringSubmatch(string(b), -1) {
		if !slices.Contains(targets, m[1]) {
			targets = append(targets, m[1])
		}
	}
	if len(targets) == 0 {
		return nil, fmt.Errorf("%s builds no Dockerfile target", compose)
	}
	return targets, nil
}
