// Package cli implements the jetflow command line with cobra.
package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/tools/internal/backup"
	"jetflow.dev/tools/internal/devstack"
)

// Exit statuses, for scripts (docs/cli.md).
const (
	// ExitOK: the command did what it was asked.
	ExitOK = 0
	// ExitFailed: under --watch or --follow, the execution failed, was
	// cancelled or is suspended; otherwise any error not listed below.
	ExitFailed = 1
	// ExitUsage: the command line, or the input it names or sent, is wrong
	// and must be fixed (unknown flag, missing argument, an api answer
	// 400, 413 or 422, a directory that is no jetflow backup or, for a
	// backup, one in use, an invalid definition for jetflow dev --apply).
	ExitUsage = 2
	// ExitNotFound: the execution, workflow or lock does not exist (404),
	// or no longer does (410: expired under its retention rule).
	ExitNotFound = 3
	// ExitConflict: the request conflicts with what exists (409: an
	// execution id already used, an action the execution's status
	// refuses; a restore refused because of what the server holds, or a
	// backup this jetflow cannot read; a data directory in use).
	ExitConflict = 4
	// ExitUnreachable: the api could not be reached, or NATS for the
	// commands that talk to it (admin, bootstrap).
	ExitUnreachable = 5
	// ExitDenied: the api refused the caller: not authenticated (401: no
	// token, or an unknown, expired or revoked one) or not allowed (403:
	// the token lacks the scope or the namespace); or NATS refused a
	// jetflow admin command's identity the JetStream API.
	ExitDenied = 6
)

// exitError carries a process exit code without printing anything more.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// usageError is a mistake on the command line: exit status 2.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// usagef returns a usageError with a formatted message.
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// Main runs the CLI and returns the process exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	fmt.Fprintln(stderr, "jetflow:", err)
	if errors.Is(err, backup.ErrRefused) || errors.Is(err, backup.ErrNotBackup) {
		fmt.Fprintln(stderr, "jetflow: nothing was changed") // both refuse before the first change
	}
	// The api was looked for beside jetflow dev's data, not named: say
	// what was found there. Named (--api, JETFLOW_API), it was the caller's.
	if errors.Is(err, client.ErrUnreachable) && !root.PersistentFlags().Changed("api") && os.Getenv("JETFLOW_API") == "" {
		data := os.Getenv("JETFLOW_DATA")
		fmt.Fprintln(stderr, "jetflow:", devHint(cmp.Or(data, ".jetflow"), data != ""))
	}
	var apiErr *client.Error
	if errors.As(err, &apiErr) && apiErr.Status == http.StatusUnauthorized {
		if strings.HasPrefix(apiErr.Message, "this needs a token") { // none was sent
			fmt.Fprintln(stderr, "jetflow: give a token with --token, JETFLOW_TOKEN or "+configTokenHint+
				" (beside jetflow dev the CLI uses its admin token by itself: with its data elsewhere, set JETFLOW_DATA=DIR)")
		} else {
			fmt.Fprintln(stderr, "jetflow: the api refused the token given (--token, JETFLOW_TOKEN or "+configTokenHint+
				"): give a valid one, or none beside jetflow dev")
		}
	}
	return exitCode(err)
}

// devHint says why no api answered where the CLI looked for the one of
// the jetflow dev on data directory dir (named: by JETFLOW_DATA).
func devHint(dir string, named bool) string {
	if c, err := devstack.ReadConn(dir); err == nil && c.API != "" {
		return fmt.Sprintf("the jetflow dev of %s (process %d) does not answer at %s: it is stopping, or it died (start it again: jetflow dev, or make dev in a checkout)", dir, c.PID, c.API)
	}
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		return fmt.Sprintf("no jetflow dev is running on the data directory %s (jetflow dev, or make dev in a checkout, starts one)", dir)
	}
	if named {
		return fmt.Sprintf("JETFLOW_DATA=%s: no such data directory; name the one jetflow dev runs on", dir)
	}
	return "a jetflow dev with its data elsewhere: JETFLOW_DATA=DIR, or run the eval line it printed"
}

