// Package devstack runs jetflow on one machine: an embedded nats-server
// with JetStream on disk plus the api, dispatcher, agent and janitor, each
// on its own NATS connection, so they still talk only through JetStream.
// `jetflow dev`, the end-to-end tests and the benchmark use it.
package devstack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/natsserver"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/services/agent/agent"
	"jetflow.dev/services/api/api"
	"jetflow.dev/services/dispatcher/dispatch"
	"jetflow.dev/services/janitor/janitor"
)

// Config configures a stack.
type Config struct {
	// DataDir holds JetStream's files; it survives restarts. Required.
	DataDir string
	// NATSAddr is host:port for the embedded server. Default 127.0.0.1:4222;
	// port 0 picks a free port.
	NATSAddr string
	// NATSURL, when set, points the services at an existing NATS server or
	// cluster (comma-separated URLs) instead of starting an embedded one.
	NATSURL string
	// Replicas of streams and buckets (3 on a cluster). Default 1.
	Replicas int
	// HTTPAddr is the api's listen address. Default 127.0.0.1:8080.
	HTTPAddr string
	// StartWait is how long the api waits for the dispatcher's verdict on
	// a command before answering 202. Default the api's (5s).
	StartWait time.Duration
	// Apply lists workflow files or directories (*.yaml, *.yml, *.json) to
	// register at start.
	Apply []string
	// Agent settings.
	TaskAckWait time.Duration
	MaxDeliver  int
	Concurrency int
	KillGrace   time.Duration
	// Handlers adds custom operations to the agent (tests, embedding).
	Handlers map[string]operation.Handler
	// Dispatcher settings.
	Workers int
	// Janitor settings.
	JanitorInterval time.Duration
	IdleAfter       time.Duration
	// RetentionDefault is the system retention rule (default 3).
	RetentionDefault string
	// Log receives every service's log.
	Log zerolog.Logger
	// LogNATS forwards the server's own log.
	LogNATS bool
}

// Info tells where a running stack can be reached.
type Info struct {
	NATSURL string
	APIURL  string
	// Server is the embedded server (nil with Config.NATSURL).
	Server *server.Server
}

