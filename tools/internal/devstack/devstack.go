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
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/natsserver"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/services/agent/agent"
	"jetflow.dev/services/api/access"
	"jetflow.dev/services/api/api"
	"jetflow.dev/services/dispatcher/dispatch"
	"jetflow.dev/services/janitor/janitor"
	"jetflow.dev/tools/internal/backup"
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
	// NoTimerNotices runs the dispatcher without long timers' notices
	// (dispatch.Config.NoTimerNotices, docs/adr/0019).
	NoTimerNotices bool
	// Replicas of streams and buckets (3 on a cluster). Default 1.
	Replicas int
	// HTTPAddr is the api's listen address. Default 127.0.0.1:8080.
	HTTPAddr string
	// VisibilityPostgres, when set, is the URL of the PostgreSQL database
	// that holds the api's visibility index (api.Config.VisibilityPostgres)
	// instead of DataDir/visibility.
	VisibilityPostgres string
	// VisibilityCache is the page cache of the SQLite visibility index's
	// writer, in bytes (api.Config.VisibilityCache; 0: its default).
	VisibilityCache int
	// ProjectorCoalesce is the api's api.Config.ProjectorCoalesce (0: its
	// default, negative: never).
	ProjectorCoalesce time.Duration
	// ProjectorGather is the api's api.Config.ProjectorGather (0: its
	// default, negative: never).
	ProjectorGather time.Duration
	// StartWait is how long the api waits for the dispatcher's verdict on
	// a command before answering 202. Default the api's (5s).
	StartWait time.Duration
	// MaxReadModel is the api's largest read model, in bytes (0: its default).
	MaxReadModel int
	// Apply lists workflow files or directories (*.yaml, *.yml, *.json) to
	// register at start.
	Apply []string
	// Agent settings.
	TaskAckWait time.Duration
	MaxDeliver  int
	Concurrency int
	KillGrace   time.Duration
	// StartedAfter is how long an operation runs before the agent
	// reports it started on its own (agent.Config.StartedAfter: 0 is its
	// default, agent.StartedAtOnce reports every start at once).
	StartedAfter time.Duration
	// Handlers adds custom operations to the agent (tests, embedding).
	Handlers map[string]operation.Handler
	// LocalHandlers are the dispatcher's handlers of local call steps
	// (dispatch.Config.LocalHandlers, docs/adr/0014).
	LocalHandlers map[string]operation.Handler
	// AgentPolicy is the agent's policy. nil is the development default:
	// exec steps on, any command, any host. (A standalone agent's default
	// is exec off.)
	AgentPolicy *agent.Policy
	// SecretsDir is the agent's secrets directory (the file NAME is
	// ${secret.NAME}). Default DataDir/secrets, created (mode 0700) when
	// missing; none when there is no DataDir either.
	SecretsDir string
	// SecretsEnvPrefix makes the environment variables <prefix>NAME
	// secrets too. Default JETFLOW_SECRET_; "-" for none.
	SecretsEnvPrefix string
	// Dispatcher settings.
	Workers int
	// GroupCommit is the dispatcher's -group-commit (docs/adr/0020): its
	// history appends gathered into atomic batches, for SyncAlways.
	GroupCommit bool
	// TopologyEvery is how often the stack looks for its streams and
	// buckets and makes a missing one again (0: TopologyEvery).
	TopologyEvery time.Duration
	// CacheSize bounds the execution states the dispatcher keeps in
	// memory (0: its default, 10000).
	CacheSize int
	// BulkAfter is the dispatcher's -bulk-after (0: its default;
	// dispatch.NoBulkLane: every task on the normal lane).
	BulkAfter int
	// NoDirectReports: agents store every report on the results stream,
	// and dispatchers take none handed straight to them (docs/adr/0009).
	NoDirectReports bool
	// DirectWait is the agent's -direct-wait (0: its default).
	DirectWait time.Duration
	// LeaseTTL is the lifetime of the dispatcher's partition leases,
	// whole seconds (0: the service's default, 1s).
	LeaseTTL time.Duration
	// Janitor settings.
	JanitorInterval time.Duration
	// JanitorCatchUpEvery is the janitor's CatchUpEvery (0: its default,
	// negative: never).
	JanitorCatchUpEvery time.Duration
	IdleAfter           time.Duration
	// RetentionDefault is the system retention rule (default 3).
	RetentionDefault string
	// Log receives every service's log.
	Log zerolog.Logger
	// LogNATS forwards the server's own log.
	LogNATS bool
	// SyncAlways makes the embedded server fsync every JetStream write
	// before acknowledging it (sync_interval: always); SyncInterval, when
	// it is off, is how often it fsyncs (0: nats-server's default, 2 min).
	// Both are ignored with NATSURL.
	SyncAlways   bool
	SyncInterval time.Duration
	// Insecure runs the embedded server without authentication: anyone
	// who reaches it may do anything (experiments only). By default the
	// stack is secure: NATS runs in operator mode with the identities of
	// DataDir/auth (made on first start, see package auth), each service
	// connects with its own role's credentials, and only the bootstrap's
	// admin identity changes the topology. With NATSURL the stack is
	// insecure unless CredsDir says where its identities are.
	//
	// Insecure also turns the api's authentication off. Without it, every
	// HTTP caller needs a token: the stack makes a bootstrap admin token
	// in DataDir/auth/admin.token on its first start (AdminTokenFile) and
	// gives it to its api.
	Insecure bool
	// CredsDir, with NATSURL, is an auth directory (jetflow auth init)
	// whose creds the services use.
	CredsDir string
	// Restore is a backup directory (jetflow admin backup) to restore
	// into the embedded server before the bootstrap and the services
	// start (default namespace). It refuses a server whose streams hold
	// data: start on a new data directory.
	Restore string
	// Namespaces are the namespaces (NATS accounts, each with its own
	// topology) the stack serves: a dispatcher, an agent and a janitor
	// run in each, and the api serves them all. Default
	// ["default"]; more need a secure stack.
	Namespaces []string
	// MetricsAddr is host:port where the Prometheus metrics of every
	// service, and the process's, are served on one /metrics
	// (Info.MetricsURL); empty: none. Port 0 picks a free port.
	MetricsAddr string
	// Registerer, when set (MetricsAddr empty), gets every service's
	// metrics instead: a program embedding the stack serves them itself.
	Registerer prometheus.Registerer
	// Tracer, when set, records the api's, the dispatcher's and the
	// agent's spans (package tracing; jetflow dev makes it from the
	// OTEL_* variables); nil records none.
	Tracer trace.TracerProvider
}

