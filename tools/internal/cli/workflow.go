package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"jetflow.dev/pkg/client"
)

func (a *app) workflowCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "workflow", Aliases: []string{"workflows", "wf"}, Short: "Register, list and show workflow definitions",
		Args: cobra.NoArgs, RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() }}
	var files []string
	apply := &cobra.Command{
		Use:   "apply -f FILE [-f FILE...]",
		Short: "Register a workflow definition (YAML or JSON); a changed definition becomes a new version",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("give each file with -f: jetflow workflow apply -f %s", strings.Join(args, " -f "))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(files) == 0 {
				return usagef("-f FILE is required (use - for standard input)")
			}
			if n := len(slices.DeleteFunc(slices.Clone(files), func(f string) bool { return f != "-" })); n > 1 {
				return usagef("-f - (standard input) can be given once")
			}
			for i, file := range files {
				if err := a.applyFile(cmd, file); err != nil {
					if i > 0 {
						return fmt.Errorf("%w (the files before %s were applied)", err, file)
					}
					return err
				}
			}
			return nil
		},
	}
	apply.Flags().StringArrayVarP(&files, "file", "f", nil, "definition file (- for standard input); repeat it to apply several, in order")
	var out output
	ls := &cobra.Command{
		Use:   "ls [-o json]",
		Short: "List registered workflows",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			list, err := a.client().ListWorkflows(cmd.Context())
			if err != nil {
				return err
			}
			if out.json() {
				return printJSON(a.stdout, map[string]any{"workflows": list})
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tVERSION\tUPDATED\tDESCRIPTION")
			for _, w := range list {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", w.Name, w.LatestVersion, w.UpdatedAt.Local().Format("2006-01-02 15:04:05"), w.Description)
			}
			return tw.Flush()
		},
	}
	out.add(ls)
	cmd.AddCommand(apply, ls, a.workflowShowCmd())
	return cmd
}

// workflowShowCmd prints a registered definition as YAML that jetflow
// workflow apply reads back as the same definition.
func (a *app) workflowShowCmd() *cobra.Command {
	var out output
	var version int
	show := &cobra.Command{
		Use:   "show NAME [--version N] [-o json]",
		Short: "Print a registered workflow's definition (its latest version, or --version N) as YAML that workflow apply takes back",
		Args:  exactlyOne("name the workflow: jetflow workflow show NAME (see jetflow workflow ls)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("version") && version < 1 {
				return usagef("--version %d: give a version number from 1 (see jetflow workflow show %s)", version, args[0])
			}
			var v client.WorkflowVersion
			var versions []int
			var answer any // the api's answer, for -o json
			if version > 0 {
				var err error
				if v, err = a.client().WorkflowVersion(cmd.Context(), args[0], version); err != nil {
					return err
				}
				answer = v
			} else {
				w, err := a.client().Workflow(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				v, versions, answer = w.Latest, w.Versions, w
			}
			if out.json() {
				return printJSON(a.stdout, answer)
			}
			// Comments: the YAML stays what apply takes back.
			fmt.Fprintf(a.stdout, "# %s version %d, stored %s, digest %s\n", v.Name, v.Version,
				v.CreatedAt.Local().Format("2006-01-02 15:04:05"), v.Digest)
			if len(versions) > 1 {
				nums := make([]string, len(versions))
				for i, n := range versions {
					nums[i] = strconv.Itoa(n)
				}
				fmt.Fprintf(a.stdout, "# versions: %s (--version N shows another)\n", strings.Join(nums, ", "))
			}
			_, err := io.WriteString(a.stdout, v.YAML)
			return err
		},
	}
	show.Flags().IntVar(&version, "version", 0, "the version to show (default: the latest)")
	out.add(show)
	return show
}

// applyFile registers the definition in file ("-": standard input).
func (a *app) applyFile(cmd *cobra.Command, file string) error {
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(cmd.InOrStdin())
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		if st, serr := os.Stat(file); serr == nil && st.IsDir() {
			return usagef("%s is a directory: apply its files with one -f each (jetflow dev --apply takes directories)", file)
		}
		return usageError{fmt.Errorf("read definition: %w", err)} // the error names the file
	}
	res, err := a.client().ApplyWorkflow(cmd.Context(), data)
	if err != nil {
		return explainDefinitionError(file, err)
	}
	verb := "unchanged"
	if res.Created {
		verb = "created"
	}
	fmt.Fprintf(a.stdout, "workflow %s version %d %s\n", res.Name, res.Version, verb)
	return nil
}

// explainDefinitionError lists each problem as FILE:LINE: field: message.
func explainDefinitionError(file string, err error) error {
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Code != "invalid_definition" {
		return err
	}
	var problems []struct {
		Field   string `json:"field"`
		Line    int    `json:"line"`
		Message string `json:"message"`
	}
	if jsonUnmarshal(apiErr.Problems, &problems) != nil || len(problems) == 0 {
		return err
	}
	msg := "the definition is invalid; fix these and apply again:"
	for _, p := range problems {
		loc := file
		if p.Line > 0 {
			loc = fmt.Sprintf("%s:%d", file, p.Line)
		}
		if p.Field != "" {
			msg += fmt.Sprintf("\n  %s: %s: %s", loc, p.Field, p.Message)
		} else {
			msg += fmt.Sprintf("\n  %s: %s", loc, p.Message)
		}
	}
	return usageError{errors.New(msg)}
}
