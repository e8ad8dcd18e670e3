package manifests

import (
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

const natsServerModule = "github.com/nats-io/nats-server/v2"

// CheckNATSVersion checks that the NATS image the deployments run (tag,
// k8s/nats-values.yaml's, e.g. 2.15.3-alpine) is the nats-server release
// the workspace (workFile, go.work) embeds for make dev and make test: the
// highest its modules require, as the go command selects it. What the
// tests prove about the server is then what production runs.
func CheckNATSVersion(tag, workFile string) []string {
	var p problems
	const where = "k8s/nats-values.yaml"
	modules, err := WorkspaceModules(workFile)
	if err != nil {
		p.add(where, "%v", err)
		return p
	}
	embedded := ""
	for _, m := range modules {
		file := filepath.Join(filepath.Dir(workFile), m, "go.mod")
		b, err := os.ReadFile(file)
		if err != nil {
			p.add(where, "%v", err)
			return p
		}
		mod, err := modfile.ParseLax(file, b, nil)
		if err != nil {
			p.add(where, "%v", err)
			return p
		}
		for _, r := range mod.Require {
			if r.Mod.Path == natsServerModule && (embedded == "" || semver.Compare(r.Mod.Version, embedded) > 0) {
				embedded = r.Mod.Version
			}
		}
	}
	if embedded == "" {
		p.add(where, "no module of %s requires %s: which server do the tests embed?", filepath.Base(workFile), natsServerModule)
		return p
	}
	version, _, _ := strings.Cut(tag, "-")
	if "v"+version != embedded {
		p.add(where, "runs nats:%s, but the tests embed nats-server %s: run the release they test (nats:%s-alpine)", tag, embedded, strings.TrimPrefix(embedded, "v"))
	}
	return p
}

// WorkspaceModules lists the directories of the modules go.work (workFile)
// uses, relative to its own directory.
func WorkspaceModules(workFile string) ([]string, error) {
	b, err := os.ReadFile(workFile)
	if err != nil {
		return nil, err
	}
	work, err := modfile.ParseWork(workFile, b, nil)
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, u := range work.Use {
		dirs = append(dirs, filepath.FromSlash(u.Path))
	}
	return dirs, nil
}