// Info tells where a running stack can be reached.
type Info struct {
	NATSURL string
	APIURL  string
	// Server is the embedded server (nil with Config.NATSURL).
	Server *server.Server
	// CredsDir is the default namespace's directory holding each role's
	// creds file (auth.CredsFile); "" for an insecure stack.
	CredsDir string
	// AuthDir is the auth directory ("" for an insecure stack).
	AuthDir string
	// AdminToken is the api's bootstrap admin token, kept in
	// AdminTokenPath; both "" for an insecure stack (no HTTP auth).
	AdminToken     string
	AdminTokenPath string
	// MetricsURL is where the services' metrics are served
	// (http://host:port/metrics); "" without Config.MetricsAddr.
	MetricsURL string
}

// Client is a client of the stack's api, with the admin token.
func (i Info) Client() *client.Client {
	return client.New(i.APIURL, client.WithToken(i.AdminToken))
}

// AdminTokenFile is the name of the bootstrap admin token's file in the
// auth directory (DataDir/auth/admin.token, 0600).
const AdminTokenFile = "admin.token"

// EnsureAdminToken returns the admin token kept in dir/admin.token,
// making a random one (and dir, 0700) the first time.
func EnsureAdminToken(dir string) (path, token string, err error) {
	path = filepath.Join(dir, AdminTokenFile)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", fmt.Errorf("admin token: %w", err)
	}
	if token, err = ReadToken(path); err == nil {
		return path, token, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", "", err
	}
	if token, err = access.NewAdminToken(); err != nil {
		return "", "", err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", "", fmt.Errorf("admin token: %w", err)
	}
	if _, err := f.WriteString(token + "\n"); err != nil {
		f.Close()
		return "", "", fmt.Errorf("admin token: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", "", fmt.Errorf("admin token: %w", err)
	}
	return path, token, nil
}