// Run starts the stack, calls ready once every service is up, and blocks
// until ctx ends; then it stops the services and the server.
func Run(ctx context.Context, cfg Config, ready func(Info)) error {
	url := cfg.NATSURL
	var srv *server.Server
	if url == "" {
		if cfg.DataDir == "" {
			return errors.New("devstack: DataDir is required")
		}
		host, port, err := splitAddr(cmp.Or(cfg.NATSAddr, "127.0.0.1:4222"))
		if err != nil {
			return fmt.Errorf("nats address: %w", err)
		}
		ncfg := natsserver.Config{StoreDir: filepath.Join(cfg.DataDir, "jetstream"), Host: host, Port: port}
		if port == 0 {
			ncfg.Port = -1
		}
		if cfg.LogNATS {
			ncfg.Logger = natsLogger{cfg.Log.With().Str("service", "nats").Logger()}
		}
		if srv, err = natsserver.Start(ncfg); err != nil {
			return err
		}
		defer natsserver.Stop(srv)
		url = srv.ClientURL()
	}

	ln, err := net.Listen("tcp", cmp.Or(cfg.HTTPAddr, "127.0.0.1:8080"))
	if err != nil {
		return fmt.Errorf("api address: %w", err)
	}
	info := Info{NATSURL: url, APIURL: "http://" + ln.Addr().String(), Server: srv}

	svcCtx, stop := context.WithCancel(ctx)
	defer stop()
	g, gctx := errgroup.WithContext(svcCtx)
	start := func(name string, fn func(context.Context, *bus.Conn) error) {
		g.Go(func() error {
			nc, js, err := bus.Open(gctx, url, "jetflow-"+name, bus.Config{Replicas: cfg.Replicas,
				OnRetry: func(err error) {
					cfg.Log.Warn().Err(err).Str("service", name).Msg("waiting for jetstream")
				}})
			if err != nil {
				if gctx.Err() != nil {
					return nil // stopped while starting: not an error
				}
				return err
			}
			defer nc.Drain()
			conn := &bus.Conn{NC: nc, JS: js}
			if err := fn(gctx, conn); err != nil && gctx.Err() == nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		})
	}
	log := func(name string) zerolog.Logger { return cfg.Log.With().Str("service", name).Logger() }
	start("dispatcher", func(ctx context.Context, c *bus.Conn) error {
		d, err := dispatch.New(ctx, dispatch.Config{Workers: cfg.Workers}, c.JS, log("dispatcher"))
		if err != nil {
			return err
		}
		return d.Run(ctx)
	})
	start("agent", func(ctx context.Context, c *bus.Conn) error {
		a, err := agent.New(agent.Config{Name: "dev-agent", AckWait: cfg.TaskAckWait, MaxDeliver: cfg.MaxDeliver,
			Concurrency: cfg.Concurrency, KillGrace: cfg.KillGrace, Handlers: cfg.Handlers}, c.JS, log("agent"))
		if err != nil {
			return err
		}
		return a.Run(ctx)
	})
	start("janitor", func(ctx context.Context, c *bus.Conn) error {
		j, err := janitor.New(janitor.Config{Interval: cfg.JanitorInterval, IdleAfter: cfg.IdleAfter,
			RetentionDefault: cfg.RetentionDefault}, c.JS, log("janitor"))
		if err != nil {
			return err
		}
		return j.Run(ctx)
	})
	start("api", func(ctx context.Context, c *bus.Conn) error {
		if err := applyFiles(ctx, c, cfg.Apply, log("api")); err != nil {
			return err
		}
		if ready != nil {
			ready(info)
		}
		return api.Serve(ctx, api.Config{Listener: ln, StartWait: cfg.StartWait}, c.NC, c.JS, log("api"))
	})
	err = g.Wait()
	_ = ln.Close()
	return err
}

func splitAddr(addr string) (string, int, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	var port int
	if _, err := fmt.Sscan(p, &port); err != nil {
		return "", 0, fmt.Errorf("port %q: %w", p, err)
	}
	return h, port, nil
}

// applyFiles registers workflow definitions from files and directories.
func applyFiles(ctx context.Context, c *bus.Conn, paths []string, log zerolog.Logger) error {
	if len(paths) == 0 {
		return nil
	}
	store, err := catalog.Open(ctx, c.JS)
	if err != nil {
		return err
	}
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("apply %s: %w", p, err)
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return fmt.Errorf("apply %s: %w", p, err)
		}
		for _, e := range entries {
			if ext := strings.ToLower(filepath.Ext(e.Name())); !e.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
				files = append(files, filepath.Join(p, e.Name()))
			}
		}
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("apply %s: %w", f, err)
		}
		def, err := workflow.Parse(data)
		if err != nil {
			return fmt.Errorf("apply %s: %w", f, err)
		}
		rec, created, err := store.Apply(ctx, def)
		if err != nil {
			return fmt.Errorf("apply %s: %w", f, err)
		}
		log.Info().Str("file", f).Str("workflow", rec.Name).Int("version", rec.Version).Bool("created", created).Msg("workflow applied")
	}
	return nil
}

// natsLogger adapts nats-server's printf-style logger to zerolog.
type natsLogger struct{ log zerolog.Logger }

func (l natsLogger) Noticef(format string, v ...any) { l.log.Info().Msgf(format, v...) }
func (l natsLogger) Warnf(format string, v ...any)   { l.log.Warn().Msgf(format, v...) }
func (l natsLogger) Fatalf(format string, v ...any)  { l.log.Error().Msgf(format, v...) }
func (l natsLogger) Errorf(format string, v ...any)  { l.log.Error().Msgf(format, v...) }
func (l natsLogger) Debugf(format string, v ...any)  { l.log.Debug().Msgf(format, v...) }
func (l natsLogger) Tracef(format string, v ...any)  { l.log.Trace().Msgf(format, v...) }
