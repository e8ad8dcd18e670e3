// Package svc holds the flag and environment conventions shared by the
// service programs: every setting is a flag whose default comes from a
// JETFLOW_* environment variable.
package svc

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
)

// DefaultNATSURL is where services look for NATS when told nothing.
const DefaultNATSURL = "nats://127.0.0.1:4222"

// ReplicasRange is the replicas a stream or bucket may have: JetStream
// keeps at most 5.
var ReplicasRange = Range[int]{Min: 1, Max: 5}

// Flags wraps a FlagSet whose defaults come from the environment.
type Flags struct {
	*flag.FlagSet
	getenv func(string) string
	// envErrs are the environment's values that are not of their flag's
	// kind, by flag: Parse reports the first whose flag the command line
	// does not set.
	envErrs []envErr
	// checks are the ranges of IntIn and DurationIn flags, checked by
	// Parse once the values are known.
	checks []func() error
	// wants says, by flag name, what a bad value should have been (what
	// Int, Duration and Bool take), for Parse's errors.
	wants map[string]string
}

// NewFlags returns flags for program name.
func NewFlags(name string, getenv func(string) string) *Flags {
	return &Flags{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), getenv: getenv}
}

// envErr is a bad value of flag's variable.
type envErr struct {
	flag string
	err  error
}

// badEnv records that variable env holds v, which is not what flag name
// takes (why).
func (f *Flags) badEnv(name, env, v, why string) {
	f.envErrs = append(f.envErrs, envErr{flag: name,
		err: fmt.Errorf("%s=%q: %s; it sets -%s (-h says what each flag takes)", env, v, why, name)})
}

func (f *Flags) env(key string) (string, bool) {
	v := f.getenv(key)
	return v, v != ""
}

// String defines a string flag defaulting to $env or def.
func (f *Flags) String(name, env, def, usage string) *string {
	if v, ok := f.env(env); ok {
		def = v
	}
	return f.FlagSet.String(name, def, usage+" (env "+env+")")
}

// Int defines an int flag defaulting to $env or def.
func (f *Flags) Int(name, env string, def int, usage string) *int {
	if v, ok := f.env(env); ok {
		n, err := strconv.Atoi(v)
		switch {
		case errors.Is(err, strconv.ErrRange):
			f.badEnv(name, env, v, tooLarge)
		case err != nil:
			f.badEnv(name, env, v, notInteger)
		}
		def = n
	}
	f.want(name, notInteger)
	return f.FlagSet.Int(name, def, usage+" (env "+env+")")
}

// Duration defines a duration flag defaulting to $env or def.
func (f *Flags) Duration(name, env string, def time.Duration, usage string) *time.Duration {
	if v, ok := f.env(env); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			f.badEnv(name, env, v, notDuration)
		}
		def = d
	}
	f.want(name, notDuration)
	return f.FlagSet.Duration(name, def, usage+" (env "+env+")")
}

// IntIn is Int for a setting whose value must lie in r: Parse reports a
// value outside it, from the command line or the environment, as a
// [*RangeError] naming the flag and the variable. -h shows the range.
func (f *Flags) IntIn(name, env string, def int, r Range[int], usage string) *int {
	p := f.Int(name, env, def, usage+" ("+r.String()+")")
	f.checks = append(f.checks, func() error { return r.Check(flagSetting(name, env), *p) })
	return p
}

// DurationIn is Duration for a setting whose value must lie in r, as
// [Flags.IntIn].
func (f *Flags) DurationIn(name, env string, def time.Duration, r Range[time.Duration], usage string) *time.Duration {
	p := f.Duration(name, env, def, usage+" ("+r.String()+")")
	f.checks = append(f.checks, func() error { return r.Check(flagSetting(name, env), *p) })
	return p
}

// flagSetting names a setting as its program takes it.
func flagSetting(name, env string) string { return "-" + name + " (" + env + ")" }

// Bool defines a boolean flag defaulting to $env (true, false, 1, 0, t, f)
// or def. On the command line, -name alone means true and -name=false
// turns it off.
func (f *Flags) Bool(name, env string, def bool, usage string) *bool {
	if v, ok := f.env(env); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			f.badEnv(name, env, v, notBoolean)
		}
		def = b
	}
	f.want(name, notBoolean)
	return f.FlagSet.Bool(name, def, usage+" (env "+env+")")
}

