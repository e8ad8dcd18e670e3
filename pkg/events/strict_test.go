package events_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/events/eventstest"
)

// declaredTypes reads the package's source for every constant of type
// Type, so that a new event type cannot go without a sample.
func declaredTypes(t *testing.T) []events.Type {
	t.Helper()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var out []events.Type
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		require.NoError(t, err)
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Type" {
					continue
				}
				for _, v := range vs.Values {
					lit, ok := v.(*ast.BasicLit)
					require.True(t, ok, "a Type constant that is not a literal in %s", name)
					s, err := strconv.Unquote(lit.Value)
					require.NoError(t, err)
					out = append(out, events.Type(s))
				}
			}
		}
	}
	return out
}

func TestEveryDeclaredTypeHasASample(t *testing.T) {
	t.Parallel()

	declared := declaredTypes(t)
	require.Len(t, declared, 51, "the count of event types changed: add samples for the new ones")
	require.ElementsMatch(t, declared, eventstest.Types())
	for _, typ := range declared {
		require.True(t, strings.HasPrefix(string(typ), "io.jetflow."), typ)
		require.Equal(t, strings.ToLower(string(typ)), string(typ), "types are lower case")
	}
}

// TestSamplesAreFullyPopulated: a member left zero in its sample would
// not show that it survives the round trip (omitempty drops it).
func TestSamplesAreFullyPopulated(t *testing.T) {
	t.Parallel()

	var check func(typ events.Type, v reflect.Value)
	check = func(typ events.Type, v reflect.Value) {
		for i := range v.NumField() {
			f, fv := v.Type().Field(i), v.Field(i)
			if f.Anonymous {
				check(typ, fv)
				continue
			}
			if typ == events.TypeOperationSucceeded && f.Name == "Output" {
				continue // JSON null on purpose
			}
			require.False(t, fv.IsZero(), "%s: %s is zero", typ, f.Name)
		}
	}
	for _, p := range eventstest.Samples() {
		check(p.EventType(), reflect.ValueOf(p).Elem())
	}
}

type probe struct {
	N int            `json:"n"`
	S string         `json:"s"`
	B bool           `json:"b"`
	L []string       `json:"l"`
	M map[string]int `json:"m"`
	O struct {
		X float64 `json:"x"`
	} `json:"o"`
	U uint8 `json:"u"`
	A any   `json:"a"`
}

