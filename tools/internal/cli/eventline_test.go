package cli

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
)

// TestEventLinesSayWhatAWaitWaitsFor: jetflow events prints a timer's
// purpose and due time, when a waiting step ends and the signals it
// takes, and a received signal's name; a due time on another day than
// the event's has its date.
func TestEventLinesSayWhatAWaitWaitsFor(t *testing.T) {
	at := time.Date(2026, 11, 25, 10, 0, 0, 0, time.Local)
	line := func(typ events.Type, p events.Payload) string {
		t.Helper()
		data, err := json.Marshal(p)
		require.NoError(t, err)
		var b bytes.Buffer
		printEvent(&b, client.Event{Seq: 7, Type: typ, Time: at, Data: data})
		return b.String()
	}
	armed := line(events.TypeTimerArmed, &events.TimerArmed{TimerID: "t", Purpose: events.TimerSleep, StepID: "nap", Due: at.Add(90 * time.Second).UTC()})
	require.Contains(t, armed, "step=nap")
	require.Contains(t, armed, "timer=t purpose=sleep")
	require.Contains(t, line(events.TypeTimerFired, &events.TimerFired{TimerID: "t9"}), "timer=t9", "which timer fired")
	require.Contains(t, armed, "due=10:01:30.000")

	waiting := line(events.TypeStepWaiting, &events.StepWaiting{StepID: "w", Until: at.Add(48 * time.Hour).UTC(), Signals: []string{"go", "stop"}})
	require.Contains(t, waiting, "signals=go,stop")
	require.Contains(t, waiting, `until="2026-11-27 10:00:00.000"`, "another day: with its date")

	// A wait that records its timer's arming (docs/adr/0018) names it.
	slept := line(events.TypeStepWaiting, &events.StepWaiting{StepID: "nap", Attempt: 1, Until: at.Add(90 * time.Second).UTC(),
		Timer: &events.TimerArmed{TimerID: "t7", Purpose: events.TimerSleep, StepID: "nap", Attempt: 1, Due: at.Add(90 * time.Second).UTC()}})
	require.Contains(t, slept, "step=nap timer=t7 purpose=sleep until=10:01:30.000")

	forever := line(events.TypeStepWaiting, &events.StepWaiting{StepID: "w", Signals: []string{"go"}})
	require.NotContains(t, forever, "until=", "no timeout: no end")

	sig := line(events.TypeSignalReceived, &events.SignalReceived{SignalID: "s1", Name: "go ahead"})
	require.Contains(t, sig, `name="go ahead"`)
}

// TestEventLineSaysWhatAnEndCarries: an execution's success that carries
// its last step's success says so.
func TestEventLineSaysWhatAnEndCarries(t *testing.T) {
	data, err := json.Marshal(&events.ExecutionSucceeded{Output: json.RawMessage(`{"ok":true}`), Step: &events.StepSucceeded{StepID: "ship", Attempt: 1, Agent: "a1", Output: json.RawMessage(`{"n":2}`)}})
	require.NoError(t, err)
	var b bytes.Buffer
	printEvent(&b, client.Event{Seq: 9, Type: events.TypeExecutionSucceeded, Time: time.Now(), Data: data})
	require.Contains(t, b.String(), "execution.succeeded")
	require.Contains(t, b.String(), `with=succeeded:ship agent=a1 output={"n":2}`)
}

// TestEventLineSaysWhatASleepsEndRecords: a sleep's success that records
// its timer's firing (docs/adr/0017) names the timer, alone or carried
// by the execution's end.
func TestEventLineSaysWhatASleepsEndRecords(t *testing.T) {
	ok := &events.StepSucceeded{StepID: "nap", Attempt: 1, Fired: "t86f6b1ead347039a6da33465"}
	for typ, p := range map[events.Type]events.Payload{
		events.TypeStepSucceeded:      ok,
		events.TypeExecutionSucceeded: &events.ExecutionSucceeded{Step: ok},
	} {
		data, err := json.Marshal(p)
		require.NoError(t, err)
		var b bytes.Buffer
		printEvent(&b, client.Event{Seq: 9, Type: typ, Time: time.Now(), Data: data})
		require.Contains(t, b.String(), "fired=t86f6b1ead347039a6da33465", "%s", typ)
	}
}

