package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"jetflow.dev/pkg/expression"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/redact"
	"jetflow.dev/pkg/workflow"
)

// ErrSecretMissing is matched (errors.Is) by the failure of an operation
// that references a secret the agent does not have: the operation did not
// run, and the failure is final. The error names the secret, never a value.
var ErrSecretMissing = errors.New("agent: secret not available")

// missingSecret says which secret is missing and where it was looked for.
type missingSecret struct{ msg string }

func (e *missingSecret) Error() string        { return e.msg }
func (e *missingSecret) Is(target error) bool { return target == ErrSecretMissing }

func errMissing(format string, args ...any) error {
	return &missingSecret{msg: fmt.Sprintf(format, args...)}
}

// MaxSecretSize is the largest secret file an agent reads.
const MaxSecretSize = 64 << 10

var envPrefixRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// secretStore reads secrets when a task needs them: from files in a
// directory (the file NAME holds ${secret.NAME}), then from environment
// variables <prefix>NAME. Nothing is cached, so a rotated secret counts
// from the next task on.
type secretStore struct {
	dir       string
	envPrefix string
	lookupEnv func(string) (string, bool)
}

func (s secretStore) configured() bool { return s.dir != "" || s.envPrefix != "" }

// validate checks the store's settings: the directory must exist.
func (s secretStore) validate() error {
	if s.envPrefix != "" && !envPrefixRe.MatchString(s.envPrefix) {
		return fmt.Errorf("agent: secrets environment prefix %q: letters, digits and '_', not starting with a digit", s.envPrefix)
	}
	if s.dir == "" {
		return nil
	}
	st, err := os.Stat(s.dir)
	if err != nil {
		return fmt.Errorf("agent: secrets directory: %w", err)
	}
	if !st.IsDir() {
		return fmt.Errorf("agent: secrets directory %s is not a directory", s.dir)
	}
	return nil
}

// lookup returns the secret name.
func (s secretStore) lookup(name string) (string, error) {
	if !expression.ValidSecretName(name) {
		return "", errMissing("%q is not a secret name", name)
	}
	if !s.configured() {
		return "", errMissing("secret %q is referenced, but this agent has no secrets (its operator gives it -secrets-dir or -secrets-env-prefix)", name)
	}
	if s.dir != "" {
		v, err := readSecretFile(filepath.Join(s.dir, name))
		if err == nil {
			return v, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("read secret %q: %w", name, err)
		}
	}
	if s.envPrefix != "" {
		if v, ok := s.lookupEnv(s.envPrefix + name); ok {
			return v, nil
		}
	}
	var where []string
	if s.dir != "" {
		where = append(where, "no file "+name+" in its secrets directory")
	}
	if s.envPrefix != "" {
		where = append(where, "no environment variable "+s.envPrefix+name)
	}
	return "", errMissing("secret %q is not configured on this agent (%s)", name, strings.Join(where, ", "))
}

// readSecretFile reads a secret file, without one trailing newline (as
// `echo value > file` leaves).
func readSecretFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", errors.New("not a regular file")
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSecretSize+1))
	if err != nil {
		return "", err
	}
	if len(b) > MaxSecretSize {
		return "", fmt.Errorf("larger than %d bytes", MaxSecretSize)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	return string(b), nil
}

// resolveSpec returns a task's spec with its secret references resolved
// (the templates of its secret_refs put in their fields, and secret_refs
// removed), and the Replacer that hides the values it used in what the
// operation reports. A spec without secret_refs is returned as it is,
// with a nil Replacer.
func (s secretStore) resolveSpec(spec json.RawMessage) (json.RawMessage, *redact.Replacer, error) {
	var refs struct {
		SecretRefs map[string]string `json:"secret_refs"`
	}
	if len(spec) == 0 || json.Unmarshal(spec, &refs) != nil || len(refs.SecretRefs) == 0 {
		return spec, nil, nil
	}
	d := json.NewDecoder(bytes.NewReader(spec))
	d.UseNumber()
	var doc map[string]any
	if err := d.Decode(&doc); err != nil {
		return nil, nil, fmt.Errorf("decode task spec: %w", err)
	}
	used := map[string]string{} // value -> mask
	for _, ptr := range slices.Sorted(maps.Keys(refs.SecretRefs)) {
		text, err := expression.ResolveSecrets(refs.SecretRefs[ptr], func(name string) (string, error) {
			v, err := s.lookup(name)
			if err == nil {
				used[v] = "[secret " + name + "]"
			}
			return v, err
		})
		if err != nil {
			return nil, nil, err
		}
		if err := setPointer(doc, ptr, text); err != nil {
			return nil, nil, err
		}
	}
	delete(doc, "secret_refs")
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(doc); err != nil {
		return nil, nil, fmt.Errorf("encode task spec: %w", err)
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), redact.New(used), nil
}

// setPointer sets the string at a JSON pointer (RFC 6901) of doc; the
// member or item must exist.
func setPointer(doc map[string]any, ptr, value string) error {
	if !strings.HasPrefix(ptr, "/") {
		return fmt.Errorf("secret reference at %q: not a field of the step", ptr)
	}
	toks := strings.Split(ptr[1:], "/")
	var cur any = doc
	for i, tok := range toks {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		last := i == len(toks)-1
		switch c := cur.(type) {
		case map[string]any:
			if _, ok := c[tok]; !ok {
				return fmt.Errorf("secret reference at %q: the step has no such field", ptr)
			}
			if last {
				c[tok] = value
				return nil
			}
			cur = c[tok]
		case []any:
			n, err := strconv.Atoi(tok)
			if err != nil || n < 0 || n >= len(c) {
				return fmt.Errorf("secret reference at %q: the step has no such item", ptr)
			}
			if last {
				c[n] = value
				return nil
			}
			cur = c[n]
		default:
			return fmt.Errorf("secret reference at %q: the step has no such field", ptr)
		}
	}
	return nil
}

// redactOutput hides the values r knows in an operation's output: the
// text of the built-in outputs cut at their size limit also loses the
// beginning of a value cut off there.
func redactOutput(r *redact.Replacer, out any) (any, error) {
	if r == nil || out == nil {
		return out, nil
	}
	switch o := out.(type) {
	case ExecOutput:
		if o.Truncated {
			o.Stdout, o.Stderr = r.Tail(o.Stdout), r.Tail(o.Stderr)
		}
		out = o
	case HTTPOutput:
		if o.Truncated {
			o.Body = r.Tail(o.Body)
		}
		out = o
	}
	raw, err := operation.EncodeOutput(out)
	if err != nil {
		return nil, err
	}
	return r.JSON(raw), nil
}

// redactError returns err with the values r knows hidden in its text and,
// for an *operation.Failure, in its output.
func redactError(r *redact.Replacer, err error) error {
	if r == nil || err == nil {
		return err
	}
	msg := errors.New(r.String(err.Error()))
	var f *operation.Failure
	if errors.As(err, &f) {
		out, oerr := redactOutput(r, f.Output)
		if oerr != nil {
			out = nil
		}
		return &operation.Failure{Err: msg, Output: out}
	}
	return msg
}

// stepOf decodes a built-in step's spec for the policy.
func stepOf(spec json.RawMessage) (workflow.Step, error) {
	var s workflow.Step
	if err := json.Unmarshal(spec, &s); err != nil {
		return s, fmt.Errorf("decode task spec: %w", err)
	}
	return s, nil
}
