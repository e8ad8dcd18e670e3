package workflow

import (
	"fmt"
	"strings"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/expression"
	"jetflow.dev/pkg/retention"
)

// Resolve reads a retention: field in the context of the rule and group
// key in force before it (retention.Default and "" at the start of an
// execution): the rule it makes, and the group key its hash renders to
// over env (called only when there is a hash), or prevKey without one.
// It is what the dispatcher records, at the start and when a step with
// the field is entered; the api checks a start with it too.
func (r Retention) Resolve(prev retention.Rule, prevKey string, env func() map[string]any) (*events.Retention, error) {
	spec, err := retention.Parse(string(r))
	if err != nil { // validated when the definition was applied
		return nil, fmt.Errorf("retention: %w", err)
	}
	out := &events.Retention{Rule: spec.Rule.InContext(prev).String(), Key: prevKey}
	if spec.Hash == "" {
		return out, nil
	}
	key, err := expression.RenderString(spec.Hash, env())
	if err != nil {
		return nil, fmt.Errorf("retention hash: %w", err)
	}
	key = strings.TrimSpace(key)
	switch {
	case key == "":
		return nil, fmt.Errorf("retention hash %q gives an empty key", spec.Hash)
	case len(key) > retention.MaxKey:
		return nil, fmt.Errorf("retention hash %q gives a key of %d bytes, at most %d", spec.Hash, len(key), retention.MaxKey)
	}
	out.Key = key
	return out, nil
}
