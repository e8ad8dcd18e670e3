package events_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// pure are the packages that must not depend on NATS: the event vocabulary,
// what is computed from events alone, and the dispatcher's interpreter
// (which decides from them; docs/adr/0004). The NATS codec, subjects and
// buckets are package bus's for that reason.
var pure = []string{
	"jetflow.dev/services/dispatcher/interp",
	"jetflow.dev/pkg/events",
	"jetflow.dev/pkg/events/eventstest",
	"jetflow.dev/pkg/projections",
	"jetflow.dev/pkg/workflow",
	"jetflow.dev/pkg/expression",
	"jetflow.dev/pkg/redact",
	"jetflow.dev/pkg/retention",
}

// TestPurePackagesStayFreeOfNATS lists the dependency graph of jetflow.dev/pkg
// with the go tool and fails if a pure package reaches NATS (nats.go, the
// server, the CloudEvents NATS binding) or a logger, or if any package of
// pkg/ reaches zerolog (pkg/* never logs). It names the import chain.
func TestPurePackagesStayFreeOfNATS(t *testing.T) {
	t.Parallel()

	goTool := findGo(t)
	cmd := exec.Command(goTool, "list", "-deps", "-json=ImportPath,Imports", "jetflow.dev/pkg/...", "jetflow.dev/services/dispatcher/interp")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list: %s", stderr.String())

	imports := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath string
			Imports    []string
		}
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		imports[p.ImportPath] = p.Imports
	}
	for _, p := range pure {
		require.Contains(t, imports, p, "go list did not list %s: is it still a package?", p)
		if chain := pathTo(imports, p, "nats-io", "nats_jetstream", "zerolog"); chain != nil {
			t.Errorf("%s must not depend on NATS or a logger, but imports %s", p, strings.Join(chain, " -> "))
		}
	}
	for p := range imports {
		if !strings.HasPrefix(p, "jetflow.dev/pkg/") {
			continue
		}
		if chain := pathTo(imports, p, "zerolog"); chain != nil {
			t.Errorf("%s must not log (pkg/* never imports zerolog), but imports %s", p, strings.Join(chain, " -> "))
		}
	}
}

// pathTo returns the import chain from root to the first package whose
// path contains one of bad (breadth first: a shortest chain), or nil.
func pathTo(imports map[string][]string, root string, bad ...string) []string {
	from := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if slices.ContainsFunc(bad, func(b string) bool { return strings.Contains(p, b) }) {
			var chain []string
			for q := p; q != ""; q = from[q] {
				chain = append(chain, q)
			}
			slices.Reverse(chain)
			return chain
		}
		for _, q := range imports[p] {
			if _, seen := from[q]; !seen {
				from[q] = p
				queue = append(queue, q)
			}
		}
	}
	return nil
}

// findGo returns the go tool: go test puts its own toolchain's first on
// PATH. It skips the test if there is none (a test binary run on its own,
// without a Go installation).
func findGo(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go tool on PATH, so the dependency graph cannot be listed: %v", err)
	}
	return p
}

func TestPathTo(t *testing.T) {
	t.Parallel()

	g := map[string][]string{"a": {"b", "c"}, "b": {"d"}, "c": {"x/nats-io/y"}, "d": {"x/nats-io/y"}}
	require.Equal(t, []string{"a", "c", "x/nats-io/y"}, pathTo(g, "a", "nats-io"))
	require.Nil(t, pathTo(g, "b", "zerolog"))
	require.Equal(t, []string{"b", "d", "x/nats-io/y"}, pathTo(g, "b", "zerolog", "nats-io"))
}
