// Package svcrun is what the four service programs share in their main
// and run functions: signal handling, the common flags, the logger, the
// NATS connections and their drain at shutdown. So each run.go holds only
// its own service's settings. (Package metrics is the Prometheus
// listener, for a service that serves one.)
package svcrun

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/svc"
)

// RunFunc is a service program's run: it returns when ctx ends and the
// service has shut down, or when it fails.
type RunFunc func(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error

// Main is a service program's main: it calls run with a context that
// ends at the first SIGINT or SIGTERM (a second one ends the process at
// once, without waiting for the shutdown), the arguments, the
// environment and stderr. An error ends the process with status 1,
// printed after the program's name, unless it came after a stop was
// asked for (it is then the stop itself) or is [flag.ErrHelp] (-h).
func Main(program string, run RunFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop) // from the first signal on, the default action again
	err := run(ctx, os.Args[1:], os.Getenv, os.Stderr)
	code := exitCode(program, err, ctx.Err() != nil, os.Stderr)
	stop()
	os.Exit(code)
}

// exitCode is the exit status of a program whose run returned err
// (stopped: after a stop was asked for), and prints err if it is a
// failure.
func exitCode(program string, err error, stopped bool, stderr io.Writer) int {
	if err == nil || errors.Is(err, flag.ErrHelp) || stopped {
		return 0
	}
	fmt.Fprintln(stderr, program+":", err)
	return 1
}

// Program is one run of a service program: its flags, the common ones
// among them, and once parsed its logger.
type Program struct {
	*svc.Flags
	// Common are the settings every service has.
	Common *svc.Common
	// Log is the service's logger, built by Parse.
	Log zerolog.Logger

	// TopologyEvery is how often the service looks for the streams and
	// buckets it uses (0: TopologyEvery); tests shorten it.
	TopologyEvery time.Duration
	// HealthListening, when set, is told the health listener's address
	// (tests listen on port 0).
	HealthListening func(addr string)

	role       auth.Role
	stderr     io.Writer
	healthAddr *string // -health-addr; nil for the api, which serves its own
	health     *Health
	version    *bool // -version
}

// New starts the flags of the service of role (jetflow-<role>) with the
// common ones. Usage (-h) and flag errors go to stderr, and so does the
// log.
func New(role auth.Role, getenv func(string) string, stderr io.Writer) *Program {
	f := svc.NewFlags("jetflow-"+string(role), getenv)
	f.SetOutput(stderr)
	p := &Program{Flags: f, Common: f.AddCommon(), Log: zerolog.Nop(), role: role, stderr: stderr}
	p.version = f.FlagSet.Bool("version", false, "print this build's version and exit")
	if role != auth.RoleAPI { // the api answers /healthz and /readyz on its own address
		p.healthAddr = f.String("health-addr", "JETFLOW_HEALTH_ADDR", "",
			"host:port of the /healthz and /readyz probes, e.g. 127.0.0.1:9480 (empty: off)")
	}
	return p
}