// List splits a comma-separated flag value into its non-empty items,
// without surrounding spaces (nil for none).
func List(v string) []string {
	var out []string
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// Parse parses args and reports a bad flag first, then a bad
// environment value of a flag the command line does not set (one it sets
// wins over its variable, as over a variable out of range), then a value
// outside the range of its IntIn or DurationIn flag.
func (f *Flags) Parse(args []string) error {
	// The flag package prints the error and the whole usage on a bad
	// flag; only -h asks for the usage. A bad flag is the error alone,
	// with a pointer to -h (the program prints it).
	out := f.FlagSet.Output()
	f.FlagSet.SetOutput(io.Discard)
	err := f.FlagSet.Parse(args)
	f.FlagSet.SetOutput(out)
	if errors.Is(err, flag.ErrHelp) {
		f.FlagSet.Usage()
		return err
	}
	if err != nil {
		return fmt.Errorf("%w (-h lists the flags)", f.explain(err))
	}
	set := map[string]bool{}
	f.FlagSet.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	for _, e := range f.envErrs {
		if !set[e.flag] {
			return e.err
		}
	}
	for _, check := range f.checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// IsSet reports whether flag name was set, on the command line or by its
// variable env (once parsed).
func (f *Flags) IsSet(name, env string) bool {
	set := false
	f.FlagSet.Visit(func(fl *flag.Flag) { set = set || fl.Name == name })
	return set || f.getenv(env) != ""
}

// What a bad value of a kind is told, from the environment or a flag.
const (
	notInteger  = "not an integer"
	tooLarge    = "an integer too large (or too small) for any setting"
	notDuration = "not a duration (e.g. 30s, 500ms)"
	notBoolean  = "not a boolean (true or false)"
)

// want records what flag name's value must be, for explain.
func (f *Flags) want(name, what string) {
	if f.wants == nil {
		f.wants = map[string]string{}
	}
	f.wants[name] = what
}

// explain turns the flag package's "parse error" into what to give, as
// a bad environment value is told: notDuration and the others.
func (f *Flags) explain(err error) error {
	const parse = ": parse error"
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		if meant := f.meant(name); meant != "" {
			return fmt.Errorf("%w: did you mean -%s?", err, meant)
		}
		return err
	}
	if !strings.HasSuffix(msg, parse) {
		return err
	}
	for name, want := range f.wants {
		if strings.Contains(msg, "for flag -"+name+":") || strings.Contains(msg, "for -"+name+":") {
			return errors.New(strings.TrimSuffix(msg, parse) + ": " + want)
		}
	}
	return err
}

// meant is the flag an unknown flag name most likely meant, "" if none
// stands out: the flag its environment variable's name sets (-nats-url
// for -nats, which JETFLOW_NATS_URL sets), else the flag it spells
// without its dashes or with underscores (-groupcommit, -group_commit
// for -group-commit), else the one flag it begins or ends
// (-visibility-cache for -visibility-cache-bytes).
func (f *Flags) meant(name string) string {
	name = strings.TrimPrefix(name, "-") // given as --name
	env := "(env JETFLOW_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_")) + ")"
	bare := func(s string) string { return strings.NewReplacer("-", "", "_", "").Replace(strings.ToLower(s)) }
	var byEnv, bySpelling string
	var byPart []string
	f.FlagSet.VisitAll(func(fl *flag.Flag) {
		switch {
		case strings.HasSuffix(fl.Usage, env):
			byEnv = fl.Name
		case bare(fl.Name) == bare(name):
			bySpelling = fl.Name
		case strings.HasPrefix(fl.Name, name), strings.HasPrefix(name, fl.Name+"-"), strings.HasSuffix(fl.Name, "-"+name):
			byPart = append(byPart, fl.Name)
		}
	})
	switch {
	case byEnv != "":
		return byEnv
	case bySpelling != "":
		return bySpelling
	case len(byPart) == 1:
		return byPart[0]
	}
	return ""
}

// Common are the settings every service has: where NATS is, with which
// identity, and how much to log.
type Common struct {
	NATSURL    *string
	Creds      *string
	CredsDir   *string
	Namespaces *string
	CA         *string
	Replicas   *int
	LogLevel   *string
	LogJSON    *bool
}