// ReadToken reads a token file: its first line that is neither blank nor
// a # comment. The error wraps os.ErrNotExist when there is no file.
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			return line, nil
		}
	}
	return "", fmt.Errorf("%s holds no token", path)
}

// Creds is the path of role's creds file in the default namespace (""
// for an insecure stack).
func (i Info) Creds(role auth.Role) string { return i.CredsIn(auth.DefaultNamespace, role) }

// CredsIn is the path of role's creds file in namespace ns.
func (i Info) CredsIn(ns string, role auth.Role) string {
	if i.AuthDir == "" {
		return ""
	}
	return filepath.Join(i.AuthDir, ns, auth.CredsFile(role))
}

// Options are the nats.go options of a connection as role in the default
// namespace (none on an insecure stack).
func (i Info) Options(role auth.Role) ([]nats.Option, error) {
	return i.OptionsIn(auth.DefaultNamespace, role)
}

// OptionsIn are the nats.go options of a connection as role in ns.
func (i Info) OptionsIn(ns string, role auth.Role) ([]nats.Option, error) {
	c := i.CredsIn(ns, role)
	if c == "" {
		return nil, nil
	}
	return auth.ConnectOptions(c)
}

// Connect opens a NATS connection as role (any identity on an insecure
// stack) in the default namespace, for tools and tests.
func (i Info) Connect(role auth.Role, name string) (*nats.Conn, error) {
	return i.ConnectIn(auth.DefaultNamespace, role, name)
}

// ConnectIn opens a NATS connection as role in namespace ns.
func (i Info) ConnectIn(ns string, role auth.Role, name string) (*nats.Conn, error) {
	opts, err := i.OptionsIn(ns, role)
	if err != nil {
		return nil, err
	}
	return nats.Connect(i.NATSURL, append(opts, nats.Name(name))...)
}

// Dial connects as role with JetStream, as a service would: on a secure
// stack it only binds to the topology (the bootstrap made it).
func (i Info) Dial(ctx context.Context, role auth.Role, name string) (*bus.Conn, error) {
	opts, err := i.Options(role)
	if err != nil {
		return nil, err
	}
	nc, js, err := bus.Open(ctx, i.NATSURL, name, bus.Config{Restricted: i.AuthDir != ""}, opts...)
	if err != nil {
		return nil, err
	}
	return &bus.Conn{NC: nc, JS: js}, nil
}

