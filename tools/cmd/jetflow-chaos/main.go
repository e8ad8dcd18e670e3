// Command jetflow-chaos runs the chaos suite (package chaos): about a
// thousand mixed executions through nats-server and the four services,
// each its own process, SIGKILLed at random while operations run; then a
// check of every history. It prints a report and exits 1 on any
// violation. `make build` makes the programs it runs; `make chaos` and
// `make chaos/cluster` run it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"jetflow.dev/tools/internal/chaos"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "jetflow-chaos:", err)
		os.Exit(1)
	}
}

// errViolations says the run found violations (the report says which).
var errViolations = errors.New("the checker found violations, or requests (starts, signals, actions) were never accepted (see the report)")

func run(ctx context.Context, args []string, out io.Writer) error {
	var c chaos.Config
	var bin, mode, only string
	var keep bool
	fs := flag.NewFlagSet("jetflow-chaos", flag.ContinueOnError)
	fs.StringVar(&bin, "bin", "bin", "directory of nats-server and the service programs (make build)")
	fs.StringVar(&mode, "mode", string(chaos.ModeServices), "what to kill: services (a standalone nats-server and each service), cluster (one node of three at a time) or drills (the named failure drills on a 3-node cluster, measured one by one)")
	fs.IntVar(&c.Executions, "executions", 1000, "executions to start")
	fs.Float64Var(&c.Rate, "rate", 20, "starts per second")
	fs.IntVar(&c.KillsPerKind, "kills", 0, "SIGKILLs of each kind of process (default 5; cluster: 6 node kills)")
	fs.DurationVar(&c.MaxDowntime, "max-downtime", time.Second, "longest time a killed process stays down (from 100ms)")
	fs.DurationVar(&c.Settle, "settle", 5*time.Minute, "how long to wait after the last kill for every execution to end")
	fs.Uint64Var(&c.Seed, "seed", 0, "seed of the choices of victims and pauses (0: random; the report prints it)")
	fs.StringVar(&c.Dir, "data", "", "directory for the run's data, logs and marks (default: a new temp dir, removed if the run passes)")
	fs.BoolVar(&keep, "keep", false, "keep the data directory even if the run passes")
	fs.StringVar(&only, "drills", "", "drills mode: comma-separated drills to run (default all: "+strings.Join(chaos.DrillNames(), ", ")+")")
	fs.Float64Var(&c.Drills.Rate, "drill-rate", 8, "drills mode: starts per second during a drill (one in four waits for its signal, every other one of those after a resume)")
	fs.DurationVar(&c.Drills.NodeDown, "node-down", 15*time.Second, "drills mode: how long the non-leader node stays down")
	fs.DurationVar(&c.Drills.Restart, "restart", 5*time.Second, "drills mode: how long a killed dispatcher, agent or api stays down")
	fs.DurationVar(&c.Drills.Stop, "stop", 2*time.Second, "drills mode: how long the lone dispatcher is SIGSTOPped")
	fs.DurationVar(&c.Drills.Budget, "budget", 5*time.Second, "drills mode: the longest stall a drill may cause (reported; -strict fails the run over it)")
	fs.DurationVar(&c.Drills.DispatcherAckWait, "dispatcher-ack-wait", 0, "drills mode: the dispatchers' ack wait (default: the topology's, 5s)")
	fs.DurationVar(&c.Drills.TaskAckWait, "task-ack-wait", 0, "drills mode: the agents' task ack wait (default: the topology's, 4s)")
	var strict bool
	fs.BoolVar(&strict, "strict", false, "drills mode: exit 1 when a drill's stall is over the budget")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %v", fs.Args())
	}
	c.Mode, c.Bin, c.Progress = chaos.Mode(mode), chaos.BinariesIn(bin), out
	if only != "" {
		c.Drills.Only = strings.Split(only, ",")
	}
	if c.Dir == "" {
		dir, err := os.MkdirTemp("", "jetflow-chaos-")
		if err != nil {
			return err
		}
		c.Dir = dir
	}
	rep, err := chaos.Run(ctx, c)
	if err != nil {
		return fmt.Errorf("%w (data, logs and marks in %s)", err, c.Dir)
	}
	rep.Write(out)
	if !rep.Passed() {
		return errViolations
	}
	if over := rep.OverBudget(); strict && len(over) > 0 {
		return fmt.Errorf("drills over the %s budget: %s (data, logs and marks in %s)", c.Drills.Budget, strings.Join(over, ", "), c.Dir)
	}
	if !keep {
		_ = os.RemoveAll(c.Dir)
		fmt.Fprintf(out, "  (%s removed: the run passed; -keep keeps it)\n", c.Dir)
	}
	return nil
}