// isBool says whether arg is a boolean flag given alone (-name or
// --name, without =value).
func (p *Program) isBool(arg string) bool {
	name := strings.TrimLeft(arg, "-")
	if name == arg || strings.Contains(name, "=") {
		return false
	}
	f := p.FlagSet.Lookup(name)
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Parse parses args, which hold flags only, checking every ranged flag,
// and builds the logger. After -h it returns [flag.ErrHelp].
func (p *Program) Parse(args []string) error {
	if err := p.Flags.Parse(args); err != nil {
		return err
	}
	if *p.version {
		fmt.Fprintln(p.stderr, "jetflow-"+string(p.role), svc.Version())
		return flag.ErrHelp // nothing to run: exit 0
	}
	if rest := p.Args(); len(rest) > 0 {
		if i := len(args) - len(rest) - 1; i >= 0 && p.isBool(args[i]) {
			// -group-commit false: the flag package took -group-commit
			// alone (true) and left its intended value.
			return fmt.Errorf("unexpected argument %q: %s is a boolean flag, which takes its value after =: %s=%s",
				strings.Join(rest, " "), args[i], args[i], rest[0])
		}
		return fmt.Errorf("unexpected argument %q: every setting is a flag (-h lists them)", strings.Join(rest, " "))
	}
	log, err := Logger(p.stderr, p.Common, string(p.role))
	if err != nil {
		return err
	}
	p.Log = log
	return nil
}

// Services log times to the nanosecond, and durations as text with
// their unit (took=1.52ms, not took=1.52). zerolog keeps the formats in
// globals: set once here, never while loggers run (tests start and stop
// services in one process).
func init() {
	zerolog.TimeFieldFormat = time.RFC3339Nano
	zerolog.DurationFieldFormat = zerolog.DurationFormatString
}

// Logger builds the service's logger from the common flags.
func Logger(stderr io.Writer, c *svc.Common, service string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(*c.LogLevel)
	if err != nil || lvl == zerolog.NoLevel {
		return zerolog.Nop(), fmt.Errorf("-log-level %q: use debug, info, warn or error", *c.LogLevel)
	}
	w := stderr
	if !*c.LogJSON {
		w = zerolog.ConsoleWriter{Out: stderr, TimeFormat: "15:04:05.000", NoColor: true}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Str("service", service).Logger(), nil
}

// Namespace is one namespace a service serves: its connection, and a
// logger that names it.
type Namespace struct {
	Name string
	NC   *nats.Conn
	JS   jetstream.JetStream
	Log  zerolog.Logger
	// Topology is what the service last found of the streams and buckets
	// it uses (topology.go).
	Topology *bus.Topology

	health *Health
	probe  *nsHealth
}

// Ready gives /readyz the service's own readiness in this namespace:
// ready returns why it is not ready (consumers not bound yet, what it
// reads first not read yet), nil once it is. Until it is called the
// namespace reads "starting".
func (ns Namespace) Ready(ready func() error) { ns.health.setReady(ns.probe, ready) }

// Serve connects the service to every namespace it serves, and runs fn
// for each at once until ctx ends or one fails. Each namespace is a NATS
// account with its own topology, so a service runs one instance of
// itself per namespace.
//
// Serve returns only once every fn has returned and its connection is
// drained and closed: the messages its handlers still held are handled,
// and what they published (acknowledgements among it) has reached the
// server. A drain that takes longer than [svc.DrainTimeout] is cut
// short, and logged.
func (p *Program) Serve(ctx context.Context, fn func(context.Context, Namespace) error) error {
	names, err := p.Common.ServedNamespaces()
	if err != nil {
		return err
	}
	p.Log.Info().Str("version", svc.Version()).Strs("namespaces", names).Msg("starting")
	if p.healthAddr != nil && *p.healthAddr != "" {
		p.health = newHealth(names)
		stop, err := serveHealth("-health-addr", *p.healthAddr, p.health, p.Log, p.HealthListening)
		if err != nil {
			return err
		}
		defer stop()
	}
	g, gctx := errgroup.WithContext(ctx)
	for _, name := range names {
		g.Go(func() error {
			ns, err := p.open(gctx, name, len(names))
			if err != nil {
				if gctx.Err() != nil {
					return nil // stopped while starting: not an error
				}
				return err
			}
			defer drain(ns)
			if err := fn(gctx, ns); err != nil {
				return fmt.Errorf("namespace %s: %w", name, err)
			}
			return nil
		})
	}
	return g.Wait()
}

// OpenAll connects the service to every namespace it serves, for a
// service that serves them all from one place (the api); closeAll drains
// the connections and returns once they are closed, as [Program.Serve]
// does. The default namespace, when served, comes first.
func (p *Program) OpenAll(ctx context.Context) (nss []Namespace, closeAll func(), err error) {
	names, err := p.Common.ServedNamespaces()
	if err != nil {
		return nil, nil, err
	}
	p.Log.Info().Str("version", svc.Version()).Strs("namespaces", names).Msg("starting")
	closeAll = func() {
		var wg sync.WaitGroup
		for _, ns := range nss {
			wg.Go(func() { drain(ns) })
		}
		wg.Wait()
	}
	for _, name := range names {
		ns, err := p.open(ctx, name, len(names))
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		nss = append(nss, ns)
	}
	return nss, closeAll, nil
}

// open connects to namespace name, one of served.
func (p *Program) open(ctx context.Context, name string, served int) (Namespace, error) {
	l := p.Log
	if served > 1 || name != auth.DefaultNamespace {
		l = l.With().Str("namespace", name).Logger()
	}
	nc, js, err := p.Common.Open(ctx, name, p.role, "jetflow-"+string(p.role),
		func(err error) { l.Warn().Err(err).Msg("waiting for jetstream") },
		func(err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				l.Error().Err(err).Msg("nats permission violation: this identity may not do that")
				return
			}
			l.Warn().Err(err).Msg("nats")
		},
		// Say once when NATS goes away and when it is back, not only
		// through the failures of what the service tries meanwhile.
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: closed on purpose
				l.Warn().Err(err).Msg("disconnected from nats, reconnecting")
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			l.Info().Str("server", nc.ConnectedUrlRedacted()).Msg("reconnected to nats")
		}))
	if err != nil {
		return Namespace{}, fmt.Errorf("namespace %s: %w", name, err)
	}
	every := cmp.Or(p.TopologyEvery, TopologyEvery)
	topo := watchTopology(ctx, js, bus.Config{Replicas: *p.Common.Replicas}, p.role, every, l)
	return Namespace{Name: name, NC: nc, JS: js, Log: l, Topology: topo, health: p.health, probe: p.health.add(name, nc, topo)}, nil
}

// drain drains ns's connection and waits until it is closed.
func drain(ns Namespace) {
	ns.Topology.Stop()
	if err := svc.Drain(ns.NC, svc.DrainTimeout); err != nil {
		ns.Log.Warn().Err(err).Msg("shutdown")
	}
}
