package benchcompare

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Config is a comparison: two jetflow-bench binaries, run in Pairs pairs
// with the same Args.
type Config struct {
	// Old and New are the paths of the two builds.
	Old, New string
	// Pairs is how many pairs of runs (at least 1; 6 or more to tell a few
	// percent from this machine's noise).
	Pairs int
	// Args are the flags both builds run with (not -figures, which each
	// run is given).
	Args []string
	// LogDir keeps each run's output (pair-N-old.log, pair-N-new.log).
	LogDir string
}

// Validate says what is wrong with c, naming the flag to fix.
func (c Config) Validate() error {
	var errs []error
	if c.Old == "" || c.New == "" {
		errs = append(errs, errors.New("-old and -new must name the two jetflow-bench binaries to compare"))
	}
	for _, bin := range []string{c.Old, c.New} {
		if bin == "" {
			continue
		}
		if st, err := os.Stat(bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			errs = append(errs, fmt.Errorf("%s is not an executable file", bin))
		}
	}
	if c.Pairs < 1 {
		errs = append(errs, fmt.Errorf("-pairs must be at least 1, not %d", c.Pairs))
	}
	// Fewer than 6 pairs can run (to try flags out), but the sign test
	// cannot tell any split of them from noise: Run says so.
	for _, a := range c.Args {
		if a == "-figures" || a == "--figures" || strings.HasPrefix(a, "-figures=") || strings.HasPrefix(a, "--figures=") {
			errs = append(errs, errors.New("leave -figures out of the bench flags: each run is given its own"))
		}
	}
	if c.LogDir == "" {
		errs = append(errs, errors.New("a directory for the runs' output is needed (-log)"))
	}
	return errors.Join(errs...)
}

// Run runs the pairs, the old build first in odd pairs and the new one
// first in even ones (so that a machine getting slower or quicker does
// not favour either), says how each run went on out, and returns the
// figures of each pair.
func Run(ctx context.Context, out io.Writer, c Config) ([]Pair, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("runs' output: %w", err)
	}
	if c.Pairs < 6 {
		fmt.Fprintf(out, "%d pairs: too few for any difference to be told from noise (the sign test needs 6 of 6 at least)\n", c.Pairs)
	}
	// A build older than -figures is read from its goals table.
	figures := map[string]bool{}
	for _, bin := range []string{c.Old, c.New} {
		help, _ := exec.CommandContext(ctx, bin, "-h").CombinedOutput() // exits 1 or 2 after the usage
		figures[bin] = strings.Contains(string(help), "-figures")
	}
	pairs := make([]Pair, c.Pairs)
	for i := range pairs {
		order := []string{"old", "new"}
		if i%2 == 1 {
			order = []string{"new", "old"}
		}
		for _, which := range order {
			bin := c.Old
			if which == "new" {
				bin = c.New
			}
			f, err := runOnce(ctx, bin, c.Args, figures[bin], filepath.Join(c.LogDir, fmt.Sprintf("pair-%d-%s", i+1, which)))
			if err != nil {
				return pairs[:i], fmt.Errorf("pair %d, %s build: %w", i+1, which, err)
			}
			fmt.Fprintf(out, "pair %d %s: %s\n", i+1, which, summary(f))
			if which == "old" {
				pairs[i].Old = f
			} else {
				pairs[i].New = f
			}
		}
	}
	return pairs, nil
}

// runOnce runs bin with args, its output to base.log and, if it takes
// -figures, its figures to base.json, and reads them (else from its goals
// table).
func runOnce(ctx context.Context, bin string, args []string, figures bool, base string) (Figures, error) {
	log, err := os.Create(base + ".log")
	if err != nil {
		return Figures{}, err
	}
	defer log.Close()
	// Whatever an earlier comparison left under this name is not this
	// run's.
	if err := os.Remove(base + ".json"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return Figures{}, err
	}
	args = append([]string(nil), args...)
	if figures {
		args = append(args, "-figures", base+".json")
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	var tail bytes.Buffer
	cmd.Stdout = io.MultiWriter(log, &tail)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Run(); err != nil {
		return Figures{}, fmt.Errorf("%w (its output: %s)\n%s", err, base+".log", lastLines(tail.String(), 10))
	}
	if !figures { // a build older than -figures: its goals table
		if f, ok := ParseGoals(tail.String()); ok {
			return f, nil
		}
		return Figures{}, fmt.Errorf("it takes no -figures, and printed no goals table (its output: %s)", base+".log")
	}
	b, err := os.ReadFile(base + ".json")
	if err != nil {
		return Figures{}, fmt.Errorf("its figures (-figures): %w (its output: %s)", err, base+".log")
	}
	var f Figures
	if err := json.Unmarshal(b, &f); err != nil {
		return Figures{}, fmt.Errorf("figures in %s: %w", base+".json", err)
	}
	return f, nil
}

// summary is one run's figures on a line, those it measured only.
func summary(f Figures) string {
	var parts []string
	for _, fig := range figureList {
		if v := fig.value(f); v > 0 {
			parts = append(parts, fig.name+" "+number(v)+strings.TrimSuffix(" "+fig.unit, " "))
		}
	}
	if len(parts) == 0 {
		return "no figure measured"
	}
	return strings.Join(parts, ", ")
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