// StartServer starts a stack's embedded server alone, as Run does: its
// JetStream files in cfg.DataDir, which it claims as Run does (no other
// stack or server may use it meanwhile); cfg.NATSAddr, SyncAlways,
// SyncInterval, LogNATS, Insecure and Namespaces apply. A stack in
// another process uses it with Config.NATSURL and Config.CredsDir (the
// auth directory returned, "" when insecure). stop stops the server and
// gives the data directory back.
func StartServer(cfg Config) (srv *server.Server, authDir string, stop func(), err error) {
	namespaces := cfg.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{auth.DefaultNamespace}
	}
	if cfg.DataDir == "" {
		return nil, "", nil, errors.New("devstack: DataDir is required")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, "", nil, fmt.Errorf("data directory: %w", err)
	}
	release, err := claimDataDir(cfg.DataDir)
	if err != nil {
		return nil, "", nil, err
	}
	started := false
	defer func() {
		if !started {
			release()
		}
	}()
	host, port, err := splitAddr(cmp.Or(cfg.NATSAddr, "127.0.0.1:4222"))
	if err != nil {
		return nil, "", nil, fmt.Errorf("nats address: %w", err)
	}
	ncfg := natsserver.Config{StoreDir: filepath.Join(cfg.DataDir, "jetstream"), Host: host, Port: port,
		SyncAlways: cfg.SyncAlways, SyncInterval: cfg.SyncInterval}
	if port == 0 {
		ncfg.Port = -1
	}
	if cfg.LogNATS {
		ncfg.Logger = natsLogger{cfg.Log.With().Str("service", "nats").Logger()}
	}
	if !cfg.Insecure {
		dir := filepath.Join(cfg.DataDir, AuthDir)
		trust, err := auth.Init(dir, auth.InitConfig{Namespaces: namespaces, Reissue: true, KeepKeys: true})
		if err == nil {
			ncfg.Operator, err = trust.OperatorClaims()
		}
		if err != nil {
			return nil, "", nil, err
		}
		ncfg.SystemAccount, ncfg.Accounts = trust.SystemAccount, trust.Accounts
		authDir = dir
	}
	if srv, err = natsserver.Start(ncfg); err != nil {
		return nil, "", nil, err
	}
	started = true
	return srv, authDir, func() {
		natsserver.Stop(srv)
		release()
	}, nil
}