func TestExplainJSON(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name, data   string
		field, want  string
		strictDecode bool // through DecodeStrictJSON instead of json.Unmarshal
	}{
		{"Number", `{"n":"x"}`, "n", "must be a number, not string", false},
		{"String", `{"s":1}`, "s", "must be a string, not number", false},
		{"Boolean", `{"b":"yes"}`, "b", "must be a boolean, not string", false},
		{"Array", `{"l":{}}`, "l", "must be an array, not object", false},
		{"Object", `{"m":[]}`, "m", "must be an object, not array", false},
		{"NestedMember", `{"o":{"x":true}}`, "o.x", "must be a number, not bool", false},
		{"OutOfRange", `{"u":300}`, "u", "must be a whole number from 0 to 255, not 300", false},
		{"Fraction", `{"n":2.5}`, "n", "must be a whole number, not 2.5", false},
		{"WholeOutOfRange", `{"n":1e30}`, "n", "must be a whole number from -9223372036854775808 to 9223372036854775807, not 1e30", false},
		{"WholeOutOfRangeByOne", `{"n":9223372036854775808}`, "n", "must be a whole number from -9223372036854775808 to 9223372036854775807, not 9223372036854775808", false},
		{"WholeBelowAnUnsignedRange", `{"u":-1}`, "u", "must be a whole number from 0 to 255, not -1", false},
		{"WholeAtTheEndWithAFraction", `{"n":9223372036854775807.0}`, "n", "must be a whole number written as one (9223372036854775807), not 9223372036854775807.0", false},
		{"FractionAtTheEnd", `{"n":9223372036854775806.5}`, "n", "must be a whole number, not 9223372036854775806.5", false},
		{"ExactAsWritten", `{"n":12345678901234567e2}`, "n", "must be a whole number written as one (1234567890123456700), not 12345678901234567e2", false},
		{"MinusZero", `{"u":-0.0}`, "u", "must be a whole number written as one (0), not -0.0", false},
		{"LongFraction", `{"n":2.` + strings.Repeat("0", 1<<20) + `1}`, "n", "must be a whole number, not 2.000000000000000000000000000000... (1048579 characters)", false},
		{"LongWhole", `{"n":` + strings.Repeat("9", 1<<20) + `}`, "n", "must be a whole number from -9223372036854775808 to 9223372036854775807, not 99999999999999999999999999999999... (1048576 characters)", false},
		{"WholeWithAFraction", `{"n":2.0}`, "n", "must be a whole number written as one (2), not 2.0", false},
		{"WholeWithAnExponent", `{"u":1e2}`, "u", "must be a whole number written as one (100), not 1e2", false},
		{"WholeAboveARange", `{"u":3e2}`, "u", "must be a whole number from 0 to 255, not 3e2", false},
		{"WholeDocument", `[1]`, "", "must be a JSON object, not array", false},
		// Placed after the byte at fault by both of encoding/json's
		// implementations (Go 1.26's experimental v2 one placed it at the
		// byte: a build jetflow does not support).
		{"Syntax", `{"n":1,}`, "", "is not valid JSON at byte 8: invalid character '}' looking for beginning of object key string", false},
		{"Truncated", `{"n":`, "", "is not valid JSON at byte 5: unexpected end of JSON input", false},
		{"StrictUnknownMember", `{"n":1,"colour":"red"}`, "colour", `unknown member "colour"`, true},
		{"StrictTrailingValue", `{"n":1} {"n":2}`, "", "has data after the JSON value", true},
		{"StrictTrailingGarbage", `{"n":1} x`, "", "has data after the JSON value", true},
		{"StrictTrailingBracket", `{"n":1}]`, "", "has data after the JSON value", true},
		{"StrictTrailingBrace", `{"n":1}}`, "", "has data after the JSON value", true},
		{"StrictTrailingBracketThenMore", "{\"n\":1} ]x", "", "has data after the JSON value", true},
		{"StrictTruncated", `{"n":1`, "", "is not valid JSON at byte 6: unexpected end of JSON input", true},
		{"StrictCutInAString", `{"n":1,"s":"ab`, "", "is not valid JSON at byte 14: unexpected end of JSON input", true},
		{"StrictEmpty", ``, "", "is empty (no JSON value)", true},
		{"StrictBlank", " \n\t", "", "is empty (no JSON value)", true},
		{"StrictWrongType", `{"s":true}`, "s", "must be a string, not bool", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			eventstest.SkipOtherJSON(t, tc.name)
			var p probe
			var err error
			if tc.strictDecode {
				err = events.DecodeStrictJSON([]byte(tc.data), &p)
			} else {
				err = json.Unmarshal([]byte(tc.data), &p)
			}
			require.Error(t, err)
			field, msg := events.ExplainJSON(err)
			require.Equal(t, tc.field, field)
			require.Equal(t, tc.want, msg)
			require.NotContains(t, msg, "Go ", "no Go type names")
			require.NotContains(t, msg, "events_test", "no Go type names")
		})
	}

	t.Run("StrictAcceptsOneValue", func(t *testing.T) {
		t.Parallel()

		var p probe
		require.NoError(t, events.DecodeStrictJSON([]byte(" {\"n\":1,\"a\":{\"any\":[1]}} \n"), &p))
		require.Equal(t, 1, p.N)
		require.Equal(t, map[string]any{"any": []any{float64(1)}}, p.A)
	})
}

