package workflow_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/workflow"
)

// yml joins lines into a YAML document: line n of the document is the
// n-th argument, so the lines a problem names can be read off the table.
func yml(lines ...string) string { return strings.Join(lines, "\n") + "\n" }

// wf is a workflow named wf whose steps are the given lines: its first
// step line is line 3.
func wf(stepLines ...string) string {
	return yml(append([]string{"name: wf", "steps:"}, stepLines...)...)
}

// problem is what a validation table expects: the field, the line it is
// on (the closest enclosing line when the field itself is absent) and the
// whole message.
type problem struct {
	field string
	line  int
	msg   string
}

// validationCases are definitions with the exact problems they must be
// refused with, and nothing else. They also seed FuzzParse.
var validationCases = []struct {
	name  string
	input string
	want  []problem
}{
	// Containers: workflow blocks and workflows called by name.
	{
		name: "BlockAndWorkflowName",
		input: wf(
			"  - id: blk",
			"    kind: workflow",
			"    workflow: other",
			"    steps:",
			"      - {id: a, kind: noop}",
		),
		want: []problem{{"steps[0].workflow", 5, "give steps (a block) or workflow (another workflow's name), not both"}},
	},
	{
		name: "BlockWithInput",
		input: wf(
			"  - id: blk",
			"    kind: workflow",
			"    input: {x: 1}",
			"    steps:",
			"      - {id: a, kind: noop}",
		),
		want: []problem{{"steps[0].input", 5, "input and version apply to a workflow called by name, not to a block of steps"}},
	},
	{
		name: "BlockWithVersion", // named under input, which is absent: the step's line
		input: wf(
			"  - id: blk",
			"    kind: workflow",
			"    version: 2",
			"    steps:",
			"      - {id: a, kind: noop}",
		),
		want: []problem{{"steps[0].input", 3, "input and version apply to a workflow called by name, not to a block of steps"}},
	},
	{
		name: "BlockStepProblem",
		input: wf(
			"  - id: blk",
			"    kind: workflow",
			"    steps:",
			"      - id: run",
			"        kind: exec",
		),
		want: []problem{{"steps[0].steps[0].command", 6, "is required for an exec step"}},
	},
	{
		name: "BlockDuplicateIDs", // ids are unique within each list, not across lists
		input: wf(
			"  - id: a",
			"    kind: workflow",
			"    steps:",
			"      - {id: a, kind: noop}",
			"      - {id: a, kind: noop}",
		),
		want: []problem{{"steps[0].steps[1].id", 7, `"a" is already the id of steps[0].steps[0]; step ids must be unique within a list`}},
	},
	{
		name: "CalledWorkflowBadName",
		input: wf(
			"  - id: sub",
			"    kind: workflow",
			"    workflow: my.flow",
		),
		want: []problem{{"steps[0].workflow", 5, `"my.flow" is not a workflow name`}},
	},
	{
		name: "CalledWorkflowNegativeVersion",
		input: wf(
			"  - id: sub",
			"    kind: workflow",
			"    workflow: other",
			"    version: -1",
		),
		want: []problem{{"steps[0].version", 6, "must be 0 (the latest when the step runs) or a version number"}},
	},
	{
		name: "CalledWorkflowBadInput",
		input: wf(
			"  - id: sub",
			"    kind: workflow",
			"    workflow: other",
			"    input:",
			"      host: ${nope.host}",
		),
		want: []problem{{"steps[0].input.host", 7, "expression ${nope.host}: unknown name nope at character 1"}},
	},
	{
		name: "ItemOutsideForeach",
		input: wf(
			"  - id: sub",
			"    kind: workflow",
			"    workflow: other",
			"    input: ${item}",
		),
		want: []problem{{"steps[0].input", 6, "expression ${item}: unknown name item at character 1"}},
	},
	{
		name: "RetentionOnlyStepWithInput",
		input: wf(
			"  - id: keep",
			"    kind: workflow",
			"    retention: 5",
			"    input: {a: 1}",
		),
		want: []problem{{"steps[0].input", 6, "input and version apply to a workflow called by name"}},
	},
	{
		name: "WorkflowStepWithNothing",
		input: wf(
			"  - id: blk",
			"    kind: workflow",
		),
		want: []problem{{"steps[0].steps", 3, "a workflow step needs steps (a block), workflow (another workflow's name) or retention"}},
	},
	// Containers: foreach.
	{
		name: "ForeachWithoutItems",
		input: wf(
			"  - id: each",
			"    kind: foreach",
			"    steps:",
			"      - {id: a, kind: noop}",
		),
		want: []problem{{"steps[0].items", 3, "is required: a list, or an expression giving one"}},
	},
	{
		name: "ForeachBadItems",
		input: wf(
			"  - id: each",
			"    kind: foreach",
			"    items: ${input.hosts +}",
			"    steps:",
			"      - {id: a, kind: noop}",
		),
		want: []problem{{"steps[0].items", 5, "expression ${input.hosts +}: unexpected token EOF at character 13"}},
	},
	{
		name: "ForeachItemsNeverAList",
		input: wf(
			"  - id: each",
			"    kind: foreach",
			"    items: 5",
			"    steps:",
			"      - {id: a, kind: noop}",
			"  - id: text",
			"    kind: foreach",
			"    items: hosts ${input.hosts}",
			"    steps:",
			"      - {id: a, kind: noop}",
		),
		want: []problem{
			{"steps[0].items", 5, "the number 5 is not a list: give a list, or an expression that gives one (${input.hosts})"},
			{"steps[1].items", 10, `the string "hosts ${input.hosts}" gives text, not a list: give a list, or one ${...} alone that gives one (${input.hosts})`},
		},
	},
	{
		name: "ForeachNegativeConcurrency",
		input: wf(
			"  - id: each",
			"    kind: foreach",
			"    items: [a, b]",
			"    concurrency: -2",
			"    steps:",
			"      - {id: a, kind: noop}",
		),
		want: []problem{{"steps[0].concurrency", 6, "must be at least 1 (0 or absent means 1: one item at a time)"}},
	},
	{
		name: "ForeachWithoutSteps",
		input: wf(
			"  - id: each",
			"    kind: foreach",
			"    items: [a, b]",
		),
		want: []problem{{"steps[0].steps", 3, "a foreach step needs steps to run for each item"}},
	},
	{
		name: "ForeachBodyUnknownRoot",
		input: wf(
			"  - id: each",
			"    kind: foreach",
			"    items: [a, b]",
			"    steps:",
			"      - id: say",
			"        kind: log",
			"        message: ${itme}",
		),
		want: []problem{{"steps[0].steps[0].message", 9, "expression ${itme}: unknown name itme at character 1 (did you mean \"item\"?)"}},
	},
	// Containers: parallel.
	{
		name: "ParallelWithoutBranches",
		input: wf(
			"  - id: par",
			"    kind: parallel",
			"    mode: all",
		),
		want: []problem{{"steps[0].branches", 3, "a parallel step needs at least one branch"}},
	},
	{
		name: "ParallelBadMode",
		input: wf(
			"  - id: par",
			"    kind: parallel",
			"    mode: any",
			"    branches:",
			"      - id: a",
			"        steps: [{id: x, kind: noop}]",
		),
		want: []problem{{"steps[0].mode", 5, `"any" is not all or first`}},
	},
	{
		name: "BranchBadID",
		input: wf(
			"  - id: par",
			"    kind: parallel",
			"    branches:",
			"      - id: 9a",
			"        steps: [{id: x, kind: noop}]",
		),
		want: []problem{{"steps[0].branches[0].id", 6, `"9a": ` + events.StepIDRule}},
	},
	{
		name: "BranchWithoutID",
		input: wf(
			"  - id: par",
			"    kind: parallel",
			"    branches:",
			"      - steps: [{id: x, kind: noop}]",
		),
		want: []problem{{"steps[0].branches[0].id", 6, `"": ` + events.StepIDRule}},
	},
	{
		name: "BranchReservedID",
		input: wf(
			"  - id: par",
			"    kind: parallel",
			"    branches:",
			"      - id: on-error2",
			"        steps: [{id: x, kind: noop}]",
		),
		want: []problem{{"steps[0].branches[0].id", 6, `"on-error2" is reserved (on-error steps' paths use it); choose another id`}},
	},
	{
		name: "BranchDuplicateID",
		input: wf(
			"  - id: par",
			"    kind: parallel",
			"    branches:",
			"      - id: a",
			"        steps: [{id: x, kind: noop}]",
			"      - id: a",
			"        steps: [{id: y, kind: noop}]",
		),
		want: []problem{{"steps[0].branches[1].id", 8, `"a" is already the id of another branch`}},
	},
	{
		name: "BranchWithoutSteps",
		input: wf(
			"  - id: par",
			"    kind: parallel",
			"    branches:",
			"      - id: a",
			"        steps: []",
		),
		want: []problem{{"steps[0].branches[0].steps", 7, "a branch needs steps"}},
	},
	{
		name: "BranchStepProblem",
		input: wf(
			"  - id: par",
			"    kind: parallel",
			"    branches:",
			"      - id: a",
			"        steps:",
			"          - id: x",
			"            kind: http",
		),
		want: []problem{{"steps[0].branches[0].steps[0].url", 8, "is required for an http step"}},
	},
	// Containers: switch.
	{
		name: "SwitchWithoutCases",
		input: wf(
			"  - id: sw",
			"    kind: switch",
			"    default: [{id: x, kind: noop}]",
		),
		want: []problem{{"steps[0].cases", 3, "a switch step needs at least one case"}},
	},
	{
		name: "CaseWithoutWhen",
		input: wf(
			"  - id: sw",
			"    kind: switch",
			"    cases:",
			"      - steps: [{id: x, kind: noop}]",
		),
		want: []problem{{"steps[0].cases[0].when", 6, "is required: the condition of this case"}},
	},
	{
		name: "CaseBadWhen",
		input: wf(
			"  - id: sw",
			"    kind: switch",
			"    cases:",
			"      - when: ${input.n >}",
			"        steps: [{id: x, kind: noop}]",
		),
		want: []problem{{"steps[0].cases[0].when", 6, "expression ${input.n >}: unexpected token EOF at character 9"}},
	},
	{
		name: "CaseWithoutSteps",
		input: wf(
			"  - id: sw",
			"    kind: switch",
			"    cases:",
			"      - when: ${true}",
			"        steps: []",
		),
		want: []problem{{"steps[0].cases[0].steps", 7, "a case needs steps"}},
	},
	{
		name: "DefaultStepProblem",
		input: wf(
			"  - id: sw",
			"    kind: switch",
			"    cases:",
			"      - when: ${true}",
			"        steps: [{id: x, kind: noop}]",
			"    default:",
			"      - id: y",
			"        kind: let",
		),
		want: []problem{{"steps[0].default[0].vars", 9, "is required for a let step: the variables to set"}},
	},
	{
		name: "ContainerFieldOnAnOperation",
		input: wf(
			"  - id: a",
			"    kind: noop",
			"    items: [1, 2]",
			"    branches: [{id: b, steps: [{id: x, kind: noop}]}]",
		),
		want: []problem{
			{"steps[0].items", 5, "does not apply to a noop step (only to foreach)"},
			{"steps[0].branches", 6, "does not apply to a noop step (only to parallel)"},
		},
	},
	{
		name: "EightContainersDeep", // seven may nest; the eighth is refused
		input: wf(
			"  - id: l1",
			"    kind: workflow",
			"    steps:",
			"      - id: l2",
			"        kind: workflow",
			"        steps:",
			"          - id: l3",
			"            kind: foreach",
			"            items: [1]",
			"            steps:",
			"              - id: l4",
			"                kind: switch",
			"                cases:",
			"                  - when: ${true}",
			"                    steps:",
			"                      - id: l5",
			"                        kind: parallel",
			"                        branches:",
			"                          - id: b",
			"                            steps:",
			"                              - id: l6",
			"                                kind: workflow",
			"                                steps:",
			"                                  - id: l7",
			"                                    kind: workflow",
			"                                    steps:",
			"                                      - id: l8",
			"                                        kind: workflow",
			"                                        steps: [{id: x, kind: noop}]",
		),
		want: []problem{{"steps[0].steps[0].steps[0].steps[0].cases[0].steps[0].branches[0].steps[0].steps[0].steps[0].kind", 30,
			"containers nest at most 8 deep"}},
	},
	{
		name: "OnErrorCountsAsALevel", // six containers, then a container in on-error
		input: wf(
			"  - id: l1",
			"    kind: workflow",
			"    steps:",
			"      - id: l2",
			"        kind: workflow",
			"        steps:",
			"          - id: l3",
			"            kind: workflow",
			"            steps:",
			"              - id: l4",
			"                kind: workflow",
			"                steps:",
			"                  - id: l5",
			"                    kind: workflow",
			"                    steps:",
			"                      - id: l6",
			"                        kind: workflow",
			"                        steps:",
			"                          - id: x",
			"                            kind: noop",
			"                            on-error:",
			"                              - id: l7",
			"                                kind: workflow",
			"                                steps: [{id: y, kind: noop}]",
		),
		want: []problem{{"steps[0].steps[0].steps[0].steps[0].steps[0].steps[0].steps[0].on-error[0].kind", 25,
			"containers nest at most 8 deep"}},
	},

	// Operations.
	{
		name: "LogUnclosedTemplate",
		input: wf(
			"  - id: a",
			"    kind: log",
			`    message: "hi ${input.x"`,
		),
		want: []problem{{"steps[0].message", 5, "expression: ${ without a closing }"}},
	},
	{
		name: "ExecTemplates",
		input: wf(
			"  - id: a",
			"    kind: exec",
			"    command: ${input.cmd +}",
			"    dir: ${nope}",
			`    args: ["${input.a", ok]`,
			`    env: {X: "${vars.y +}"}`,
		),
		want: []problem{
			{"steps[0].command", 5, "expression ${input.cmd +}: unexpected token EOF at character 11"},
			{"steps[0].dir", 6, "expression ${nope}: unknown name nope at character 1"},
			{"steps[0].args[0]", 7, "expression: ${ without a closing }"},
			{"steps[0].env.X", 8, "expression ${vars.y +}: unexpected token EOF at character 8"},
		},
	},
	{
		name: "HTTPTemplates",
		input: wf(
			"  - id: a",
			"    kind: http",
			"    method: ${input.method}", // a template method is checked when rendered
			"    url: ${input.url +}",
			`    headers: {X-A: "${nope}"}`,
			`    body: {q: "${input.q +}"}`,
		),
		want: []problem{
			{"steps[0].url", 6, "expression ${input.url +}: unexpected token EOF at character 11"},
			{`steps[0].headers["X-A"]`, 7, "expression ${nope}: unknown name nope at character 1"},
			{"steps[0].body.q", 8, "expression ${input.q +}: unexpected token EOF at character 9"},
		},
	},
	{
		name: "CallWithoutOperation",
		input: wf(
			"  - id: a",
			"    kind: call",
			"    input: {x: 1}",
		),
		want: []problem{{"steps[0].operation", 3, "is required for a call step: the name of a custom operation an agent of the queue handles"}},
	},
	{
		name: "CallBadOperation",
		input: wf(
			"  - id: a",
			"    kind: call",
			"    operation: do.it",
		),
		want: []problem{{"steps[0].operation", 5, `"do.it": ` + events.QueueNameRule}},
	},
	{
		name: "CallInputNotJSON",
		input: wf(
			"  - id: a",
			"    kind: call",
			"    operation: do-it",
			"    input: {x: .nan}",
		),
		want: []problem{{"steps[0].input", 6, "cannot be encoded as JSON: json: unsupported value: NaN"}},
	},
	{
		name: "CallInputBadTemplate",
		input: wf(
			"  - id: a",
			"    kind: call",
			"    operation: do-it",
			`    input: {x: "${nope}"}`,
		),
		want: []problem{{"steps[0].input.x", 6, "expression ${nope}: unknown name nope at character 1"}},
	},
	{
		name: "CallTimeoutAndQueue",
		input: wf(
			"  - id: a",
			"    kind: call",
			"    operation: do-it",
			"    queue: gpu/1",
			"    timeout: soon",
		),
		want: []problem{
			{"steps[0].queue", 6, `"gpu/1": ` + events.QueueNameRule},
			{"steps[0].timeout", 7, `"soon" is not a positive duration (e.g. 30s, 5m, 2h)`},
		},
	},

	// The dispatcher's steps: let.
	{
		name: "LetWithoutVars",
		input: wf(
			"  - id: a",
			"    kind: let",
		),
		want: []problem{{"steps[0].vars", 3, "is required for a let step: the variables to set"}},
	},
	{
		name: "LetBadVariableName",
		input: wf(
			"  - id: a",
			"    kind: let",
			"    vars: {9x: 1}",
		),
		want: []problem{{"steps[0].vars", 5, `"9x" is not a variable name (letters, digits and '_', not starting with a digit)`}},
	},
	{
		name: "LetBadTemplate",
		input: wf(
			"  - id: a",
			"    kind: let",
			`    vars: {x: "${input.y +}"}`,
		),
		want: []problem{{"steps[0].vars.x", 5, "expression ${input.y +}: unexpected token EOF at character 9"}},
	},
	{
		name: "LetNotJSON",
		input: wf(
			"  - id: a",
			"    kind: let",
			"    vars: {x: .inf}",
		),
		want: []problem{{"steps[0].vars", 5, "cannot be encoded as JSON: json: unsupported value: +Inf"}},
	},
	{
		name: "LetWithOutput",
		input: wf(
			"  - id: a",
			"    kind: let",
			"    vars: {x: 1}",
			"    output: ${result}",
		),
		want: []problem{{"steps[0].output", 6, "does not apply to a let step (it has no result to map)"}},
	},
	{
		name: "LetWithTimeout",
		input: wf(
			"  - id: a",
			"    kind: let",
			"    vars: {x: 1}",
			"    timeout: 1s",
		),
		want: []problem{{"steps[0].timeout", 6, "does not apply to a let step"}},
	},
	{
		name: "HeartbeatOnHTTP",
		input: wf(
			"  - id: a",
			"    kind: http",
			"    url: http://example.com",
			"    heartbeat: 10s",
		),
		want: []problem{{"steps[0].heartbeat", 6, "does not apply to an http step (only to exec, call)"}},
	},
	{
		name: "HeartbeatBad",
		input: wf(
			"  - id: a",
			"    kind: exec",
			"    command: x",
			"    heartbeat: ${input.t}",
			"  - id: b",
			"    kind: call",
			"    operation: x",
			"    heartbeat: 10ms",
		),
		want: []problem{
			{"steps[0].heartbeat", 6, `"${input.t}": give a literal duration here (e.g. 30s); expressions are allowed only in a sleep's duration and until`},
			{"steps[1].heartbeat", 10, `"10ms" is shorter than 100ms, the shortest heartbeat allowed`},
		},
	},

	// local steps.
	{
		name: "LocalOnExecAndHTTP",
		input: wf(
			"  - id: a",
			"    kind: exec",
			"    command: x",
			"    local: true",
			"  - id: b",
			"    kind: http",
			"    url: http://example.com",
			"    local: true",
		),
		want: []problem{
			{"steps[0].local", 6, "does not apply to an exec step (only to noop, log, call)"},
			{"steps[1].local", 10, "does not apply to an http step (only to noop, log, call)"},
		},
	},
	{
		name: "LocalWithQueueHeartbeatOrNotIdempotent",
		input: wf(
			"  - id: a",
			"    kind: noop",
			"    local: true",
			"    queue: gpu",
			"  - id: b",
			"    kind: call",
			"    operation: x",
			"    local: true",
			"    heartbeat: 1s",
			"  - id: c",
			"    kind: log",
			"    message: hi",
			"    local: true",
			"    idempotent: no",
		),
		want: []problem{
			{"steps[0].queue", 6, "does not go with local: a local step runs in the dispatcher, on no agent queue"},
			{"steps[1].heartbeat", 11, "does not go with local: a local step's handler runs in the dispatcher, bounded by its timeout"},
			{"steps[1].idempotent", 7, "must be yes on a local call step: it runs again when its dispatcher stops before its result is recorded, so its handler must be safe to run twice"},
			{"steps[2].idempotent", 16, "no does not go with local: a local step runs again when its dispatcher stops before its result is recorded"},
		},
	},
	{
		name: "LocalCallWithASecret",
		input: wf(
			"  - id: a",
			"    kind: call",
			"    operation: x",
			"    local: true",
			"    idempotent: yes",
			"    input: {token: '${secret.TOKEN}'}",
			"  - id: b",
			"    kind: call",
			"    operation: x",
			"    local: true",
			"    idempotent: yes",
			`    input: {key: "${ 'x' + secret['API_KEY'] }"}`,
		),
		want: []problem{
			{"steps[0].input", 8, "references a secret: a local step runs in the dispatcher, which holds none (drop local to run it on an agent)"},
			{"steps[1].input", 14, "references a secret: a local step runs in the dispatcher, which holds none (drop local to run it on an agent)"},
		},
	},
	{
		// The secret is said, and the string's other problems too.
		name: "LocalCallWithASecretAndATypo",
		input: wf(
			"  - id: a",
			"    kind: call",
			"    operation: x",
			"    local: true",
			"    idempotent: yes",
			"    input: {x: '${inptu.a} ${secret.X}'}",
		),
		want: []problem{
			{"steps[0].input", 8, "references a secret: a local step runs in the dispatcher, which holds none (drop local to run it on an agent)"},
			{"steps[0].input.x", 8, `expression ${inptu.a}: unknown name inptu at character 1 (did you mean "input"?)`},
		},
	},

	// sleep.
	{
		name: "SleepWithNeither",
		input: wf(
			"  - id: a",
			"    kind: sleep",
		),
		want: []problem{{"steps[0].duration", 3, "a sleep step needs either duration (e.g. 10s) or until (an RFC 3339 time)"}},
	},
	{
		name: "SleepWithBoth",
		input: wf(
			"  - id: a",
			"    kind: sleep",
			"    duration: 1s",
			"    until: 2026-12-24T18:00:00Z",
		),
		want: []problem{{"steps[0].duration", 5, "a sleep step needs either duration (e.g. 10s) or until (an RFC 3339 time)"}},
	},
	{
		name: "SleepBadDurationTemplate",
		input: wf(
			"  - id: a",
			"    kind: sleep",
			"    duration: ${input.d +}",
		),
		want: []problem{{"steps[0].duration", 5, "expression ${input.d +}: unexpected token EOF at character 9"}},
	},
	{
		name: "SleepDurationWithDays",
		input: wf(
			"  - id: a",
			"    kind: sleep",
			"    duration: 1 day",
		),
		want: []problem{{"steps[0].duration", 5, `"1 day" is not a positive duration (e.g. 30s, 5m, 2h)`}},
	},
	{
		name: "SleepZeroDuration",
		input: wf(
			"  - id: a",
			"    kind: sleep",
			"    duration: 0s",
		),
		want: []problem{{"steps[0].duration", 5, `"0s" is not a positive duration (e.g. 30s, 5m, 2h)`}},
	},
	{
		name: "SleepBadUntilTemplate",
		input: wf(
			"  - id: a",
			"    kind: sleep",
			"    until: ${nope}",
		),
		want: []problem{{"steps[0].until", 5, "expression ${nope}: unknown name nope at character 1"}},
	},
	{
		name: "SleepUntilNotATime",
		input: wf(
			"  - id: a",
			"    kind: sleep",
			"    until: tomorrow",
		),
		want: []problem{{"steps[0].until", 5, `"tomorrow" is not an RFC 3339 time (e.g. 2026-12-24T18:00:00Z)`}},
	},
	{
		name: "SleepUntilADate",
		input: wf(
			"  - id: a",
			"    kind: sleep",
			"    until: 2026-12-24",
		),
		want: []problem{{"steps[0].until", 5, `"2026-12-24" is not an RFC 3339 time (e.g. 2026-12-24T18:00:00Z)`}},
	},
	{
		name: "SleepWithOutput",
		input: wf(
			"  - id: a",
			"    kind: sleep",
			"    duration: 1s",
			"    output: done",
		),
		want: []problem{{"steps[0].output", 6, "does not apply to a sleep step (it has no result to map)"}},
	},

	// wait.
	{
		name: "WaitSignalAndSignals",
		input: wf(
			"  - id: a",
			"    kind: wait",
			"    signal: go",
			"    signals: [stop]",
		),
		want: []problem{{"steps[0].signals", 6, "give signal or signals, not both"}},
	},
	{
		name: "WaitWithoutSignal",
		input: wf(
			"  - id: a",
			"    kind: wait",
			"    timeout: 1m",
		),
		want: []problem{{"steps[0].signal", 3, "is required for a wait step: the name of the signal to wait for"}},
	},
	{
		name: "WaitBadSignalName",
		input: wf(
			"  - id: a",
			"    kind: wait",
			"    signal: no way",
		),
		want: []problem{{"steps[0].signal", 5, `"no way" is not a signal name (letters, digits, '-' and '_')`}},
	},
	{
		name: "WaitBadNameInSignals",
		input: wf(
			"  - id: a",
			"    kind: wait",
			`    signals: [ok, "no way"]`,
		),
		want: []problem{{"steps[0].signals", 5, `"no way" is not a signal name (letters, digits, '-' and '_')`}},
	},
	{
		name: "WaitBadMatch",
		input: wf(
			"  - id: a",
			"    kind: wait",
			"    signal: go",
			"    match: ${sig.data}",
		),
		want: []problem{{"steps[0].match", 6, "expression ${sig.data}: unknown name sig at character 1"}},
	},
	{
		name: "WaitTimeoutTemplate",
		input: wf(
			"  - id: a",
			"    kind: wait",
			"    signal: go",
			"    timeout: ${input.t}",
		),
		want: []problem{{"steps[0].timeout", 6,
			`"${input.t}": give a literal duration here (e.g. 30s); expressions are allowed only in a sleep's duration and until`}},
	},
	{
		name: "WaitWithRetry",
		input: wf(
			"  - id: a",
			"    kind: wait",
			"    signal: go",
			"    retry: {limit: 2}",
		),
		want: []problem{{"steps[0].retry", 6, "does not apply to a wait step"}},
	},

	// fail and return.
	{
		name: "FailBadTemplate",
		input: wf(
			"  - id: a",
			"    kind: fail",
			"    message: ${nope}",
		),
		want: []problem{{"steps[0].message", 5, "expression ${nope}: unknown name nope at character 1"}},
	},
	{
		// A block scalar's expression, shown on one line with its line
		// breaks as spaces: the character counts in what is shown.
		name: "MultiLineTemplate",
		input: wf(
			"  - id: a",
			"    kind: fail",
			"    message: |",
			"      ${input.a +",
			"          nope}",
		),
		want: []problem{{"steps[0].message", 7, "expression ${input.a +     nope}: unknown name nope at character 15"}},
	},
	{
		name: "FailWithOutput",
		input: wf(
			"  - id: a",
			"    kind: fail",
			"    message: no",
			"    output: x",
		),
		want: []problem{{"steps[0].output", 6, "does not apply to a fail step (it has no result to map)"}},
	},
	{
		name: "ReturnHasNoResult",
		input: wf(
			"  - id: a",
			"    kind: return",
			"    output: ${result.x}",
		),
		want: []problem{{"steps[0].output", 5, "expression ${result.x}: unknown name result at character 1"}},
	},

	// goto and retry.
	{
		name: "GotoWithoutTarget",
		input: wf(
			"  - id: a",
			"    kind: goto",
		),
		want: []problem{{"steps[0].target", 3, "is required: the id of a step of this list, or end"}},
	},
	{
		name: "GotoUnknownTarget",
		input: wf(
			"  - id: a",
			"    kind: goto",
			"    target: b",
		),
		want: []problem{{"steps[0].target", 5,
			`"b" is not the id of a step of this list (a goto moves within its list, or within the failed step's list from on-error; or use end)`}},
	},
	{
		name: "GotoIntoAnotherList", // a block's goto cannot leave the block
		input: wf(
			"  - id: top",
			"    kind: noop",
			"  - id: blk",
			"    kind: workflow",
			"    steps:",
			"      - {id: back, kind: goto, target: top}",
		),
		want: []problem{{"steps[1].steps[0].target", 8,
			`"top" is not the id of a step of this list (a goto moves within its list, or within the failed step's list from on-error; or use end)`}},
	},
	{
		name: "GotoToAnotherHandlerStep", // from on-error, a goto names a step of the failed step's list
		input: wf(
			"  - id: a",
			"    kind: noop",
			"    on-error:",
			"      - {id: first, kind: noop}",
			"      - {id: again, kind: goto, target: first}",
		),
		want: []problem{{"steps[0].on-error[1].target", 7,
			`"first" is not the id of a step of this list (a goto moves within its list, or within the failed step's list from on-error; or use end)`}},
	},
	{
		name: "GotoInWorkflowOnError",
		input: yml(
			"name: wf",
			"on-error:",
			"  - {id: back, kind: goto, target: a}",
			"steps:",
			"  - {id: a, kind: noop}",
		),
		want: []problem{{"on-error[0].kind", 3, "a goto in the workflow's on-error steps has no list to move in; put on-error on the step that fails"}},
	},
	{
		name: "RetryInMainSteps",
		input: wf(
			"  - id: a",
			"    kind: retry",
			"    retry: {limit: 2}",
		),
		want: []problem{{"steps[0].kind", 4, "a retry step belongs in the on-error steps of a step (it runs that step again); with replay: true, in any on-error steps"}},
	},
	{
		name: "RetryInWorkflowOnError",
		input: yml(
			"name: wf",
			"on-error:",
			"  - {id: again, kind: retry, retry: {limit: 2}}",
			"steps:",
			"  - {id: a, kind: noop}",
		),
		want: []problem{{"on-error[0].kind", 3, "a retry step belongs in the on-error steps of a step (it runs that step again); with replay: true, in any on-error steps"}},
	},
	{
		name: "RetryWithoutPolicy",
		input: wf(
			"  - id: a",
			"    kind: noop",
			"    on-error:",
			"      - id: again",
			"        kind: retry",
		),
		want: []problem{{"steps[0].on-error[0].retry", 6, "is required: the limit of attempts in all (and a backoff), e.g. {limit: 3}"}},
	},
	{
		name: "RetryStepBadPolicy",
		input: wf(
			"  - id: a",
			"    kind: noop",
			"    on-error:",
			"      - id: again",
			"        kind: retry",
			"        retry: {limit: 0, jitter: 2}",
		),
		want: []problem{
			{"steps[0].on-error[0].retry.limit", 8, "must be between 1 and 1000 (attempts in all, the first included)"},
			{"steps[0].on-error[0].retry.jitter", 8, "must be between 0 and 1"},
		},
	},

	// Fields every step has.
	{
		name: "ReservedStepID",
		input: wf(
			"  - id: on-error",
			"    kind: noop",
		),
		want: []problem{{"steps[0].id", 3, `"on-error" is reserved (on-error steps' paths use it); choose another id`}},
	},
	{
		name: "BadCondition",
		input: wf(
			"  - id: a",
			"    kind: noop",
			"    condition: input.x ==",
		),
		want: []problem{{"steps[0].condition", 5, "expression ${input.x ==}: unexpected token EOF at character 10"}},
	},
	{
		name: "ConditionSeesNoResult",
		input: wf(
			"  - id: a",
			"    kind: noop",
			"    condition: ${result.ok}",
		),
		want: []problem{{"steps[0].condition", 5, "expression ${result.ok}: unknown name result at character 1"}},
	},
	{
		name: "ErrorOutsideOnError",
		input: wf(
			"  - id: a",
			"    kind: log",
			"    message: ${error.message}",
		),
		want: []problem{{"steps[0].message", 5, "expression ${error.message}: unknown name error at character 1"}},
	},
	{
		name: "BadOutputExpression",
		input: wf(
			"  - id: a",
			"    kind: exec",
			"    command: ls",
			"    output: ${result.stdout +}",
		),
		want: []problem{{"steps[0].output", 6, "expression ${result.stdout +}: unexpected token EOF at character 15"}},
	},
	{
		name: "OutputNotJSON",
		input: wf(
			"  - id: a",
			"    kind: noop",
			"    output: .nan",
		),
		want: []problem{{"steps[0].output", 5, "json: unsupported value: NaN"}},
	},
	{
		name: "RetentionDisabledWithStepLock",
		input: wf(
			"  - id: b",
			"    kind: workflow",
			"    lock: x",
			"    retention: disabled",
			"    steps: [{id: a, kind: noop}]",
		),
		want: []problem{{"steps[0].retention", 6,
			"disabled cannot go with lock: a holder deleted when it ends leaves nothing to resume, replay or explain the lock by; keep it a while (e.g. 1h)"}},
	},

	// The workflow's own fields.
	{
		name: "WorkflowOutputBadExpression",
		input: yml(
			"name: wf",
			"output: ${steps.a.output +}",
			"steps:",
			"  - {id: a, kind: noop}",
		),
		want: []problem{{"output", 2, "expression ${steps.a.output +}: unexpected token EOF at character 16"}},
	},
	{
		name: "WorkflowOutputNotJSON",
		input: yml(
			"name: wf",
			"output: {x: .nan}",
			"steps:",
			"  - {id: a, kind: noop}",
		),
		want: []problem{{"output", 2, "json: unsupported value: NaN"}},
	},
	{
		name: "NegativeVersion",
		input: yml(
			"name: wf",
			"version: -2",
			"steps:",
			"  - {id: a, kind: noop}",
		),
		want: []problem{{"version", 2, "must be a positive version number (or absent, to let the registry number versions), not -2"}},
	},
	{
		name: "VersionPastJSON",
		input: yml(
			"name: wf",
			"version: 9007199254740992",
			"steps:",
			"  - {id: a, kind: noop}",
		),
		want: []problem{{"version", 2, "must be at most 9007199254740991 (the largest whole number every JSON reader keeps exact), not 9007199254740992"}},
	},

	// Durations.
	{
		name: "WorkflowTimeoutTemplate",
		input: yml(
			"name: wf",
			"timeout: ${input.t}",
			"steps:",
			"  - {id: a, kind: noop}",
		),
		want: []problem{{"timeout", 2,
			`"${input.t}": give a literal duration here (e.g. 30s); expressions are allowed only in a sleep's duration and until`}},
	},
	{
		name: "WorkflowTimeoutInDays",
		input: yml(
			"name: wf",
			"timeout: 2d",
			"steps:",
			"  - {id: a, kind: noop}",
		),
		want: []problem{{"timeout", 2, `"2d" is not a positive duration (e.g. 30s, 5m, 2h)`}},
	},
	{
		name: "NegativeStepTimeout",
		input: wf(
			"  - id: a",
			"    kind: noop",
			"    timeout: -5s",
		),
		want: []problem{{"steps[0].timeout", 5, `"-5s" is not a positive duration (e.g. 30s, 5m, 2h)`}},
	},

	// Retry policies.
	{
		name: "RetryLimitZero",
		input: yml(
			"name: wf",
			"retry: {limit: 0}",
			"steps:",
			"  - {id: a, kind: noop}",
		),
		want: []problem{{"retry.limit", 2, "must be between 1 and 1000 (attempts in all, the first included)"}},
	},
	{
		name: "RetryLimitTooBig",
		input: wf(
			"  - id: a",
			"    kind: noop",
			"    retry: {limit: 1001}",
		),
		want: []problem{{"steps[0].retry.limit", 5, "must be between 1 and 1000 (attempts in all, the first included)"}},
	},
	{
		name: "RetryWithoutLimit",
		input: wf(
			"  - id: a",
			"    kind: noop",
			"    retry: {jitter: 0.5}",
		),
		want: []problem{{"steps[0].retry.limit", 5, "must be between 1 and 1000 (attempts in all, the first included)"}},
	},
	{
		name: "RetryJitterAboveOne",
		input: yml(
			"name: wf",
			"retry:",
			"  limit: 3",
			"  jitter: 1.5",
			"steps:",
			"  - {id: a, kind: noop}",
		),
		want: []problem{{"retry.jitter", 4, "must be between 0 and 1"}},
	},
	{
		name: "RetryNegativeJitter",
		input: yml(
			"name: wf",
			"retry:",
			"  limit: 3",
			"  jitter: -0.1",
			"steps:",
			"  - {id: a, kind: noop}",
		),
		want: []problem{{"retry.jitter", 4, "must be between 0 and 1"}},
	},
	{
		name: "RetryOnEmptyText",
		input: yml(
			"name: wf",
			"retry:",
			"  limit: 3",
			`  on: [timed out, " "]`,
			"steps:",
			"  - {id: a, kind: noop}",
		),
		want: []problem{{"retry.on", 4, "holds an empty text"}},
	},
	{
		name: "RetryBadBackoff",
		input: yml(
			"name: wf",
			"retry:",
			"  limit: 3",
			"  backoff:",
			"    initial: soon",
			"    max: ${input.max}",
			"    factor: 0.5",
			"steps:",
			"  - {id: a, kind: noop}",
		),
		want: []problem{
			{"retry.backoff.initial", 5, `"soon" is not a positive duration (e.g. 30s, 5m, 2h)`},
			{"retry.backoff.max", 6, `"${input.max}": give a literal duration here (e.g. 30s); expressions are allowed only in a sleep's duration and until`},
			{"retry.backoff.factor", 7, "must be at least 1"},
		},
	},
	{
		name: "StepRetryZeroBackoff",
		input: wf(
			"  - id: a",
			"    kind: noop",
			"    retry:",
			"      limit: 3",
			"      backoff: {initial: 0s, max: 1m, factor: 1}",
		),
		want: []problem{{"steps[0].retry.backoff.initial", 7, `"0s" is not a positive duration (e.g. 30s, 5m, 2h)`}},
	},
}