// Run starts the stack, calls ready once every service is up, and blocks
// until ctx ends; then it stops the services and the server.
func Run(ctx context.Context, cfg Config, ready func(Info)) error {
	url := cfg.NATSURL
	var srv *server.Server
	authDir := ""
	namespaces := cfg.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{auth.DefaultNamespace}
	}
	if !slices.Contains(namespaces, auth.DefaultNamespace) {
		return errors.New("devstack: Namespaces must include the default namespace, which the api serves")
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	// Listening first: a busy address stops the stack before it makes
	// anything.
	reg, metricsURL, stopMetrics, err := serveMetrics(cfg)
	if err != nil {
		return err
	}
	defer stopMetrics()
	if url == "" {
		var stopServer func()
		if srv, authDir, stopServer, err = StartServer(cfg); err != nil {
			return err
		}
		defer stopServer()
		url = srv.ClientURL()
	} else if cfg.CredsDir != "" {
		authDir = cfg.CredsDir
	}
	if authDir == "" && len(namespaces) > 1 {
		return errors.New("devstack: namespaces are NATS accounts: more than the default one needs a secure stack")
	}
	if metricsURL != "" {
		cfg.Log.Info().Str("url", metricsURL).Msg("metrics listening")
	}

	var tokenPath, token string
	if !cfg.Insecure {
		if cfg.DataDir == "" {
			return errors.New("devstack: DataDir is required: it keeps the api's admin token")
		}
		var err error
		if tokenPath, token, err = EnsureAdminToken(filepath.Join(cfg.DataDir, AuthDir)); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", cmp.Or(cfg.HTTPAddr, "127.0.0.1:8080"))
	if err != nil {
		return fmt.Errorf("api address: %w", err)
	}
	info := Info{NATSURL: url, APIURL: "http://" + ln.Addr().String(), Server: srv, AuthDir: authDir,
		AdminToken: token, AdminTokenPath: tokenPath, MetricsURL: metricsURL}
	if authDir != "" {
		info.CredsDir = filepath.Join(authDir, auth.DefaultNamespace)
	}
	if cfg.Restore != "" {
		if err := restore(ctx, info, cfg); err != nil {
			_ = ln.Close()
			return err
		}
	}
	for _, ns := range namespaces {
		if err := bootstrap(ctx, info, ns, cfg); err != nil {
			_ = ln.Close()
			if ctx.Err() != nil {
				return nil // stopped while starting: not an error
			}
			return err
		}
	}
	if srv != nil { // the data directory is this stack's: say where it is
		conn := Conn{API: info.APIURL, NATS: url, PID: os.Getpid()}
		if tokenPath != "" {
			if conn.TokenFile, err = filepath.Abs(tokenPath); err != nil {
				_ = ln.Close()
				return err
			}
		}
		if c := info.Creds(auth.RoleClient); c != "" {
			pub, _, err := auth.CredsUser(c)
			if err != nil {
				_ = ln.Close()
				return err
			}
			if conn.ClientCreds, err = filepath.Abs(c); err != nil {
				_ = ln.Close()
				return err
			}
			conn.ClientInbox = auth.Inbox(pub)
			if conn.AdminCreds, err = filepath.Abs(info.Creds(auth.RoleAdmin)); err != nil {
				_ = ln.Close()
				return err
			}
		}
		if err := writeConn(cfg.DataDir, conn); err != nil {
			_ = ln.Close()
			return err
		}
		defer os.Remove(filepath.Join(cfg.DataDir, ConnFile))
	}

	var topos []*bus.Topology
	for _, ns := range namespaces {
		topo, stopWatch, err := watchTopology(ctx, info, ns, cfg)
		if err != nil {
			_ = ln.Close()
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		defer stopWatch()
		topos = append(topos, topo)
	}
	missing := func() []string {
		var out []string
		for _, t := range topos {
			out = append(out, t.Missing()...)
		}
		slices.Sort(out)
		return slices.Compact(out)
	}

	agentCfg, err := agentConfig(cfg)
	if err != nil {
		_ = ln.Close()
		return err
	}
	if err := ensureExamplesToken(ctx, info, agentCfg.SecretsDir, cfg.Insecure); err != nil {
		_ = ln.Close()
		if ctx.Err() != nil {
			return nil
		}
		return err
	}

	svcCtx, stop := context.WithCancel(ctx)
	defer stop()
	g, gctx := errgroup.WithContext(svcCtx)
	restricted := authDir != ""
	start := func(ns, name string, fn func(context.Context, *bus.Conn) error) {
		g.Go(func() error {
			opts, err := info.OptionsIn(ns, auth.Role(name))
			if err != nil {
				if gctx.Err() != nil {
					return nil // stopped while starting: not an error
				}
				return err
			}
			log := cfg.Log.With().Str("service", name).Logger()
			if ns != auth.DefaultNamespace {
				log = log.With().Str("namespace", ns).Logger()
			}
			opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				log.Error().Err(err).Msg("nats")
			}))
			nc, js, err := bus.Open(gctx, url, "jetflow-"+name, bus.Config{Replicas: cfg.Replicas, Restricted: restricted,
				RequestTimeout: bus.ServiceRequestTimeout, OnRetry: func(err error) {
					log.Warn().Err(err).Msg("waiting for jetstream")
				}}, opts...)
			if err != nil {
				if gctx.Err() != nil {
					return nil // stopped while starting: not an error
				}
				return fmt.Errorf("%s: %w", name, err)
			}
			defer drain(nc, log)
			conn := &bus.Conn{NC: nc, JS: js}
			if err := fn(gctx, conn); err != nil && gctx.Err() == nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		})
	}
	for _, ns := range namespaces {
		log := func(name string) zerolog.Logger {
			l := cfg.Log.With().Str("service", name).Logger()
			if ns != auth.DefaultNamespace {
				l = l.With().Str("namespace", ns).Logger()
			}
			return l
		}
		m, err := newServiceMetrics(reg, ns)
		if err != nil {
			_ = ln.Close()
			return err
		}
		start(ns, "dispatcher", func(ctx context.Context, c *bus.Conn) error {
			d, err := dispatch.New(ctx, dispatch.Config{Workers: cfg.Workers, CacheSize: cfg.CacheSize, BulkAfter: cfg.BulkAfter, APIURL: info.APIURL, BindOnly: restricted,
				NoDirectReports: cfg.NoDirectReports, LeaseTTL: cfg.LeaseTTL, Metrics: m.dispatcher, Tracer: cfg.Tracer, LocalHandlers: cfg.LocalHandlers,
				NoTimerNotices: cfg.NoTimerNotices, GroupCommit: cfg.GroupCommit}, c.JS, log("dispatcher"))
			if err != nil {
				return err
			}
			return d.Run(ctx)
		})
		start(ns, "agent", func(ctx context.Context, c *bus.Conn) error {
			ac := agentCfg
			ac.BindOnly, ac.Metrics, ac.Tracer = restricted, m.agent, cfg.Tracer
			a, err := agent.New(ac, c.JS, log("agent"))
			if err != nil {
				return err
			}
			return a.Run(ctx)
		})
		start(ns, "janitor", func(ctx context.Context, c *bus.Conn) error {
			j, err := janitor.New(janitor.Config{Interval: cfg.JanitorInterval, IdleAfter: cfg.IdleAfter, CatchUpEvery: cfg.JanitorCatchUpEvery,
				RetentionDefault: cfg.RetentionDefault, BindOnly: restricted, Registerer: m.janitor}, c.JS, log("janitor"))
			if err != nil {
				return err
			}
			return j.Run(ctx)
		})
	}
	log := func(name string) zerolog.Logger { return cfg.Log.With().Str("service", name).Logger() }
	start(auth.DefaultNamespace, "api", func(ctx context.Context, c *bus.Conn) error {
		if err := applyFiles(ctx, c, cfg.DataDir, cfg.Apply, log("api")); err != nil {
			return err
		}
		if ready != nil {
			ready(info)
		}
		var others []api.Namespace
		for _, ns := range namespaces {
			if ns == auth.DefaultNamespace {
				continue
			}
			opts, err := info.OptionsIn(ns, auth.RoleAPI)
			if err != nil {
				return err
			}
			nc, js, err := bus.Open(ctx, url, "jetflow-api", bus.Config{Replicas: cfg.Replicas, Restricted: restricted,
				RequestTimeout: bus.ServiceRequestTimeout}, opts...)
			if err != nil {
				return fmt.Errorf("api, namespace %s: %w", ns, err)
			}
			defer drain(nc, log("api").With().Str("namespace", ns).Logger())
			others = append(others, api.Namespace{Name: ns, NC: nc, JS: js})
		}
		// The visibility index is kept beside JetStream's files: a restart
		// resumes it instead of feeding it again.
		visibilityDir := ""
		if cfg.DataDir != "" && cfg.VisibilityPostgres == "" {
			visibilityDir = filepath.Join(cfg.DataDir, "visibility")
		}
		return api.Serve(ctx, api.Config{Listener: ln, StartWait: cfg.StartWait, MaxReadModel: cfg.MaxReadModel, BindOnly: restricted, Namespaces: others,
			VisibilityDir: visibilityDir, VisibilityCache: cfg.VisibilityCache, VisibilityPostgres: cfg.VisibilityPostgres, Missing: missing, Auth: api.AuthConfig{Disabled: cfg.Insecure, AdminTokenFile: tokenPath}, Registerer: reg,
			Tracer: cfg.Tracer, ProjectorCoalesce: cfg.ProjectorCoalesce, ProjectorGather: cfg.ProjectorGather}, c.NC, c.JS, log("api"))
	})
	err = g.Wait()
	_ = ln.Close()
	return err
}