func TestStrictData(t *testing.T) {
	t.Parallel()

	ev := func(typ events.Type, raw string) events.Event {
		return events.Event{ID: "e1", Type: typ, Source: "s", Raw: json.RawMessage(raw)}
	}
	require.NoError(t, events.StrictData(ev(events.TypeSignalExecution, `{"execution_id":"x1","name":"go","data":{"free":"form"}}`)))
	require.NoError(t, events.StrictData(ev(events.TypeReconcileExecution, "")), "no data")
	require.NoError(t, events.StrictData(ev(events.TypeReconcileExecution, " \n")), "no data")

	//nolint:misspell // the misspelt member is what this checks
	err := events.StrictData(ev(events.TypeSignalExecution, `{"execution_id":"x1","nmae":"go"}`))
	require.Error(t, err)
	field, msg := events.ExplainJSON(err)
	require.Equal(t, "nmae", field)                //nolint:misspell // as above
	require.Equal(t, `unknown member "nmae"`, msg) //nolint:misspell // as above

	err = events.StrictData(ev(events.TypeExecutionAction, `{"execution_id":"x1","action":"cancel"} {}`))
	_, msg = events.ExplainJSON(err)
	require.Equal(t, "has data after the JSON value", msg)

	err = events.StrictData(ev("io.jetflow.step.paused", `{}`))
	require.ErrorIs(t, err, events.ErrUnknownType)
	require.Contains(t, err.Error(), "io.jetflow.step.paused")

	// Every known type accepts its own sample, strictly.
	for _, p := range eventstest.Samples() {
		require.NoError(t, events.StrictData(ev(p.EventType(), mustJSON(t, p))), p.EventType())
	}
}

func TestCommandIDsAndSignalNames(t *testing.T) {
	t.Parallel()

	// Both ids are stored (as Nats-Msg-Id, in histories): pinned.
	key := events.CommandKey("cli/alice", "42")
	require.Equal(t, "cmd-"+shortHash(key), events.CommandMsgID(key))
	require.Equal(t, "s"+shortHash(key), events.SignalID(key))
	require.NotEqual(t, events.SignalID(key), events.SignalID(events.CommandKey("cli/alice", "43")))

	for name, want := range map[string]bool{
		"approve": true, "9": true, "a-b_c": true, strings.Repeat("a", 64): true,
		"": false, "-a": false, "_a": false, "a.b": false, "a b": false, strings.Repeat("a", 65): false, "é": false,
	} {
		require.Equal(t, want, events.ValidSignalName(name), "%q", name)
	}
}

func TestValidAction(t *testing.T) {
	t.Parallel()

	for _, a := range []string{"cancel", "force-cancel", "kill", "resume", "force-resume", "replay", "compensate", "repair"} {
		require.True(t, events.ValidAction(a), a)
	}
	require.Len(t, events.Actions, 8)
	for _, a := range []string{"", "Cancel", "pause", "clear-lock"} {
		require.False(t, events.ValidAction(a), a)
	}
}

func TestResultRef(t *testing.T) {
	t.Parallel()

	ref := events.TaskRef{TaskID: "x1.a.1", ExecutionID: "x1", Workflow: "wf", StepID: "a", Attempt: 1, Token: "t", Agent: "ag", Delivery: 2}
	for _, p := range []events.Payload{
		&events.OperationStarted{TaskRef: ref},
		&events.OperationSucceeded{TaskRef: ref, Output: json.RawMessage(`1`)},
		&events.OperationFailed{TaskRef: ref, Error: "boom"},
	} {
		got, ok := events.ResultRef(p)
		require.True(t, ok, p.EventType())
		require.Equal(t, ref, got)
	}
	for _, p := range []events.Payload{&events.Task{TaskID: "x1.a.1"}, &events.StepStarted{StepID: "a"}} {
		got, ok := events.ResultRef(p)
		require.False(t, ok, p.EventType())
		require.Zero(t, got)
	}
}

func shortHash(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:12])
}