// TestEventLineSaysWhatASuccessDispatched: a step's success that carries
// the next operation's dispatch says so.
func TestEventLineSaysWhatASuccessDispatched(t *testing.T) {
	data, err := json.Marshal(&events.StepSucceeded{StepID: "build", Attempt: 1, Agent: "a1",
		Then: &events.StepDispatched{StepID: "ship", Attempt: 1, TaskID: "x.ship.1", Queue: "default"}})
	require.NoError(t, err)
	var b bytes.Buffer
	printEvent(&b, client.Event{Seq: 3, Type: events.TypeStepSucceeded, Time: time.Now(), Data: data})
	require.Contains(t, b.String(), "step=build")
	require.Contains(t, b.String(), "then=dispatched:ship")

	data, err = json.Marshal(&events.StepSucceeded{StepID: "ship", Attempt: 1})
	require.NoError(t, err)
	b.Reset()
	printEvent(&b, client.Event{Seq: 4, Type: events.TypeStepSucceeded, Time: time.Now(), Data: data})
	require.NotContains(t, b.String(), "then=")
}

// TestShowSaysWhatSendingMeans: a step sending may be waiting in its
// queue (its sending is recorded with its next event): show says so.
func TestShowSaysWhatSendingMeans(t *testing.T) {
	x := projections.Execution{ID: "x1", Workflow: "wf", Status: projections.StatusStarted,
		Steps: []projections.Step{{ID: "build", Kind: "exec", Status: projections.OpSending, Attempt: 1}}}
	var b bytes.Buffer
	printExecution(&b, x, "")
	require.Contains(t, b.String(), "sending: the task waits in its queue (default)")
	x.Steps = append(x.Steps, projections.Step{ID: "train", Kind: "exec", Status: projections.OpSending, Attempt: 1, Queue: "gpu"})
	b.Reset()
	printExecution(&b, x, "")
	require.Contains(t, b.String(), "(default, gpu)")
	x.Status = projections.StatusCancelled
	b.Reset()
	printExecution(&b, x, "")
	require.NotContains(t, b.String(), "sending:", "an ended execution waits for nothing")
	x.Status = projections.StatusStarted
	x.Steps = x.Steps[:1]
	x.Steps[0].Status = projections.OpStarted
	b.Reset()
	printExecution(&b, x, "")
	require.NotContains(t, b.String(), "sending:")

	// A local step sending is run by the dispatcher: no queue, no agent.
	x.Steps = append(x.Steps, projections.Step{ID: "sum", Kind: "call", Status: projections.OpSending, Attempt: 1, Queue: workflow.LocalQueue})
	b.Reset()
	printExecution(&b, x, "")
	require.Contains(t, b.String(), "sending (local): the dispatcher holding the execution runs the step")
	require.NotContains(t, b.String(), "waits in its queue")
}

// TestShowSaysWhatBecameOfAStepAfterTheEnd: a step that was with the
// agents when its execution ended shows the report that came after.
func TestShowSaysWhatBecameOfAStepAfterTheEnd(t *testing.T) {
	x := projections.Execution{ID: "x1", Workflow: "wf", Status: projections.StatusCancelled,
		Steps: []projections.Step{{ID: "hang", Kind: "exec", Status: projections.OpStarted, Attempt: 1, StartedAt: time.Unix(100, 0),
			AfterEnd: &projections.AfterEnd{Outcome: projections.OpFailed, Error: "terminated: an operator killed the execution", At: time.Unix(103, 0)}}}}
	var b bytes.Buffer
	printExecution(&b, x, "")
	require.Contains(t, b.String(), "started, failed after the end")
	require.Contains(t, b.String(), "terminated: an operator killed the execution")
	require.Contains(t, b.String(), dur(time.Unix(100, 0), time.Unix(103, 0)), "how long it ran, to the report after the end")
}

// TestEventLinesAndShowNameChildren: jetflow events names a child's id,
// its parent, and the children an end stopped; show says what became of
// a child left running when its parent ended.
func TestEventLinesAndShowNameChildren(t *testing.T) {
	line := func(typ events.Type, p events.Payload) string {
		t.Helper()
		data, err := json.Marshal(p)
		require.NoError(t, err)
		var b bytes.Buffer
		printEvent(&b, client.Event{Seq: 7, Type: typ, Time: time.Now(), Data: data})
		return b.String()
	}
	require.Contains(t, line(events.TypeStepChildStarted, &events.StepChildStarted{StepID: "ship", Attempt: 1, ExecutionID: "o-1-ship-0123456789", Workflow: "shipping"}),
		"step=ship child=o-1-ship-0123456789 workflow=shipping")
	require.Contains(t, line(events.TypeExecutionStarted, &events.ExecutionStarted{Workflow: "shipping", Version: 3, Parent: &events.ParentRef{ExecutionID: "o-1", StepID: "ship"}}),
		"version=3 parent=o-1", "the version that runs, and the parent")
	require.Contains(t, line(events.TypeExecutionCancelled, &events.ExecutionCancelled{Children: []events.StoppedChild{{StepID: "ship", ExecutionID: "o-1-ship-0123456789"}}}),
		"stopped_children=o-1-ship-0123456789")

	x := projections.Execution{ID: "o-1", Workflow: "order", Status: projections.StatusCancelled,
		Steps: []projections.Step{{ID: "ship", Kind: "workflow", Status: projections.OpPending, Child: "o-1-ship-0123456789", ChildWorkflow: "shipping"}}}
	var b bytes.Buffer
	printExecution(&b, x, "the default")
	require.Contains(t, b.String(), "o-1-ship-0123456789 (workflow shipping), started by step ship: left running when this execution ended")
	x.Status, x.DryRun = projections.StatusStarted, true
	b.Reset()
	printExecution(&b, x, "the default")
	require.Contains(t, b.String(), "started by step ship: the step waits for its end")
	require.Contains(t, b.String(), "dry run    yes: the workflow was walked and no operation ran")
}