// validate checks the services' settings before anything starts: a
// setting out of range stops the stack at once instead of one service
// after the server is up.
func (c Config) validate() error {
	return cmp.Or(
		agent.Config{AckWait: c.TaskAckWait, MaxDeliver: c.MaxDeliver, Concurrency: c.Concurrency, KillGrace: c.KillGrace,
			StartedAfter: c.StartedAfter}.Validate(),
		dispatch.Config{Workers: c.Workers, CacheSize: c.CacheSize, BulkAfter: c.BulkAfter, LeaseTTL: c.LeaseTTL, GroupCommit: c.GroupCommit}.Validate(),
		janitor.Config{Interval: c.JanitorInterval, IdleAfter: c.IdleAfter, CatchUpEvery: c.JanitorCatchUpEvery, RetentionDefault: c.RetentionDefault}.Validate(),
		api.Config{StartWait: c.StartWait, MaxReadModel: c.MaxReadModel, VisibilityCache: c.VisibilityCache, ProjectorCoalesce: c.ProjectorCoalesce,
			ProjectorGather: c.ProjectorGather}.Validate(),
	)
}

// drain drains a service's connection and waits until it is closed, so
// that what its handlers published reaches the server before the stack
// stops it.
func drain(nc *nats.Conn, log zerolog.Logger) {
	if err := svc.Drain(nc, svc.DrainTimeout); err != nil {
		log.Warn().Err(err).Msg("shutdown")
	}
}