// AddCommon defines the common flags.
func (f *Flags) AddCommon() *Common {
	return &Common{
		NATSURL: f.String("nats", "JETFLOW_NATS_URL", DefaultNATSURL, "NATS server URL (several, comma-separated, for a cluster)"),
		Creds: f.String("creds", "JETFLOW_NATS_CREDS", "",
			"NATS credentials file of this service's identity (see jetflow auth init); without it the service connects anonymously and creates the topology itself"),
		CredsDir: f.String("creds-dir", "JETFLOW_NATS_CREDS_DIR", "",
			"an auth directory (jetflow auth init): the service serves every namespace of -namespaces with DIR/<namespace>/<role>.creds (instead of -creds)"),
		Namespaces: f.String("namespaces", "JETFLOW_NAMESPACES", "default",
			"comma-separated namespaces to serve, with -creds-dir (each is a NATS account)"),
		CA: f.String("nats-ca", "JETFLOW_NATS_CA", "",
			"PEM file of the certificate authority that signed the NATS servers' certificates (TLS; empty: the system's roots)"),
		Replicas: f.IntIn("replicas", "JETFLOW_REPLICAS", 1, ReplicasRange,
			"replicas of streams and buckets (3 in a cluster); used when the service creates the topology"),
		LogLevel: f.String("log-level", "JETFLOW_LOG_LEVEL", "info", "log level: debug, info, warn, error"),
		LogJSON:  f.Bool("log-json", "JETFLOW_LOG_JSON", true, "log JSON lines (false: console text)"),
	}
}

// Restricted reports whether the service runs with an identity that may
// not change the topology: it binds to what the bootstrap made.
func (c *Common) Restricted() bool { return *c.Creds != "" || *c.CredsDir != "" }

// ServedNamespaces are the namespaces the service serves, checked: with
// -creds-dir those of -namespaces, otherwise the one its -creds (or the
// anonymous connection) is in, named "default".
func (c *Common) ServedNamespaces() ([]string, error) {
	if *c.CredsDir == "" {
		if *c.Namespaces != auth.DefaultNamespace && *c.Namespaces != "" {
			return nil, fmt.Errorf("-namespaces %s needs -creds-dir: each namespace is an account, with its own identities", *c.Namespaces)
		}
		return []string{auth.DefaultNamespace}, nil
	}
	if *c.Creds != "" {
		return nil, fmt.Errorf("give -creds or -creds-dir, not both")
	}
	var out []string
	for _, ns := range strings.Split(*c.Namespaces, ",") {
		ns = strings.TrimSpace(ns)
		if !auth.ValidNamespace(ns) {
			return nil, fmt.Errorf("-namespaces: %q: %s", ns, auth.NamespaceRule)
		}
		if !slices.Contains(out, ns) {
			out = append(out, ns)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-namespaces is empty")
	}
	return out, nil
}

// Open connects to NATS as the service's identity of role in namespace
// ns (see ServedNamespaces). With credentials it uses the identity's own
// inbox prefix and only connects (the bootstrap made the topology);
// without, it creates whatever is missing. onRetry hears why it still
// waits; onError hears asynchronous errors, such as a permission violation.
func (c *Common) Open(ctx context.Context, ns string, role auth.Role, name string, onRetry, onError func(error), extra ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	opts := slices.Clone(extra)
	if onError != nil {
		opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { onError(err) }))
	}
	if *c.CA != "" {
		opts = append(opts, nats.RootCAs(*c.CA))
	}
	creds := *c.Creds
	if *c.CredsDir != "" {
		creds = filepath.Join(*c.CredsDir, ns, auth.CredsFile(role))
	}
	if creds != "" {
		o, err := auth.ConnectOptions(creds)
		if err != nil {
			return nil, nil, fmt.Errorf("credentials of namespace %s: %w", ns, err)
		}
		opts = append(opts, o...)
	}
	return bus.Open(ctx, *c.NATSURL, name, bus.Config{Replicas: *c.Replicas, OnRetry: onRetry, Restricted: c.Restricted(),
		RequestTimeout: bus.ServiceRequestTimeout}, opts...)
}