func TestValidationProblems(t *testing.T) {
	t.Parallel()

	for _, tc := range validationCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			_, err := workflow.Parse([]byte(tc.input))
			require.ErrorIs(t, err, workflow.ErrInvalid)
			var ve *workflow.ValidationError
			require.ErrorAs(t, err, &ve)

			got := make([]problem, len(ve.Problems))
			for i, p := range ve.Problems {
				got[i] = problem{p.Field, p.Line, p.Message}
				require.Positive(t, p.Column, "problem %+v has a line but no column", p)
				require.NotContains(t, p.Message, "\n", "a problem is one line")
				require.Contains(t, err.Error(), p.Error())
			}
			require.Equal(t, tc.want, got)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), "field "+w.field+": "+w.msg)
			}
		})
	}
}

// TestValidationAccepts holds definitions at the edge of what is allowed:
// each must parse without a problem.
func TestValidationAccepts(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name  string
		input string
	}{
		{
			name: "SevenContainersDeep",
			input: wf(
				"  - id: l1",
				"    kind: workflow",
				"    steps:",
				"      - id: l2",
				"        kind: foreach",
				"        items: [1, 2]",
				"        steps:",
				"          - id: l3",
				"            kind: switch",
				"            cases:",
				"              - when: ${item == 1}",
				"                steps:",
				"                  - id: l4",
				"                    kind: parallel",
				"                    mode: first",
				"                    branches:",
				"                      - id: b",
				"                        steps:",
				"                          - id: l5",
				"                            kind: workflow",
				"                            steps:",
				"                              - id: l6",
				"                                kind: workflow",
				"                                steps:",
				"                                  - id: l7",
				"                                    kind: workflow",
				"                                    steps: [{id: x, kind: log, message: '${index}'}]",
			),
		},
		{
			name: "ForeachRootsInsideItsBody",
			input: wf(
				"  - id: each",
				"    kind: foreach",
				"    items: ${input.hosts}",
				"    concurrency: 3",
				"    steps:",
				"      - id: ping",
				"        kind: exec",
				"        command: ping",
				`        args: ["-c1", "${item}"]`,
				"        env: {N: '${string(index)}'}",
			),
		},
		{
			name: "CalledWorkflowWithInputAndVersion",
			input: wf(
				"  - id: sub",
				"    kind: workflow",
				"    workflow: other",
				"    version: 3",
				"    input: {host: '${input.host}'}",
			),
		},
		{
			name: "OnlyRetention",
			input: wf(
				"  - id: keep",
				"    kind: workflow",
				"    retention: forever",
			),
		},
		{
			name: "SwitchWithDefault",
			input: wf(
				"  - id: sw",
				"    kind: switch",
				"    cases:",
				"      - when: input.n > 2",
				"        steps: [{id: big, kind: noop}]",
				"    default: [{id: small, kind: noop}]",
			),
		},
		{
			name: "TemplatesWhereAllowed",
			input: wf(
				"  - id: req",
				"    kind: http",
				"    method: ${input.method}",
				"    url: ${input.url}",
				"    headers: {Authorization: 'Bearer ${input.token}'}",
				"    body: ${input.body}",
				"  - id: nap",
				"    kind: sleep",
				"    duration: ${input.nap}",
				"  - id: until",
				"    kind: sleep",
				"    until: ${input.at}",
				"  - id: fixed",
				"    kind: sleep",
				"    until: 2026-12-24T18:00:00.5+01:00",
			),
		},
		{
			name: "WaitMatchSeesTheSignal",
			input: wf(
				"  - id: vote",
				"    kind: wait",
				"    signals: [approve, reject]",
				"    match: ${signal.data.by != ''}",
				"    timeout: 24h",
				"    output: ${result.name}",
			),
		},
		{
			name: "OnErrorSeesTheErrorAndMovesInTheFailedList",
			input: wf(
				"  - id: a",
				"    kind: exec",
				"    command: 'false'",
				"    on-error:",
				"      - {id: note, kind: log, message: '${error.message}'}",
				"      - {id: again, kind: retry, retry: {limit: 3, backoff: {initial: 1s, max: 10s, factor: 2}}}",
				"      - {id: skip, kind: goto, target: done}",
				"  - id: done",
				"    kind: return",
				"    output: ${steps.a.output}",
			),
		},
		{
			name: "ReplayRetryInWorkflowOnError",
			input: yml(
				"name: wf",
				"on-error:",
				"  - {id: again, kind: retry, replay: true, next: last, retry: {limit: 2}}",
				"steps:",
				"  - {id: a, kind: noop}",
			),
		},
		{
			name: "FullRetryPolicy",
			input: yml(
				"name: wf",
				"timeout: 1h30m",
				"retry:",
				"  limit: 1000",
				"  jitter: 1",
				"  on: [timed out, 'exit status 2']",
				"  backoff: {initial: 300ms, max: 1m, factor: 1}",
				"steps:",
				"  - {id: a, kind: noop, timeout: 300ms, retry: {limit: 1}}",
			),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			d, err := workflow.Parse([]byte(tc.input))
			require.NoError(t, err)
			require.NoError(t, d.Validate())
		})
	}
}