// AuthDir is the auth directory's name in the data directory.
const AuthDir = "auth"

// bootstrap makes the topology (streams, buckets, durable consumers) as
// the admin identity, before any service binds to it.
func bootstrap(ctx context.Context, info Info, ns string, cfg Config) error {
	opts, err := info.OptionsIn(ns, auth.RoleAdmin)
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	log := cfg.Log.With().Str("service", "bootstrap").Logger()
	// Open waits for the (possibly still starting) server, saying so, and
	// makes the streams and buckets as it connects (the admin may).
	nc, js, err := bus.Open(ctx, info.NATSURL, "jetflow-bootstrap", bus.Config{Replicas: cfg.Replicas,
		OnRetry: func(err error) { log.Warn().Err(err).Msg("waiting for jetstream") }}, opts...)
	if err != nil {
		return fmt.Errorf("bootstrap: %w", err)
	}
	defer nc.Close()
	for {
		err = bus.Bootstrap(ctx, js, bus.Config{Replicas: cfg.Replicas,
			OnRetry: func(err error) { log.Warn().Err(err).Msg("waiting for jetstream") }},
			bus.Durables{TaskAckWait: cfg.TaskAckWait, MaxDeliver: cfg.MaxDeliver})
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("bootstrap: %w", err)
		}
		// A cluster may still be placing its replicas (no suitable peers
		// yet): try again.
		log.Warn().Err(err).Msg("waiting for jetstream")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// restore restores cfg.Restore into the default namespace as the admin
// identity; the bootstrap then makes what the backup leaves out, the
// projector's consumer among them, which re-projects every read model.
func restore(ctx context.Context, info Info, cfg Config) error {
	if info.Server == nil {
		return errors.New("devstack: Restore needs the embedded server (use jetflow admin restore against another)")
	}
	nc, err := info.Connect(auth.RoleAdmin, "jetflow-restore")
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	defer nc.Close()
	log := cfg.Log.With().Str("service", "restore").Logger()
	r, err := backup.Restore(ctx, nc, cfg.Restore, false, backup.Options{Progress: func(s backup.Snapshot) {
		log.Info().Str("stream", s.Stream).Uint64("messages", s.Messages).Int64("took_ms", s.TookMS).Msg("stream restored")
	}})
	switch {
	case errors.Is(err, backup.ErrRefused):
		return fmt.Errorf("%w (jetflow dev: drop --restore to run on the data of %s, or give a new --data directory)", err, cfg.DataDir)
	case errors.Is(err, backup.ErrPartway):
		return fmt.Errorf("%w: once the cause is fixed, remove %s and run jetflow dev --restore again, or give a new --data directory", err, cfg.DataDir)
	}
	if err != nil {
		return err
	}
	log.Info().Str("backup", cfg.Restore).Str("jetflow_version", r.Manifest.Jetflow).Time("taken_at", r.Manifest.StartedAt).
		Int64("took_ms", r.Took.Milliseconds()).Msg("backup restored; the projector rebuilds the read models")
	return nil
}

// ExamplesTokenSecret is the secret the examples that call the api
// (examples/chain.yaml) send as their bearer token.
const ExamplesTokenSecret = "JETFLOW_API_TOKEN"

// ensureExamplesToken gives the development agent, as the secret
// ExamplesTokenSecret in its secrets directory, an api key that may start
// executions and read (not the admin token: what a workflow's steps may
// do through the api stays small). It is made once and kept with the data.
func ensureExamplesToken(ctx context.Context, info Info, secretsDir string, insecure bool) error {
	if secretsDir == "" {
		return nil
	}
	path := filepath.Join(secretsDir, ExamplesTokenSecret)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	token := "none (the api runs without authentication)"
	if !insecure {
		nc, err := info.Connect(auth.RoleAdmin, "jetflow-dev-keys")
		if err != nil {
			return fmt.Errorf("examples token: %w", err)
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return fmt.Errorf("examples token: %w", err)
		}
		keys, err := access.OpenKeys(ctx, js, access.KeysConfig{})
		if err != nil {
			return fmt.Errorf("examples token: %w", err)
		}
		_, token, err = keys.Create(ctx, access.KeySpec{Name: "jetflow-dev-examples",
			Scopes: []access.Scope{access.ScopeStart, access.ScopeRead}, Namespaces: []string{auth.DefaultNamespace}},
			access.AdminPrincipal("jetflow-dev"))
		if err != nil {
			return fmt.Errorf("examples token: %w", err)
		}
	}
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		return fmt.Errorf("examples token: %w", err)
	}
	return nil
}

