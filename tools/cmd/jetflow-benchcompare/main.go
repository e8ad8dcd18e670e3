// Command jetflow-benchcompare runs two builds of jetflow-bench in
// alternating pairs and says, figure by figure, whether the new one did
// better than this machine's noise explains (docs/benchmarks.md,
// "Comparing two commits"; make bench/compare builds both).
//
//	jetflow-benchcompare -old OLD_BIN -new NEW_BIN [-pairs 6] [-log DIR] [-- BENCH_FLAGS...]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"jetflow.dev/tools/internal/benchcompare"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "jetflow-benchcompare:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	var c benchcompare.Config
	fs := flag.NewFlagSet("jetflow-benchcompare", flag.ContinueOnError)
	fs.StringVar(&c.Old, "old", "", "the jetflow-bench binary of the commit before")
	fs.StringVar(&c.New, "new", "", "the jetflow-bench binary of the change")
	fs.IntVar(&c.Pairs, "pairs", 6, "pairs of runs, one of each build (the old first in odd pairs, the new in even ones)")
	fs.StringVar(&c.LogDir, "log", "", "keep each run's output and figures in this directory (default: a new temporary one, named at the end)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: jetflow-benchcompare -old OLD_BIN -new NEW_BIN [-pairs N] [-log DIR] [-- jetflow-bench flags]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	c.Args = fs.Args()
	if c.LogDir == "" {
		dir, err := os.MkdirTemp("", "jetflow-benchcompare-")
		if err != nil {
			return err
		}
		c.LogDir = dir
	}
	if err := c.Validate(); err != nil {
		return err
	}
	fmt.Fprintf(out, "comparing %s (old) and %s (new): %d pairs of jetflow-bench %v\n", c.Old, c.New, c.Pairs, c.Args)
	pairs, err := benchcompare.Run(ctx, out, c)
	if err != nil {
		return err
	}
	fmt.Fprintln(out)
	benchcompare.Print(out, benchcompare.Compare(pairs))
	fmt.Fprintf(out, "\neach run's output and figures: %s\n", c.LogDir)
	return nil
}
