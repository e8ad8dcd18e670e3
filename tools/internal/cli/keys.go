package cli

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"jetflow.dev/pkg/client"
)

func (a *app) keysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Manage the api's keys: create, ls, revoke (needs the admin scope)",
		Long: `An api key is a bearer token (jfk_<id>_<secret>) with a name, scopes
(read, start, signal, operate, admin) and namespaces. The api keeps only
its SHA-256: the token is printed once, when the key is made.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(a.keysCreateCmd(), a.keysLsCmd(), a.keysRevokeCmd())
	return cmd
}

func (a *app) keysCreateCmd() *cobra.Command {
	var req client.KeyRequest
	var out output
	cmd := &cobra.Command{
		Use:   "create --name NAME --scopes S,... [--namespaces NS,...] [--expires-in 30d] [-o json]",
		Short: "Make an api key and print its token (shown this once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if req.Name == "" || len(req.Scopes) == 0 {
				return usagef("--name and --scopes are required, e.g. jetflow keys create --name ci --scopes read,start")
			}
			k, err := a.client().CreateKey(cmd.Context(), req)
			if err != nil {
				return err
			}
			if out.json() {
				return printJSON(a.stdout, k)
			}
			fmt.Fprintf(a.stderr, "key %s (%s): scopes %s, namespaces %s%s\nits token, shown this once:\n", k.ID, k.Name,
				strings.Join(k.Scopes, ","), strings.Join(k.Namespaces, ","), expiry(k))
			fmt.Fprintln(a.stdout, k.Token)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Name, "name", "", "the key's name (who or what uses it; recorded as the actor of its commands)")
	f.StringSliceVar(&req.Scopes, "scopes", nil, "read, start, signal, operate, admin (comma-separated)")
	f.StringSliceVar(&req.Namespaces, "namespaces", []string{"default"}, `namespaces it may act in, or "*" for all`)
	f.StringVar(&req.ExpiresIn, "expires-in", "", "how long it lasts: a duration (720h) or days (30d); default: no expiry")
	out.add(cmd)
	return cmd
}

func expiry(k client.Key) string {
	if k.ExpiresAt.IsZero() {
		return ", no expiry"
	}
	return ", expires " + k.ExpiresAt.Local().Format(time.RFC3339)
}

func (a *app) keysLsCmd() *cobra.Command {
	var out output
	cmd := &cobra.Command{
		Use:   "ls [-o json]",
		Short: "List the api keys (never their tokens)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			keys, err := a.client().Keys(cmd.Context())
			if err != nil {
				return err
			}
			if out.json() {
				return printJSON(a.stdout, map[string]any{"keys": keys})
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tSCOPES\tNAMESPACES\tSTATUS\tCREATED\tBY\tEXPIRES")
			for _, k := range keys {
				exp := "-"
				if !k.ExpiresAt.IsZero() {
					exp = k.ExpiresAt.Local().Format("2006-01-02 15:04")
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, strings.Join(k.Scopes, ","), strings.Join(k.Namespaces, ","),
					k.Status, k.CreatedAt.Local().Format("2006-01-02 15:04"), k.CreatedBy, exp)
			}
			return tw.Flush()
		},
	}
	out.add(cmd)
	return cmd
}

func (a *app) keysRevokeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke an api key: it stops working at once (within seconds on other api replicas)",
		Args:  exactlyOne("name the key: jetflow keys revoke ID (see jetflow keys ls)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			k, err := a.client().RevokeKey(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "key %s (%s) revoked\n", k.ID, k.Name)
			return nil
		},
	}
	return cmd
}