// TestShowAndEventsGiveALongErrorWhole: show's table cuts a step's error,
// then gives each error it cut in full below it (not one the execution's
// error line already gives whole); jetflow events shows more of an error
// than of other values, and says where the rest is; nothing is cut
// inside a letter.
func TestShowAndEventsGiveALongErrorWhole(t *testing.T) {
	long := "message: expression ${input.a.b}: cannot fetch b from null at character 9 (what it is fetched from is missing or null: ?.b gives null instead, and ?? a default)"
	stderr := "exit status 1: stderr:\nline one\nline two"
	x := projections.Execution{ID: "x1", Workflow: "wf", Status: projections.StatusFailed,
		Error: "step last failed: boom",
		Steps: []projections.Step{
			{ID: "render", Kind: "exec", Status: projections.OpFailed, Attempt: 2, Error: long},
			{ID: "short", Kind: "exec", Status: projections.OpFailed, Attempt: 1, Error: "boom"},
			{ID: "multi", Kind: "exec", Status: projections.OpFailed, Attempt: 1, Error: stderr},
			{ID: "crlf", Kind: "exec", Status: projections.OpFailed, Attempt: 1, Error: "progress 10%\rfatal: no disk\r\nnext"},
			{ID: "sh", Kind: "exec", Status: projections.OpFailed, Attempt: 3, Error: "command sh: exit status 2",
				Output: json.RawMessage(`{"stdout":"","stderr":"checksum mismatch\nin part 2\n","exit_code":2}`)},
			{ID: "quiet", Kind: "exec", Status: projections.OpFailed, Attempt: 1, Error: "command sh: exit status 1",
				Output: json.RawMessage(`{"stdout":"ok","stderr":"","exit_code":1}`)},
			{ID: "api", Kind: "http", Status: projections.OpFailed, Attempt: 1, Error: "status 503",
				Output: json.RawMessage(`{"status":503,"body":"down"}`)},
			{ID: "out", Kind: "exec", Status: projections.OpSucceeded, Attempt: 1, Output: json.RawMessage(`"` + strings.Repeat("o", 150) + `"`)},
			{ID: "late", Kind: "exec", Status: projections.OpStarted, Attempt: 1,
				AfterEnd: &projections.AfterEnd{Outcome: projections.OpFailed, Error: "after: " + long}},
		}}
	var b bytes.Buffer
	printExecution(&b, x, "")
	out := b.String()
	table, below, ok := strings.Cut(out, "failures in full:\n")
	require.True(t, ok, out)
	require.NotContains(t, table, long, "the table cuts it")
	require.Contains(t, below, "  render (attempt 2): "+long+"\n")
	require.Contains(t, below, "  multi (attempt 1): exit status 1: stderr:\n    line one\n    line two\n", "a multi-line error, indented")
	require.Contains(t, below, "  late (attempt 1): after: "+long+"\n", "a failure after the end")
	require.NotContains(t, below, "short", "an error the table shows whole")
	require.Contains(t, below, "  sh (attempt 3): command sh: exit status 2\n    stderr:\n      checksum mismatch\n      in part 2\n",
		"a failed command's stderr, which its error does not hold")
	require.NotContains(t, below, "quiet", "a failure with nothing more to give")
	require.Contains(t, below, `  api (attempt 1): status 503`+"\n"+`    output: {"body":"down","status":503}`+"\n", "another failure's output")
	require.Contains(t, below, "  crlf (attempt 1): progress 10%\\rfatal: no disk\n    next\n", "a lone carriage return written \\r, a CRLF a line break")
	require.NotContains(t, out, "\r", "no carriage return reaches the terminal")
	require.NotContains(t, below, "ooo", "an output is not an error")

	x.Error = "step render failed: " + long // the execution's error gives it whole already
	b.Reset()
	printExecution(&b, x, "")
	_, below, ok = strings.Cut(b.String(), "failures in full:\n")
	require.True(t, ok)
	require.NotContains(t, below, "render (attempt")
	x.Steps = x.Steps[:2]
	b.Reset()
	printExecution(&b, x, "")
	require.NotContains(t, b.String(), "failures in full", "nothing cut, nothing below")

	line := func(msg string) string {
		t.Helper()
		data, err := json.Marshal(&events.StepFailed{StepID: "render", Attempt: 1, Error: msg})
		require.NoError(t, err)
		var b bytes.Buffer
		printEvent(&b, client.Event{Seq: 7, Type: events.TypeStepFailed, Time: time.Now(), Data: data})
		return b.String()
	}
	require.Contains(t, line(long), strconv.Quote(long), "an error of 160 letters is whole")
	huge := strings.Repeat("é", 400)
	got := line(huge)
	require.Contains(t, got, " error="+strings.Repeat("é", 299)+"… (cut: -o json has it whole)")
	require.True(t, utf8.ValidString(got))
	require.NotContains(t, line("boom"), "cut")
	got = line(strings.Repeat("x ", 200))
	require.True(t, strings.HasSuffix(strings.TrimSpace(got), `…" (cut: -o json has it whole)`), "the quote is closed: %s", got)
	require.Contains(t, line("\x1b[2J\x1b[31mdisk\x1b[0m"), `error="\x1b[2J\x1b[31mdisk\x1b[0m"`, "an escape sequence is written, not sent")

	// Nothing a terminal acts on reaches it from show either: an escape
	// sequence (a command's colours, a clear screen), a carriage return;
	// the execution's error line is one line, and a multi-line error it
	// holds is given whole below, indented.
	x = projections.Execution{ID: "x1", Workflow: "wf", Status: projections.StatusFailed,
		Error: "step multi failed: " + stderr + "\x1b[2J",
		Steps: []projections.Step{
			{ID: "multi", Kind: "exec", Status: projections.OpFailed, Attempt: 1, Error: stderr + "\x1b[2J"},
			{ID: "colour", Kind: "exec", Status: projections.OpFailed, Attempt: 1, Error: "\x1b[31mdisk full\x1b[0m"},
		}}
	b.Reset()
	printExecution(&b, x, "")
	out = b.String()
	require.NotContains(t, out, "\x1b", "no escape sequence reaches the terminal")
	require.Contains(t, out, `error      step multi failed: exit status 1: stderr:\nline one\nline two\x1b[2J`+"\n")
	require.Contains(t, out, `\x1b[31mdisk full\x1b[0m`)
	require.Contains(t, out, "  multi (attempt 1): exit status 1: stderr:\n    line one\n    line two\\x1b[2J\n")

	// A byte of no letter (0x9b is a terminal's CSI) and a mark that
	// reverses the line are written, not sent; a quote cut is closed
	// without cutting an escape in two.
	require.Equal(t, `a\xff\x9b\u202eb`+"\uFFFD", printable("a\xff\x9b\u202eb\uFFFD"), "a true U+FFFD is a letter")
	q, wasCut := quotedCut(strings.Repeat("\x1b", 100), 30)
	require.True(t, wasCut)
	require.Equal(t, `"`+strings.Repeat(`\x1b`, 6)+`…"`, q, "whole escapes, the quote closed")

	// A failure's output is cut: a command's stderr to its last lines,
	// another output to a few hundred letters.
	var lines []string
	for i := range 100 {
		lines = append(lines, "line "+strconv.Itoa(i))
	}
	x = projections.Execution{ID: "x1", Workflow: "wf", Status: projections.StatusFailed, Error: "step sh failed",
		Steps: []projections.Step{
			{ID: "sh", Kind: "exec", Status: projections.OpFailed, Attempt: 1, Error: "command sh: exit status 2",
				Output: json.RawMessage(`{"stderr":` + strconv.Quote(strings.Join(lines, "\n")) + `}`)},
			{ID: "api", Kind: "http", Status: projections.OpFailed, Attempt: 1, Error: "status 503",
				Output: json.RawMessage(`{"body":"` + strings.Repeat("b", 1000) + `"}`)},
		}}
	b.Reset()
	printExecution(&b, x, "")
	out = b.String()
	require.Contains(t, out, "    stderr: (its last 40 lines of 100: -o json has it whole)\n      line 60\n")
	require.Contains(t, out, "      line 99\n")
	require.NotContains(t, out, "line 59\n")
	require.Contains(t, out, "…"+" (cut: -o json has it whole)\n")
	require.NotContains(t, out, strings.Repeat("b", 400))
	long = strings.Repeat("é", 3000) // 6,000 bytes on one line: its last 4 KiB, from a letter's start
	require.True(t, utf8.ValidString(tail(long, 40, 4<<10)))
	require.LessOrEqual(t, len(tail(long, 40, 4<<10)), 4<<10)
}
