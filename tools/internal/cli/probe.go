package cli

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// probeCmd asks a service's probe (/healthz, /readyz) and exits 0 on a
// 2xx answer, 1 otherwise: the health check of a container whose image
// has no shell nor curl (deployments/compose).
func (a *app) probeCmd() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "probe URL",
		Short: "Ask a service's /healthz or /readyz: exit 0 if it answers 2xx (container health checks)",
		Long: `Sends GET URL (e.g. http://127.0.0.1:9481/readyz, a service's
-health-addr, or the api's -http address) and exits 0 if the answer is
2xx; otherwise it prints the answer's status and body (which say why the
service is not ready) or why there was none, and exits 1.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			u, err := url.Parse(args[0])
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return usagef("probe: %q: give an http URL with a host, e.g. http://127.0.0.1:9481/readyz", args[0])
			}
			if timeout <= 0 {
				return usagef("probe: --timeout %s: give a positive duration", timeout)
			}
			return probe(cmd.Context(), a.stdout, u.String(), timeout)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 2*time.Second, "how long to wait for the answer")
	return cmd
}

// probe sends GET url and returns nil on a 2xx answer.
func probe(ctx context.Context, stdout io.Writer, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	text := strings.TrimSpace(string(body))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("probe %s: %s: %s", url, resp.Status, text)
	}
	fmt.Fprintln(stdout, text)
	return nil
}
