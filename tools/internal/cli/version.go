package cli

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/spf13/cobra"

	"jetflow.dev/pkg/svc"
)

// stampedCommit is the commit make build stamps into the jetflow binary
// (-X): Go does not record it in binaries built in a workspace.
var stampedCommit string

// versionInfo is jetflow version -o json.
type versionInfo struct {
	// Version is svc.Version(): what make build stamped, else the
	// module's version and what Go recorded.
	Version string `json:"version"`
	// Commit is the commit built, "" when the build did not record it;
	// Modified says the checkout had changes.
	Commit   string `json:"commit"`
	Modified bool   `json:"modified,omitempty"`
	// CommitTime is the commit's time, when Go recorded it.
	CommitTime string `json:"commit_time,omitempty"`
	// GoVersion is the Go toolchain that built the binary.
	GoVersion string `json:"go_version"`
	// NATSServer is the nats-server release built in (what jetflow dev
	// runs), "" when Go recorded none.
	NATSServer string `json:"nats_server,omitempty"`
	// API is only there when the api was named (--api or JETFLOW_API).
	API *apiVersion `json:"api,omitempty"`
}

// apiVersion is what the api named answered to GET /healthz.
type apiVersion struct {
	URL     string `json:"url"`
	Version string `json:"version,omitempty"`
	// Error says why the api could not be asked (then Version is "").
	Error string `json:"error,omitempty"`
}

// natsServerModule is the module of the server jetflow dev embeds.
const natsServerModule = "github.com/nats-io/nats-server/v2"

// localVersion is this binary's build, read without any I/O.
func localVersion(bi *debug.BuildInfo, ok bool) versionInfo {
	v := versionInfo{Version: svc.Version(), Commit: stampedCommit, GoVersion: runtime.Version()}
	if !ok {
		return v
	}
	for _, d := range bi.Deps {
		if d.Path == natsServerModule {
			v.NATSServer = d.Version
			if d.Replace != nil {
				v.NATSServer = d.Replace.Version
			}
		}
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if v.Commit == "" {
				v.Commit = s.Value
			}
		case "vcs.time":
			v.CommitTime = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// versionAPIWait bounds how long jetflow version -o json waits for the
// api: the answer asked for is local.
const versionAPIWait = 2 * time.Second

// versionCmd prints the CLI's version and the api's, so that an operator
// sees which build each runs (docs/upgrades.md).
func (a *app) versionCmd() *cobra.Command {
	var o output
	cmd := &cobra.Command{
		Use:   "version [-o json]",
		Short: "Print this command line's version and the api's",
		Long: `Prints this command line's version and the api's (from its GET /healthz).
With -o json it prints its own build as JSON: version, commit, go_version,
nats_server (the server jetflow dev runs; commit_time and modified when Go
recorded them), and asks the api only
when one is named by --api or JETFLOW_API, for at most 2 s ("api":
{"url", "version"} or {"url", "error"}).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.json() {
				v := localVersion(debug.ReadBuildInfo())
				if a.apiURL != "" || a.getenv("JETFLOW_API") != "" {
					v.API = a.apiVersion(cmd.Context())
				}
				return printJSON(a.stdout, v)
			}
			fmt.Fprintln(a.stdout, "jetflow", svc.Version())
			h, err := a.client().Health(cmd.Context())
			if err != nil {
				fmt.Fprintf(a.stdout, "api     unknown (%v)\n", err)
				return nil // the CLI's own version is the answer asked for
			}
			fmt.Fprintf(a.stdout, "api     %s (%s)\n", h.Version, a.api())
			return nil
		},
	}
	o.add(cmd)
	cmd.Flags().Lookup("output").Usage = "output format: text, or json (this build's version, commit and Go version)"
	return cmd
}

// apiVersion asks the api its version, briefly: an api that does not
// answer is reported, not waited for.
func (a *app) apiVersion(ctx context.Context) *apiVersion {
	ctx, cancel := context.WithTimeout(ctx, versionAPIWait)
	defer cancel()
	v := &apiVersion{URL: a.api()}
	h, err := a.client().Health(ctx)
	if err != nil {
		v.Error = err.Error()
		return v
	}
	v.Version = h.Version
	return v
}
