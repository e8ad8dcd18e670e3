// Package svc holds the flag and environment conventions shared by the
// service programs: every setting is a flag whose default comes from a
// JETFLOW_* environment variable.
package svc

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DefaultNATSURL is where services look for NATS when told nothing.
const DefaultNATSURL = "nats://127.0.0.1:4222"

// Flags wraps a FlagSet whose defaults come from the environment.
type Flags struct {
	*flag.FlagSet
	getenv func(string) string
	errs   []error
}

// NewFlags returns flags for program name.
func NewFlags(name string, getenv func(string) string) *Flags {
	return &Flags{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), getenv: getenv}
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
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s=%q: not an integer", env, v))
		}
		def = n
	}
	return f.FlagSet.Int(name, def, usage+" (env "+env+")")
}

// Duration defines a duration flag defaulting to $env or def.
func (f *Flags) Duration(name, env string, def time.Duration, usage string) *time.Duration {
	if v, ok := f.env(env); ok {
		d, err := time.ParseDuration(v)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s=%q: not a duration (e.g. 30s)", env, v))
		}
		def = d
	}
	return f.FlagSet.Duration(name, def, usage+" (env "+env+")")
}

// Bool defines a boolean flag defaulting to $env (true, false, 1, 0, t, f)
// or def. On the command line, -name alone means true and -name=false
// turns it off.
func (f *Flags) Bool(name, env string, def bool, usage string) *bool {
	if v, ok := f.env(env); ok {
		b, err := strconv.ParseBool(v)
		if err != nil {
			f.errs = append(f.errs, fmt.Errorf("%s=%q: not a boolean (true or false)", env, v))
		}
		def = b
	}
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

// Parse parses args and reports bad environment values first.
func (f *Flags) Parse(args []string) error {
	if len(f.errs) > 0 {
		return f.errs[0]
	}
	return f.FlagSet.Parse(args)
}
