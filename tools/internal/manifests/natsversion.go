package manifests

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/semver"
)

const natsServerModule = "github.com/nats-io/nats-server/v2"

// natsWant is the NATS server release the deployments must run, and why:
// the release the tests embed, or, when the workspace cannot be read, the
// one the Kubernetes values pin.
type natsWant struct {
	version string // v2.15.3
	because string // the tests embed nats-server v2.15.3
}

// variantTag is a NATS image tag: a release, and the variant of the
// official image it is built on (alpine, alpine3.22, scratch, ...), if
// any. A pre-release (2.15.3-rc.1) is part of the release.
var variantTag = regexp.MustCompile(`^(.+?)(-(alpine|scratch|linux|nanoserver|windowsservercore)[0-9A-Za-z.-]*)?$`)

// imageVersion is the release of a NATS image or image tag: v2.15.3 for
// nats:2.15.3-alpine or 2.15.3-alpine, v2.15.3-rc.1 for 2.15.3-rc.1-alpine.
func imageVersion(image string) string {
	tag := image
	if i := strings.LastIndexByte(image, ':'); i >= 0 {
		tag = image[i+1:]
	}
	m := variantTag.FindStringSubmatch(tag)
	if m == nil { // no tag at all (nats:): no release
		return "v"
	}
	return "v" + m[1]
}

// EmbeddedNATSVersion is the nats-server release the workspace (workFile,
// go.work) embeds for make dev and make test: the highest its modules
// require, as the go command selects it, or the version a replace
// directive gives instead. A replacement by a directory has no release:
// an error.
func EmbeddedNATSVersion(workFile string) (string, error) {
	work, err := readWork(workFile)
	if err != nil {
		return "", err
	}
	embedded := ""
	var replaces []*modfile.Replace
	replaces = append(replaces, work.Replace...)
	for _, u := range work.Use {
		file := filepath.Join(filepath.Dir(workFile), filepath.FromSlash(u.Path), "go.mod")
		b, err := os.ReadFile(file)
		if err != nil {
			return "", err
		}
		mod, err := modfile.ParseLax(file, b, nil)
		if err != nil {
			return "", err
		}
		for _, r := range mod.Require {
			if r.Mod.Path == natsServerModule && (embedded == "" || semver.Compare(r.Mod.Version, embedded) > 0) {
				embedded = r.Mod.Version
			}
		}
		replaces = append(replaces, mod.Replace...)
	}
	if embedded == "" {
		return "", fmt.Errorf("no module of %s requires %s: which server do the tests embed?", filepath.Base(workFile), natsServerModule)
	}
	for _, r := range replaces {
		if r.Old.Path != natsServerModule || (r.Old.Version != "" && r.Old.Version != embedded) {
			continue
		}
		if r.New.Version == "" {
			return "", fmt.Errorf("%s is replaced by the directory %s: the release the tests embed is not known", natsServerModule, r.New.Path)
		}
		return r.New.Version, nil
	}
	return embedded, nil
}

// checkNATSVersion checks that the NATS image the Kubernetes values pin
// (tag, e.g. 2.15.3-alpine) is the release the tests embed (embedded),
// so that what the tests prove about the server is what production runs.
func checkNATSVersion(tag, embedded string) []string {
	var p problems
	if imageVersion(tag) != embedded {
		p.add("k8s/nats-values.yaml", "runs nats:%s, but the tests embed nats-server %s: run the release they test (nats:%s-alpine)", tag, embedded, strings.TrimPrefix(embedded, "v"))
	}
	return p
}

// WorkspaceModules lists the directories of the modules go.work (workFile)
// uses, relative to its own directory (the tests copy their go.mod files
// to check a copy of the deployments).
func WorkspaceModules(workFile string) ([]string, error) {
	work, err := readWork(workFile)
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, u := range work.Use {
		dirs = append(dirs, filepath.FromSlash(u.Path))
	}
	return dirs, nil
}

func readWork(workFile string) (*modfile.WorkFile, error) {
	b, err := os.ReadFile(workFile)
	if err != nil {
		return nil, err
	}
	return modfile.ParseWork(workFile, b, nil)
}