// TestUnknownFieldInANestedStep: the problem names the field and its line
// even below the top-level steps.
func TestUnknownFieldInANestedStep(t *testing.T) {
	t.Parallel()

	_, err := workflow.Parse([]byte(wf(
		"  - id: blk",
		"    kind: workflow",
		"    steps:",
		"      - id: a",
		"        kind: noop",
		"        colour: red",
	)))
	var ve *workflow.ValidationError
	require.ErrorAs(t, err, &ve)
	require.Len(t, ve.Problems, 1)
	require.Equal(t, 8, ve.Problems[0].Line)
	require.True(t, strings.HasSuffix(ve.Problems[0].Field, "colour"), "field %q", ve.Problems[0].Field)
	require.Equal(t, `unknown field "colour"`, ve.Problems[0].Message)
}

// TestAnExpressionsProblemIsPlacedInTheFile: an expression's problem is
// at its line and column in the file when the string is written plainly
// on one line or as a literal block (|); in a quoted or folded string, at
// the field's.
func TestAnExpressionsProblemIsPlacedInTheFile(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		value     []string // the message field's lines
		line, col int
	}{
		{"Plain", []string{"    message: hi ${inptu.host}"}, 5, 19},
		{"PlainLater", []string{"    message: ${input.a} and ${vars.n + lenn(input)}"}, 5, 40},
		{"Literal", []string{"    message: |", "      first line", "        ${input.a +", "            nope}"}, 8, 13},
		{"LiteralFirstLine", []string{"    message: |", "      ${nope}"}, 6, 9},
		{"Quoted", []string{`    message: "hi ${nope}"`}, 5, 14},
		{"Folded", []string{"    message: >", "      ${input.a +", "        nope}"}, 5, 14},
		{"ItsTextEarlier", []string{"    message: hi nope ${nope}"}, 5, 24},
		{"AfterAnEscape", []string{"    message: $${nope} ${nope}"}, 5, 25},
		{"LettersNotBytes", []string{"    message: é ${nope}"}, 5, 18},
		{"LiteralLettersNotBytes", []string{"    message: |", "      é ${nope}"}, 6, 11},
		{"PlainOverLines", []string{"    message: hi", "      there ${nope}"}, 5, 14},
		{"IndentationIndicator", []string{"    message: |2", "        x", "      y ${nope}"}, 7, 11},
		{"LiteralBlankFirstLine", []string{"    message: |", "", "      ${nope}"}, 7, 9},
		{"Unclosed", []string{"    message: |", "      hi ${nope"}, 5, 14},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := workflow.Parse([]byte(wf(append([]string{"  - id: a", "    kind: log"}, tc.value...)...)))
			var ve *workflow.ValidationError
			require.ErrorAs(t, err, &ve)
			require.Len(t, ve.Problems, 1, "%v", ve.Problems)
			p := ve.Problems[0]
			require.Equal(t, "steps[0].message", p.Field)
			require.Equal(t, [2]int{tc.line, tc.col}, [2]int{p.Line, p.Column}, p.Message)
		})
	}
	// Every expression of a string with a problem is reported, each at
	// its own place: a user fixes them all at once.
	t.Run("TwoInOneString", func(t *testing.T) {
		t.Parallel()
		_, err := workflow.Parse([]byte(wf("  - id: a", "    kind: log", "    message: ${inptu.who} and ${lenn(input.x)}",
			"  - id: b", "    kind: let", "    vars: {n: '${nope} ${upper(1)}'}")))
		var ve *workflow.ValidationError
		require.ErrorAs(t, err, &ve)
		require.Len(t, ve.Problems, 4, "%v", ve.Problems)
		for i, want := range []struct {
			field, msg string
			line, col  int
		}{
			{"steps[0].message", `unknown name inptu at character 1 (did you mean "input"?)`, 5, 16},
			{"steps[0].message", `unknown name lenn at character 1 (did you mean "len"?)`, 5, 33},
			{"steps[1].vars.n", "unknown name nope at character 1", 8, 15}, // quoted: the value's place
			{"steps[1].vars.n", "upper() takes a string, not a number at character 7", 8, 15},
		} {
			p := ve.Problems[i]
			require.Equal(t, want.field, p.Field, p.Message)
			require.Contains(t, p.Message, want.msg)
			require.Equal(t, [2]int{want.line, want.col}, [2]int{p.Line, p.Column}, p.Message)
		}
	})
	t.Run("TwoAlikeInAQuotedString", func(t *testing.T) { // placed alike, worded alike: said once
		t.Parallel()
		_, err := workflow.Parse([]byte(wf("  - id: a", "    kind: log", "    message: '${inptu} ${inptu}'")))
		var ve *workflow.ValidationError
		require.ErrorAs(t, err, &ve)
		require.Len(t, ve.Problems, 1, "%v", ve.Problems)
	})
	t.Run("CRLF", func(t *testing.T) {
		t.Parallel()
		src := "name: wf\r\nsteps:\r\n  - id: a\r\n    kind: log\r\n    message: |\r\n\r\n      ${nope}\r\n"
		_, err := workflow.Parse([]byte(src))
		var ve *workflow.ValidationError
		require.ErrorAs(t, err, &ve)
		require.Len(t, ve.Problems, 1, "%v", ve.Problems)
		require.Equal(t, [2]int{7, 9}, [2]int{ve.Problems[0].Line, ve.Problems[0].Column})
	})
	// A member whose key is no name: at its own line.
	t.Run("QuotedMember", func(t *testing.T) {
		t.Parallel()
		_, err := workflow.Parse([]byte(wf("  - id: a", "    kind: http", "    url: https://example.com", "    headers:",
			"      Accept: ok", "      X-A: hi ${nope}")))
		var ve *workflow.ValidationError
		require.ErrorAs(t, err, &ve)
		require.Len(t, ve.Problems, 1, "%v", ve.Problems)
		require.Equal(t, `steps[0].headers["X-A"]`, ve.Problems[0].Field)
		require.Equal(t, [2]int{8, 17}, [2]int{ve.Problems[0].Line, ve.Problems[0].Column}, ve.Problems[0].Message)
	})
	// Another problem of a literal block's field: at the field's place.
	t.Run("NotAnExpressions", func(t *testing.T) {
		t.Parallel()
		_, err := workflow.Parse([]byte(wf("  - id: a", "    kind: noop", "    message: |", "      hi")))
		var ve *workflow.ValidationError
		require.ErrorAs(t, err, &ve)
		require.Len(t, ve.Problems, 1, "%v", ve.Problems)
		require.Equal(t, "steps[0].message", ve.Problems[0].Field)
		require.Equal(t, [2]int{5, 14}, [2]int{ve.Problems[0].Line, ve.Problems[0].Column}, ve.Problems[0].Message)
	})
}
