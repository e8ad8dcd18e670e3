package workflow_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/goccy/go-yaml"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/workflow"
)

// TestYAMLReadsBackAsTheSameDefinition: every example, and a definition
// with every kind of value in it, written as YAML and parsed again is the
// same definition (and so has the same digest): what the api and the UI
// show as YAML can be applied as it is.
func TestYAMLReadsBackAsTheSameDefinition(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../../examples/*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	sources := map[string][]byte{"valid": []byte(validYAML), "tricky": []byte(trickyYAML)}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		sources[filepath.Base(f)] = b
	}
	for name, src := range sources {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			def, err := workflow.Parse(src)
			require.NoError(t, err)
			out, err := def.YAML()
			require.NoError(t, err)
			again, err := workflow.Parse(out)
			require.NoError(t, err, "the YAML does not parse:\n%s", out)
			// The same definition: the same JSON, as the api stores it (a
			// number in an input schema may come back as another Go type).
			want, err := json.Marshal(def)
			require.NoError(t, err)
			got, err := json.Marshal(again)
			require.NoError(t, err)
			require.JSONEq(t, string(want), string(got), "the YAML reads back as another definition:\n%s", out)
			d1, err := def.Digest()
			require.NoError(t, err)
			d2, err := again.Digest()
			require.NoError(t, err)
			require.Equal(t, d1, d2)
			// And it is YAML, not JSON: no braces around the whole.
			require.False(t, strings.HasPrefix(strings.TrimSpace(string(out)), "{"), "%s", out)
		})
	}
}

// trickyYAML holds values YAML could read back as others: strings that
// look like numbers, booleans, null or dates, text over lines, quotes,
// expressions, empty values and numbers of every kind.
const trickyYAML = `name: tricky
description: "yes"
retention: "5"
input:
  type: object
  properties:
    n: {type: integer, minimum: 0, maximum: 1.5e3, default: 7}
    "a<<": {type: string, default: "<<"}
    on: {type: string, enum: ["yes", "no", "on", "off", "null", "~", "2026-01-02", "010", "0x1F", "1e3", ""]}
output:
  text: "line one\nline two: ${input.n}\n"
  indented: "  first line indented\nsecond\n"
  trailing: "a \nb"
  blank_lines: "a\n\n\nb\n\n"
  tab: "a\tb"
  unicode: "é ✓ <b>&amp;</b>"
  controls: "a\x01b\x7fc\u0085d\u2028e\u2029f\ufeffg\rh"
  controls_lines: "a\u0085b\nc\u2028d\n"
  colon: "a: b, c #d"
  quote: "it's \"quoted\""
  list: []
  map: {}
  null_value: null
  float: 0.25
  exponent: 1.0e+21
  tiny: 5.0e-324
  tab_first: "\ta\nb"
  lead_keep: "  a\n\n"
  breaks_only: "\n"
  separators: "a\u2028b\u2029c"
  big: 9007199254740993
steps:
  - id: say
    kind: log
    message: |
      multi
        indented
      text
    idempotent: "yes"
    condition: ${input.n > 0}
  - id: sh
    kind: exec
    command: sh
    args: ["-c", "echo '${input.n}' | tr -d '\\n'", "--", "*", "&a", "!tag", "@x", "` + "`" + `y` + "`" + `", "- z", "? q", "%p"]
    env: {A: "true", B: "1"}
    retry: {limit: 3, backoff: {initial: 1s, factor: 2, max: 1m}, jitter: 0.1}
  - id: fan
    kind: parallel
    branches:
      - id: a
        steps: [{id: x, kind: noop}]
      - id: b
        steps: [{id: y, kind: noop, on-error: [{id: z, kind: log, message: oops}]}]
`

// TestYAMLWritesFieldsInTheLanguagesOrder: the workflow's fields come in
// the order of docs/workflow-language.md's workflow fields table, which
// lists every field a Definition has; a step's id and kind come first.
func TestYAMLWritesFieldsInTheLanguagesOrder(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/workflow-language.md")
	require.NoError(t, err)
	var documented []string
	in := false
	for _, line := range strings.Split(string(doc), "\n") {
		switch {
		case line == "## Workflow fields":
			in = true
		case in && strings.HasPrefix(line, "## "):
			in = false
		case in && strings.HasPrefix(line, "| `"):
			name, _, _ := strings.Cut(strings.TrimPrefix(line, "| `"), "`")
			documented = append(documented, name)
		}
	}
	require.Equal(t, documented, workflow.WorkflowFieldOrder, "the order of the workflow fields table of docs/workflow-language.md")
	var fields []string
	for f := range reflect.TypeFor[workflow.Definition]().Fields() {
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
			fields = append(fields, name)
		}
	}
	require.ElementsMatch(t, fields, workflow.WorkflowFieldOrder, "every field of a Definition has its place")

	def, err := workflow.Parse([]byte(`
search_attributes: [input.who]
steps:
  - {message: hi, condition: "${true}", kind: log, id: greet, retry: {limit: 2}}
lock: gate
input: {type: object, properties: {who: {type: string}}}
name: ordered
`))
	require.NoError(t, err)
	out, err := def.YAML()
	require.NoError(t, err)
	var top yaml.MapSlice
	require.NoError(t, yaml.Unmarshal(out, &top))
	var keys []string
	for _, it := range top {
		keys = append(keys, it.Key.(string))
	}
	require.Equal(t, []string{"name", "input", "steps", "lock", "search_attributes"}, keys, "%s", out)
	var parsed struct {
		Steps []yaml.MapSlice `yaml:"steps"`
	}
	require.NoError(t, yaml.Unmarshal(out, &parsed))
	require.Len(t, parsed.Steps, 1)
	keys = nil
	for _, it := range parsed.Steps[0] {
		keys = append(keys, it.Key.(string))
	}
	require.Equal(t, []string{"id", "kind", "condition", "message", "retry"}, keys, "%s", out)
}

// TestYAMLQuotesWhatOtherReadersReadAsAnotherType: a string that a YAML
// 1.1 reader would take for a boolean, a number or a time is quoted.
func TestYAMLQuotesWhatOtherReadersReadAsAnotherType(t *testing.T) {
	t.Parallel()
	def, err := workflow.Parse([]byte(`
name: quoted
steps:
  - {id: a, kind: exec, command: x, args: ["yes", "Off", "1e3", "0x1F", "2026-01-02", "1.5", "7d", "30s", "plain text"]}
`))
	require.NoError(t, err)
	out, err := def.YAML()
	require.NoError(t, err)
	for _, q := range []string{`"yes"`, `"Off"`, `"1e3"`, `"0x1F"`, `"2026-01-02"`, `"1.5"`, "- 30s\n", "- plain text\n"} {
		require.Contains(t, string(out), q)
	}
}

// FuzzYAMLKeepsText: any text in a definition's free-text field, written
// as YAML, reads back as the same text.
func FuzzYAMLKeepsText(f *testing.F) {
	for _, s := range []string{"", "yes", "a: b", "- x", "? q", "#c", "  lead", "trail ", "a\nb", "a\n\n", "\t", "\x00", "\u0085", "é", "${x}", `"'`, "0x1F", "~", "null", "[a]", "{a: 1}", "&a", "*a", "!t", "|", ">", "%", "@", "`", "\n", "\na", " \n", "...0", "--- x", "a<<", "\ta\nb", " a\n\n", "\n\n", "a\u2028b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			t.Skip("definitions are UTF-8")
		}
		def := workflow.Definition{Name: "fuzz", Description: s, Steps: []workflow.Step{{ID: "a", Kind: workflow.KindNoop, Description: s}},
			Input: map[string]any{"type": "object", "properties": map[string]any{s: map[string]any{"type": "string", "default": s}}}}
		if def.Validate() != nil {
			// The text itself is refused (too long, a property name the
			// input schema refuses...): there is nothing to keep.
			t.Skip("the definition is invalid before it is written as YAML")
		}
		out, err := def.YAML()
		require.NoError(t, err)
		if len(out) > workflow.MaxSize {
			// The text is four times in the YAML, escaped: a valid
			// definition can be written longer than Parse reads.
			t.Skip("the YAML is longer than a definition may be")
		}
		// A valid definition written as YAML must parse back, valid, to
		// the same text: any problem, of decoding or validation, is the
		// writer's.
		again, err := workflow.Parse(out)
		require.NoError(t, err, "%q:\n%s", s, out)
		require.Equal(t, s, again.Description, "%q:\n%s", s, out)
		require.Len(t, again.Steps, 1)
		require.Equal(t, s, again.Steps[0].Description, "%q:\n%s", s, out)
		require.Equal(t, def.Input, again.Input, "a key %q:\n%s", s, out)
	})
}

// TestExamplesQuotedInTheDocsAreAsInTheirFiles: a YAML block of the docs
// whose first line names an example file ("# examples/hello.yaml") holds
// that file's definition as it is (its leading comments aside): a quote
// that drifted from the file showed a new user a step the example no
// longer has.
func TestExamplesQuotedInTheDocsAreAsInTheirFiles(t *testing.T) {
	t.Parallel()
	docs, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	docs = append(docs, "../../README.md")
	quoted := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		require.NoError(t, err)
		blocks := strings.Split(string(b), "```yaml\n")
		for _, block := range blocks[1:] {
			body, _, ok := strings.Cut(block, "```")
			require.True(t, ok, "%s: a yaml block is not closed", doc)
			first, rest, _ := strings.Cut(body, "\n")
			file, ok := strings.CutPrefix(first, "# examples/")
			if !ok {
				continue
			}
			quoted++
			src, err := os.ReadFile(filepath.Join("../../examples", file))
			require.NoError(t, err, "%s quotes examples/%s", doc, file)
			var lines []string
			for _, l := range strings.SplitAfter(string(src), "\n") {
				if len(lines) == 0 && strings.HasPrefix(l, "#") {
					continue // the file's leading comments
				}
				lines = append(lines, l)
			}
			require.Equal(t, strings.Join(lines, ""), rest, "%s quotes examples/%s otherwise than it is", doc, file)
		}
	}
	require.NotZero(t, quoted, "no example quoted: the test looks at nothing")
}
