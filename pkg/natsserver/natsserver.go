// Package natsserver runs an embedded nats-server with JetStream, for the
// dev binary and for tests. It is the only package that imports the server.
package natsserver

import (
	"cmp"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"

	"jetflow.dev/pkg/auth"
)

// Config configures an embedded server.
type Config struct {
	// StoreDir holds JetStream's file store; it survives restarts. Required.
	StoreDir string
	// Host to listen on. Default 127.0.0.1.
	Host string
	// Port to listen on; -1 picks a free port. Default 4222.
	Port int
	// Name of the server. Default "jetflow".
	Name string
	// DontListen serves only in-process connections.
	DontListen bool
	// Cluster, when set, joins a cluster on ClusterPort with the given routes.
	ClusterName string
	ClusterPort int
	Routes      []string
	// Logger receives the server's log; nil silences it.
	Logger server.Logger
	// ReadyTimeout bounds the wait for the server to accept connections. Default 10s.
	ReadyTimeout time.Duration
	// Operator, when set, runs the server in operator mode: it trusts
	// this operator, knows the accounts (JWTs by public key) and has
	// SystemAccount as its system account; clients must present a user
	// JWT signed by one of the accounts (see package auth).
	Operator      *jwt.OperatorClaims
	SystemAccount string
	Accounts      map[string]string
	// SyncAlways makes JetStream fsync every write before it acknowledges
	// it (sync_interval: always). Default off: the file store writes at
	// once and fsyncs every SyncInterval.
	SyncAlways bool
	// SyncInterval is how often JetStream fsyncs its file store when
	// SyncAlways is off (sync_interval). Default nats-server's (2 min).
	SyncInterval time.Duration
}

// Start starts a server and waits until it accepts connections.
func Start(c Config) (*server.Server, error) {
	if c.StoreDir == "" {
		return nil, fmt.Errorf("natsserver: StoreDir is required")
	}
	opts := &server.Options{
		ServerName: cmp.Or(c.Name, "jetflow"),
		Host:       cmp.Or(c.Host, "127.0.0.1"),
		Port:       cmp.Or(c.Port, 4222),
		DontListen: c.DontListen,
		JetStream:  true,
		StoreDir:   c.StoreDir,
		NoSigs:     true,
		NoLog:      c.Logger == nil,
		// Keep the HTTP monitor off; jetflow's api is the front door.
		HTTPPort:     0,
		SyncAlways:   c.SyncAlways,
		SyncInterval: c.SyncInterval,
	}
	if c.Operator != nil {
		res := &server.MemAccResolver{}
		for pub, accJWT := range c.Accounts {
			if err := res.Store(pub, accJWT); err != nil {
				return nil, fmt.Errorf("natsserver: account %s: %w", pub, err)
			}
		}
		opts.TrustedOperators = []*jwt.OperatorClaims{c.Operator}
		// A user JWT carries its permissions, and clients send it in the
		// CONNECT line: jetflow's roles need more than the default 4 KiB.
		opts.MaxControlLine = auth.MaxControlLine
		opts.AccountResolver = res
		opts.SystemAccount = c.SystemAccount
	}
	if c.ClusterName != "" {
		opts.Cluster = server.ClusterOpts{Name: c.ClusterName, Host: opts.Host, Port: c.ClusterPort}
		for _, r := range c.Routes {
			opts.Routes = append(opts.Routes, server.RoutesFromStr(r)...)
		}
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsserver: new server: %w", err)
	}
	if c.Logger != nil {
		s.SetLoggerV2(c.Logger, false, false, false)
	}
	go s.Start()
	if !s.ReadyForConnections(cmp.Or(c.ReadyTimeout, 10*time.Second)) {
		s.Shutdown()
		return nil, fmt.Errorf("natsserver: not ready for connections (is port %d free?)", opts.Port)
	}
	return s, nil
}

// Stop shuts s down and waits for it.
func Stop(s *server.Server) {
	s.Shutdown()
	s.WaitForShutdown()
}

// LoadConfig reads a nats-server configuration file the way nats-server
// -c does (includes, TLS certificates and operator trust included), so
// that a test can check a deployment's configuration and run a server
// from it.
func LoadConfig(path string) (*server.Options, error) {
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		return nil, fmt.Errorf("natsserver: %w", err)
	}
	return opts, nil
}

// StartOptions starts a server with opts and waits until it accepts
// connections.
func StartOptions(opts *server.Options) (*server.Server, error) {
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natsserver: new server: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("natsserver: not ready for connections")
	}
	return s, nil
}
