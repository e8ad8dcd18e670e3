package expression

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// SecretRoot is the root of secret references, ${secret.NAME}. A secret is
// never evaluated by the dispatcher: [RenderSecrets] keeps each reference
// as it is, and the agent that runs the operation replaces it with the
// secret's value from its own store ([ResolveSecrets]), so that the value
// never enters a history, a read model or a log.
const SecretRoot = "secret"

// MaxSecretName is the longest secret name.
const MaxSecretName = 128

var (
	secretNameRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
	// secretRefRe matches an expression that means to reference a secret
	// (its name is checked apart, for a clearer message); one that does
	// more (secret.a + "x") is an expression, refused as such.
	secretRefRe = regexp.MustCompile(`^secret\s*\.\s*([A-Za-z0-9_.-]*)$`)
)

// Errors about secret references, wrapped in an [*Error] naming the
// expression.
var (
	// ErrSecretNotAllowed is a secret referenced in a field the dispatcher
	// evaluates (a condition, a variable, a log message, an output...).
	ErrSecretNotAllowed = errors.New("a secret can be referenced only in the fields of an operation that the agent receives: " +
		"the args, env and dir of an exec step, the url, headers and body of an http step, the input of a call step")
	// ErrSecretInExpression is a secret used inside an expression instead
	// of alone: the dispatcher never sees its value, so it cannot compute
	// with it.
	ErrSecretInExpression = errors.New("a secret is referenced alone, as ${secret.NAME} (text may surround it); " +
		"it cannot be part of an expression: the dispatcher never sees its value")
	// ErrSecretName is a reference whose name is not a valid secret name.
	ErrSecretName = errors.New("a secret name holds only letters, digits, '_' and '-' (at most 128)")
	// ErrSecretTemplate is an agent's template that is not well formed.
	ErrSecretTemplate = errors.New("expression: malformed secret template")
)

// ValidSecretName reports whether name can name a secret: letters,
// digits, '_' and '-', at most [MaxSecretName] characters. It is also the
// name of a file in an agent's secrets directory, so it holds no '/' nor '.'.
func ValidSecretName(name string) bool { return secretNameRe.MatchString(name) }

// secretRef reports whether code (a trimmed expression) is a secret
// reference, ${secret.NAME}; err is set when it is one with a bad name.
func secretRef(code string) (name string, ok bool, err error) {
	m := secretRefRe.FindStringSubmatch(code)
	if m == nil {
		return "", false, nil
	}
	if !ValidSecretName(m[1]) {
		return m[1], true, &Error{Expr: code, Err: fmt.Errorf("%w; %q is not one", ErrSecretName, m[1])}
	}
	return m[1], true, nil
}

// checkSecretUse explains why code, which does not compile with roots,
// fails: when it would compile with the secret root it is a misplaced
// secret; otherwise err is returned as it is.
func checkSecretUse(code string, roots []string, err error, why error) error {
	if slices.Contains(roots, SecretRoot) {
		return err
	}
	if _, e := program(code, append(slices.Clone(roots), SecretRoot)); e == nil {
		return &Error{Expr: code, Err: why}
	}
	return err
}

// withoutSecret returns roots less the secret root, and whether it was there.
func withoutSecret(roots []string) ([]string, bool) {
	if !slices.Contains(roots, SecretRoot) {
		return roots, false
	}
	return slices.DeleteFunc(slices.Clone(roots), func(r string) bool { return r == SecretRoot }), true
}

// HasSecrets reports whether any string in v references a secret.
func HasSecrets(v any) bool {
	found := false
	_ = walkStrings(v, func(s string) error {
		if !strings.Contains(s, "${") {
			return nil
		}
		parts, err := split(s)
		if err != nil {
			return nil
		}
		for _, p := range parts {
			if _, ok, _ := secretRef(p.text); ok && p.expr {
				found = true
			}
		}
		return nil
	})
	return found
}

// RenderSecrets is [Render] for the fields of an operation, where secrets
// may be referenced. Each ${secret.NAME} is kept in the result as that
// text, for people to read; and for each string of the result that holds
// references, templates gets, under the string's JSON pointer relative to v
// ("" for v itself), the template the agent resolves with
// [ResolveSecrets]: the same text with every other '$' doubled, so that
// text that came from the input, variables or steps can never read as a
// reference. A string holding references is always text, even when it is
// one reference alone. templates is nil when v references no secret.
func RenderSecrets(v any, env map[string]any) (out any, templates map[string]string, err error) {
	templates = map[string]string{}
	out, err = renderSecrets(v, env, "", templates)
	if err != nil {
		return nil, nil, err
	}
	if len(templates) == 0 {
		templates = nil
	}
	return out, templates, nil
}