// DefaultSecretsEnvPrefix is the prefix of the environment variables
// that are secrets in a development stack.
const DefaultSecretsEnvPrefix = "JETFLOW_SECRET_"

// SecretsDir is the agent's secrets directory of a stack on dataDir.
func SecretsDir(dataDir string) string { return filepath.Join(dataDir, "secrets") }

// agentConfig is the development agent's configuration: exec on unless
// the stack's policy says otherwise, secrets from the data directory and
// the environment.
func agentConfig(cfg Config) (agent.Config, error) {
	policy := agent.Policy{AllowExec: true}
	if cfg.AgentPolicy != nil {
		policy = *cfg.AgentPolicy
	}
	dir := cfg.SecretsDir
	if dir == "" && cfg.DataDir != "" {
		dir = SecretsDir(cfg.DataDir)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return agent.Config{}, fmt.Errorf("secrets directory: %w", err)
		}
	}
	prefix := cmp.Or(cfg.SecretsEnvPrefix, DefaultSecretsEnvPrefix)
	if prefix == "-" {
		prefix = ""
	}
	ac := agent.Config{Name: "dev-agent", AckWait: cfg.TaskAckWait, MaxDeliver: cfg.MaxDeliver,
		Concurrency: cfg.Concurrency, KillGrace: cfg.KillGrace, StartedAfter: cfg.StartedAfter, Handlers: cfg.Handlers, NoDirectReports: cfg.NoDirectReports, DirectWait: cfg.DirectWait,
		Policy: policy, SecretsDir: dir, SecretsEnvPrefix: prefix}
	return ac, ac.Validate()
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

// natsLogger adapts nats-server's printf-style logger to zerolog.
type natsLogger struct{ log zerolog.Logger }

func (l natsLogger) Noticef(format string, v ...any) { l.log.Info().Msgf(format, v...) }
func (l natsLogger) Warnf(format string, v ...any)   { l.log.Warn().Msgf(format, v...) }
func (l natsLogger) Fatalf(format string, v ...any)  { l.log.Error().Msgf(format, v...) }
func (l natsLogger) Errorf(format string, v ...any)  { l.log.Error().Msgf(format, v...) }
func (l natsLogger) Debugf(format string, v ...any)  { l.log.Debug().Msgf(format, v...) }
func (l natsLogger) Tracef(format string, v ...any)  { l.log.Trace().Msgf(format, v...) }