// exitCode maps an error to the exit status scripts can act on.
func exitCode(err error) int {
	var apiErr *client.Error
	var ue usageError
	switch {
	case errors.As(err, &ue) || isCobraUsage(err):
		return ExitUsage
	case errors.Is(err, backup.ErrNotBackup), errors.Is(err, backup.ErrDirInUse): // jetflow admin restore and jetflow dev --restore alike
		return ExitUsage
	case errors.Is(err, workflow.ErrInvalid): // jetflow dev --apply, as the api's 422 for workflow apply
		return ExitUsage
	case errors.Is(err, backup.ErrRefused), errors.Is(err, devstack.ErrDataDirInUse), errors.Is(err, errAddressInUse):
		return ExitConflict
	case errors.Is(err, client.ErrUnreachable), errors.Is(err, nats.ErrNoServers):
		return ExitUnreachable
	case errors.Is(err, ErrNotAdmin):
		return ExitDenied
	case errors.As(err, &apiErr):
		switch apiErr.Status {
		case http.StatusNotFound, http.StatusGone:
			return ExitNotFound
		case http.StatusConflict:
			return ExitConflict
		case http.StatusUnauthorized, http.StatusForbidden:
			return ExitDenied
		case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnprocessableEntity:
			return ExitUsage
		}
	}
	return ExitFailed
}

// isCobraUsage recognises cobra's own usage errors, which have no type.
func isCobraUsage(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "unknown command ") || strings.HasPrefix(msg, "unknown flag") ||
		strings.HasPrefix(msg, "unknown shorthand flag") || strings.Contains(msg, "flag needs an argument") ||
		strings.HasPrefix(msg, "invalid argument ")
}

type app struct {
	apiURL    string
	tokenFlag string
	namespace string
	stdout    io.Writer
	stderr    io.Writer
	getenv    func(string) string
}

func (a *app) client() *client.Client {
	return client.New(a.api(), client.WithToken(a.token()), client.WithNamespace(cmp.Or(a.namespace, a.getenv("JETFLOW_NAMESPACE"))))
}

// configTokenHint is where the token file is, as the help says it.
const configTokenHint = "$XDG_CONFIG_HOME/jetflow/token (~/.config/jetflow/token)"

// token is the bearer token for the api: --token, else JETFLOW_TOKEN,
// else the admin token of the jetflow dev whose api this is (its
// connection file names it), else the first line of the config file
// $XDG_CONFIG_HOME/jetflow/token (~/.config/jetflow/token); "" if none.
// The config file's token is for the api the user names: never sent to
// an api found in a connection file (the dev's own token, or none).
func (a *app) token() string {
	if a.tokenFlag != "" {
		return a.tokenFlag
	}
	if v := a.getenv("JETFLOW_TOKEN"); v != "" {
		return v
	}
	c, err := devstack.ReadConn(a.dataDir())
	dev := err == nil && c.API != "" && c.API == a.api()
	if dev && c.TokenFile != "" {
		if t, err := devstack.ReadToken(c.TokenFile); err == nil {
			return t
		}
	}
	if dev && a.apiURL == "" && a.getenv("JETFLOW_API") == "" {
		return ""
	}
	if t, err := devstack.ReadToken(a.configTokenFile()); err == nil {
		return t
	}
	return ""
}

// configTokenFile is the token file in the user's configuration directory.
func (a *app) configTokenFile() string {
	dir := a.getenv("XDG_CONFIG_HOME")
	if dir == "" {
		home := a.getenv("HOME")
		if home == "" {
			return ""
		}
		dir = filepath.Join(home, ".config")
	}
	return filepath.Join(dir, "jetflow", "token")
}

// defaultAPI is where the api is when nothing says otherwise.
const defaultAPI = "http://127.0.0.1:8080"