func renderSecrets(v any, env map[string]any, ptr string, templates map[string]string) (any, error) {
	switch t := v.(type) {
	case string:
		text, tmpl, refs, err := renderSecretString(t, env)
		if err != nil {
			return nil, err
		}
		if !refs {
			return renderString(t, env)
		}
		templates[ptr] = tmpl
		return text, nil
	case map[string]any:
		out := make(map[string]any, len(t))
		for _, k := range slices.Sorted(maps.Keys(t)) {
			r, err := renderSecrets(t[k], env, ptr+"/"+PointerToken(k), templates)
			if err != nil {
				return nil, err
			}
			out[k] = r
		}
		return out, nil
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			r, err := renderSecrets(e, env, ptr+"/"+strconv.Itoa(i), templates)
			if err != nil {
				return nil, err
			}
			out[i] = r
		}
		return out, nil
	}
	return v, nil
}

// RenderSecretString renders a text field of an operation: its text (with
// each secret reference kept as ${secret.NAME}) and, when it references a
// secret, the agent's template (see [RenderSecrets]); tmpl is "" when it
// references none.
func RenderSecretString(s string, env map[string]any) (text, tmpl string, err error) {
	text, tmpl, refs, err := renderSecretString(s, env)
	if err != nil {
		return "", "", err
	}
	if !refs {
		text, err = RenderString(s, env)
		return text, "", err
	}
	return text, tmpl, nil
}

func renderSecretString(s string, env map[string]any) (txt, tmpl string, refs bool, err error) {
	if !IsTemplate(s) {
		return s, "", false, nil
	}
	parts, err := split(s)
	if err != nil {
		return "", "", false, err
	}
	for _, p := range parts {
		if _, ok, _ := secretRef(p.text); ok && p.expr {
			refs = true
		}
	}
	if !refs {
		return "", "", false, nil
	}
	var b, t strings.Builder
	for _, p := range parts {
		if !p.expr {
			b.WriteString(p.text)
			t.WriteString(strings.ReplaceAll(p.text, "$", "$$"))
			continue
		}
		name, ok, err := secretRef(p.text)
		if err != nil {
			return "", "", false, err
		}
		if ok {
			ref := "${" + SecretRoot + "." + name + "}"
			b.WriteString(ref)
			t.WriteString(ref)
			continue
		}
		v, err := eval(p.text, env)
		if err != nil {
			return "", "", false, err
		}
		b.WriteString(text(v))
		t.WriteString(strings.ReplaceAll(text(v), "$", "$$"))
	}
	return b.String(), t.String(), true, nil
}

// ResolveSecrets returns the text of an agent's template (made by
// [RenderSecrets]) with each ${secret.NAME} replaced by lookup(NAME) and
// each "$$" by "$". Any other '$' makes the template malformed.
func ResolveSecrets(tmpl string, lookup func(name string) (string, error)) (string, error) {
	var b strings.Builder
	err := scanTemplate(tmpl, func(lit string) { b.WriteString(lit) }, func(name string) error {
		v, err := lookup(name)
		if err != nil {
			return err
		}
		b.WriteString(v)
		return nil
	})
	if err != nil {
		return "", err
	}
	return b.String(), nil
}

// TemplateSecrets lists the secrets an agent's template references, in
// order of first use.
func TemplateSecrets(tmpl string) ([]string, error) {
	var names []string
	err := scanTemplate(tmpl, func(string) {}, func(name string) error {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
		return nil
	})
	return names, err
}

func scanTemplate(tmpl string, lit func(string), ref func(string) error) error {
	for i := 0; i < len(tmpl); {
		j := strings.IndexByte(tmpl[i:], '$')
		if j < 0 {
			lit(tmpl[i:])
			return nil
		}
		lit(tmpl[i : i+j])
		i += j
		switch {
		case strings.HasPrefix(tmpl[i:], "$$"):
			lit("$")
			i += 2
		case strings.HasPrefix(tmpl[i:], "${"+SecretRoot+"."):
			end := strings.IndexByte(tmpl[i:], '}')
			if end < 0 {
				return fmt.Errorf("%w: unclosed reference at byte %d", ErrSecretTemplate, i)
			}
			name := tmpl[i+len("${"+SecretRoot+".") : i+end]
			if !ValidSecretName(name) {
				return fmt.Errorf("%w: %q is not a secret name", ErrSecretTemplate, name)
			}
			if err := ref(name); err != nil {
				return err
			}
			i += end + 1
		default:
			return fmt.Errorf("%w: a lone $ at byte %d", ErrSecretTemplate, i)
		}
	}
	return nil
}

// PointerToken escapes a member name for a JSON pointer (RFC 6901).
func PointerToken(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}