// api is the api's base URL: --api, else JETFLOW_API, else that of the
// jetflow dev running on the data directory (JETFLOW_DATA, else .jetflow),
// else the default.
func (a *app) api() string {
	if a.apiURL != "" {
		return a.apiURL
	}
	if v := a.getenv("JETFLOW_API"); v != "" {
		return v
	}
	if c, err := devstack.ReadConn(a.dataDir()); err == nil && c.API != "" {
		return c.API
	}
	return defaultAPI
}

// dataDir is the data directory of the local jetflow dev.
func (a *app) dataDir() string { return cmp.Or(a.getenv("JETFLOW_DATA"), ".jetflow") }

// flagError says what a flag given a value it cannot take wants, instead
// of the parser's words (strconv.ParseInt: parsing "abc": invalid
// syntax), with a long value cut.
func flagError(err error) error {
	var ive *pflag.InvalidValueError
	if !errors.As(err, &ive) {
		return err
	}
	want := map[string]string{
		"int":      "a whole number",
		"uint64":   "a whole number from 0",
		"duration": "a duration such as 30s, 5m or 1h30m",
		"bool":     "true or false",
	}[ive.GetFlag().Value.Type()]
	if want == "" {
		return err
	}
	v := strconv.Quote(ive.GetValue())
	if r := []rune(ive.GetValue()); len(r) > 40 {
		v = fmt.Sprintf("%q... (%d characters)", string(r[:32]), len(r))
	}
	if errors.Is(err, strconv.ErrRange) {
		return fmt.Errorf("--%s %s: out of range; give %s", ive.GetFlag().Name, v, want)
	}
	return fmt.Errorf("--%s %s: give %s", ive.GetFlag().Name, v, want)
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	a := &app{stdout: stdout, stderr: stderr, getenv: os.Getenv}
	root := &cobra.Command{
		Use:           "jetflow",
		Short:         "Durable workflows, event-sourced over NATS JetStream",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{flagError(err)} })
	root.PersistentFlags().StringVar(&a.apiURL, "api", "",
		"jetflow api base URL (default: $JETFLOW_API, else the api of the jetflow dev running on $JETFLOW_DATA or .jetflow, else "+defaultAPI+")")
	root.PersistentFlags().StringVar(&a.tokenFlag, "token", "",
		"api token (default: $JETFLOW_TOKEN, else the admin token of the jetflow dev whose api it is, else the first line of "+configTokenHint+")")
	root.PersistentFlags().StringVar(&a.namespace, "namespace", "", "namespace of the request (default: $JETFLOW_NAMESPACE, else the api's default)")
	root.AddCommand(a.devCmd(), a.envCmd(), a.authCmd(), a.bootstrapCmd(), a.workflowCmd(), a.runCmd(), a.showCmd(), a.lsCmd(), a.countsCmd(), a.eventsCmd(), a.projectionsCmd(), a.signalCmd(), a.cancelCmd(), a.killCmd(), a.resumeCmd(), a.replayCmd(), a.compensateCmd(), a.repairCmd(), a.locksCmd(), a.keysCmd(), a.adminCmd(), a.versionCmd(), a.probeCmd())
	return root
}

// output is the -o/--output flag of commands that print api answers: text
// for people, or json, the api's own JSON.
type output string

func (o *output) add(cmd *cobra.Command) {
	*o = "text"
	cmd.Flags().VarP(o, "output", "o", "output format: text, or json (the api's JSON)")
}

func (o *output) String() string { return string(*o) }
func (o *output) Type() string   { return "text|json" }
func (o *output) Set(v string) error {
	if v != "text" && v != "json" {
		return fmt.Errorf("%q: use text or json", v)
	}
	*o = output(v)
	return nil
}
func (o output) json() bool { return o == "json" }

// printJSON writes v as indented JSON, as the api answers.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printJSONLine writes v as one line of JSON (a stream of events).
func printJSONLine(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}
