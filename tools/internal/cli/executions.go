package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/spelling"
	"jetflow.dev/pkg/workflow"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// exactlyOne accepts one argument and otherwise says what to type.
func exactlyOne(hint string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != 1 {
			return usageError{errors.New(hint)}
		}
		return nil
	}
}

// parseInputs turns k=v pairs into an object; v is JSON when it parses as
// JSON (numbers, booleans, objects, quoted strings), a plain string otherwise.
func parseInputs(pairs []string, raw string) (map[string]any, error) {
	in := map[string]any{}
	if raw != "" {
		if err := json.Unmarshal([]byte(raw), &in); err != nil {
			_, msg := events.ExplainJSON(err)
			return nil, usagef("--input-json %s (write a JSON object, e.g. '{\"who\":\"ada\"}')", msg)
		}
	}
	seen := map[string]bool{}
	for _, p := range pairs {
		if strings.HasPrefix(strings.TrimSpace(p), "{") {
			return nil, usagef("--input %q: a whole JSON object goes in --input-json; --input takes key=value", p)
		}
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, usagef("--input %q: write it as key=value", p)
		}
		if seen[k] {
			return nil, usagef("--input %s is given twice; give each key once", k)
		}
		seen[k] = true
		var val any
		if err := json.Unmarshal([]byte(v), &val); err != nil {
			val = v
		}
		in[k] = val
	}
	return in, nil
}

func (a *app) runCmd() *cobra.Command {
	var req client.StartRequest
	var inputs []string
	var inputJSON string
	var watch bool
	var out output
	cmd := &cobra.Command{
		Use:   "run WORKFLOW [--input k=v]... [--id ID] [--dry-run] [--wait-after-fail] [--watch] [-o json]",
		Short: "Start an execution of a workflow",
		Long: `Start an execution of a workflow. With --watch, follow its history until
the execution is settled: exit status 0 if it succeeded, 1 if it failed,
was cancelled or is suspended (see docs/cli.md for every exit status).
With -o json, print the api's answer as JSON (with --watch: one JSON line
for the answer, then one per event).`,
		Args: exactlyOne("name the workflow to run: jetflow run WORKFLOW (see jetflow workflow ls)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("version") && req.Version < 1 {
				return usagef("--version %d: give a version number from 1, or leave it out for the latest (see jetflow workflow show %s)", req.Version, args[0])
			}
			in, err := parseInputs(inputs, inputJSON)
			if err != nil {
				return err
			}
			req.Workflow, req.Input = args[0], in
			res, err := a.client().Start(cmd.Context(), req)
			if err != nil {
				return a.unregistered(cmd.Context(), err, req.Workflow)
			}
			switch {
			case out.json() && watch:
				if err := printJSONLine(a.stdout, res); err != nil {
					return err
				}
			case out.json():
				return printJSON(a.stdout, res)
			case res.HTTPStatus == 200:
				fmt.Fprintf(a.stdout, "execution %s already exists for this request (status %s%s)\n", res.ID, res.Status, versionOf(res, ", %s"))
			case res.HTTPStatus == 202:
				fmt.Fprintf(a.stdout, "execution %s accepted (its start is stored; no dispatcher had answered yet: jetflow show %s)\n", res.ID, res.ID)
			default:
				fmt.Fprintf(a.stdout, "execution %s started%s\n", res.ID, versionOf(res, " (%s)"))
			}
			if !watch {
				return nil
			}
			return a.follow(cmd, res.ID, 0, out.json())
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&inputs, "input", "i", nil, "input value key=value (repeatable; JSON values allowed)")
	f.StringVar(&inputJSON, "input-json", "", "the whole input as a JSON object")
	f.StringVar(&req.ID, "id", "", "execution id (unique forever; default: generated)")
	f.IntVar(&req.Version, "version", 0, "definition version (default: latest)")
	f.BoolVarP(&watch, "watch", "w", false, "follow progress until the execution ends")
	f.BoolVar(&req.DryRun, "dry-run", false, "walk the workflow, evaluating conditions and inputs, without running any operation, sleep or wait")
	f.BoolVar(&req.WaitAfterFail, "wait-after-fail", false, "on failure, suspend the execution (to fix the cause and resume it) instead of ending it")
	out.add(cmd)
	return cmd
}

// unregistered adds to err, if it says that workflow is not registered,
// the registered one its name was likely meant to be, or where to find
// them: best effort, err as it was if they cannot be listed.
func (a *app) unregistered(ctx context.Context, err error, name string) error {
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusNotFound || apiErr.Field != "workflow" {
		return err
	}
	listed, lerr := a.client().ListWorkflows(ctx)
	if lerr != nil {
		return err
	}
	names := make([]string, len(listed))
	for i, w := range listed {
		names[i] = w.Name
	}
	if meant := spelling.Meant(name, names); meant != "" {
		return fmt.Errorf("%w: did you mean %q? (jetflow workflow ls lists them)", err, meant)
	}
	return fmt.Errorf("%w: jetflow workflow ls lists the registered ones", err)
}

// versionOf says which version of its workflow the started execution
// runs ("hello version 2") in format; "" when the answer does not say.
func versionOf(res client.Started, format string) string {
	if res.Version == 0 {
		return ""
	}
	return fmt.Sprintf(format, fmt.Sprintf("%s version %d", res.Workflow, res.Version))
}

func (a *app) showCmd() *cobra.Command {
	var out output
	var atSeq uint64
	cmd := &cobra.Command{
		Use:   "show ID [--at-seq N] [-o json]",
		Short: "Show an execution's state: status, steps, outputs, timings (now, or as of a stream sequence)",
		Args:  exactlyOne("name the execution to show: jetflow show ID (see jetflow ls)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			x, err := a.client().ExecutionAt(cmd.Context(), args[0], atSeq)
			if err != nil {
				return err
			}
			if out.json() {
				return printJSON(a.stdout, x)
			}
			rule := x.Retention
			if rule == "" { // the system default: ask what it is (best effort)
				rule = "the system default"
				if st, err := a.client().Settings(cmd.Context()); err == nil && st.RetentionDefault != "" {
					rule = st.RetentionDefault + " (the system default)"
				}
			}
			printExecution(a.stdout, x, rule)
			return nil
		},
	}
	out.add(cmd)
	cmd.Flags().Uint64Var(&atSeq, "at-seq", 0, "show the state as it was at this stream sequence (see jetflow events)")
	return cmd
}

func dur(from, to time.Time) string {
	if from.IsZero() || to.IsZero() {
		return "-"
	}
	return to.Sub(from).Round(time.Millisecond).String()
}

// printExecution prints an execution's state; retention is the rule that
// applies to it, as people read it.
func printExecution(w io.Writer, x projections.Execution, retention string) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "execution\t%s\n", x.ID)
	fmt.Fprintf(tw, "workflow\t%s (version %d)\n", x.Workflow, x.Version)
	fmt.Fprintf(tw, "status\t%s\n", x.Status)
	if x.DryRun {
		fmt.Fprintln(tw, "dry run\tyes: the workflow was walked and no operation ran (each step that would have is skipped, saying so)")
	}
	if !x.StartedAt.IsZero() {
		fmt.Fprintf(tw, "started\t%s", x.StartedAt.Local().Format(time.RFC3339Nano))
		if by := who(x.StartedByActor, x.StartedBy); by != "?" {
			fmt.Fprintf(tw, " by %s", by)
		}
		fmt.Fprintln(tw)
	}
	if !x.EndedAt.IsZero() {
		fmt.Fprintf(tw, "ended\t%s (took %s)\n", x.EndedAt.Local().Format(time.RFC3339Nano), dur(x.StartedAt, x.EndedAt))
	}
	if x.ContinuedFrom != "" {
		fmt.Fprintf(tw, "chain\trun %d of %s, continued from %s\n", x.Run, x.Chain, x.ContinuedFrom)
	}
	if x.ContinuedAs != "" {
		fmt.Fprintf(tw, "continued\tas %s (a continue-as-new step ended it; jetflow show %s)\n", x.ContinuedAs, x.ContinuedAs)
	}
	if p := x.Parent; p != nil {
		fmt.Fprintf(tw, "parent\tstep %s (attempt %d) of %s (workflow %s), whose child execution this is; jetflow show %s\n",
			p.StepID, p.Attempt, p.ExecutionID, p.Workflow, p.ExecutionID)
	}
	for _, st := range x.Steps {
		if st.Child == "" {
			continue
		}
		state := string(st.Status)
		switch {
		case st.Stopped:
			state = "told to stop as this execution ended (its step failed; a resume starts a new child)"
		case st.Status != projections.OpPending:
		case x.Status.Active():
			state = "the step waits for its end"
		case x.Status == projections.StatusSuspended:
			state = "runs on while this execution is suspended; a resume takes its end"
		case x.Status == projections.StatusSucceeded:
			state = "left running when this execution ended (on_parent_end: abandon)"
		default:
			state = "left running when this execution ended (on_parent_end: abandon); a resume takes its end"
		}
		fmt.Fprintf(tw, "child\t%s (workflow %s), started by step %s: %s\n", st.Child, st.ChildWorkflow, st.ID, state)
	}
	if x.Status != projections.StatusPending {
		fmt.Fprintf(tw, "retention\t%s, in group %s (docs/retention.md)\n", retention, cmp.Or(x.RetentionKey, x.Workflow))
	}
	if !x.ExpiredAt.IsZero() {
		fmt.Fprintf(tw, "expired\t%s (under its retention rule; the janitor deletes it at its next sweep)\n", x.ExpiredAt.Local().Format(time.RFC3339Nano))
	}
	if x.Resumes > 0 {
		fmt.Fprintf(tw, "resumed\t%d time(s) (resumes and replays), last at %s\n", x.Resumes, x.ResumedAt.Local().Format(time.RFC3339Nano))
	}
	for _, r := range x.Replays {
		fmt.Fprintf(tw, "replayed\t%s at %s (asked: from %s) by %s at %s", r.Mode, cmp.Or(r.Point, "the start"), r.From,
			who(r.Actor, r.RequestedBy), r.At.Local().Format(time.RFC3339Nano))
		if r.Reason != "" {
			fmt.Fprintf(tw, ": %s", r.Reason)
		}
		fmt.Fprintln(tw)
	}
	if c := x.Compensation; c != nil {
		fmt.Fprintf(tw, "compensation\t%s (on %s", c.Status, c.Cause)
		if c.Cause == events.CompensateForOperator {
			fmt.Fprintf(tw, " by %s", who(c.Actor, c.RequestedBy))
		}
		fmt.Fprintf(tw, " at %s): %s", c.StartedAt.Local().Format(time.RFC3339Nano), truncate(strings.Join(c.Steps, ", "), 200))
		if c.Status == projections.CompensationFailed {
			fmt.Fprintf(tw, "; %s could not be compensated: %s", c.StepID, truncate(c.Failure, 200))
		}
		fmt.Fprintln(tw)
	}
	for _, v := range x.VersionChanges {
		fmt.Fprintf(tw, "version\t%d -> %d (%s) by %s at %s", v.From, v.To, v.Action, who(v.Actor, v.RequestedBy), v.At.Local().Format(time.RFC3339Nano))
		if v.Reason != "" {
			fmt.Fprintf(tw, ": %s", v.Reason)
		}
		var notes []string
		for _, from := range slices.Sorted(maps.Keys(v.Moved)) {
			notes = append(notes, from+" moved to "+v.Moved[from])
		}
		if len(v.Retired) > 0 {
			notes = append(notes, "no longer has "+strings.Join(v.Retired, ", "))
		}
		if len(notes) > 0 {
			fmt.Fprintf(tw, "; %s", truncate(strings.Join(notes, "; "), 300))
		}
		fmt.Fprintln(tw)
	}
	if c := x.Cancellation; c != nil {
		fmt.Fprintf(tw, "cancel\t%s by %s at %s", c.Action, who(c.Actor, c.RequestedBy), c.RequestedAt.Local().Format(time.RFC3339Nano))
		if c.Reason != "" {
			fmt.Fprintf(tw, ": %s", c.Reason)
		}
		fmt.Fprintln(tw)
	}
	if x.Error != "" {
		fmt.Fprintf(tw, "error\t%s\n", oneLine(x.Error))
	}
	if d := x.Damaged; d != nil {
		fmt.Fprintf(tw, "DAMAGED\tat sequence %d (%s): %s\n", d.Seq, cmpStr(string(d.Type), "no type"), truncate(d.Reason, 300))
		if d.Unknown {
			fmt.Fprintf(tw, "\tthis version does not know the event: upgrade, or an admin runs: jetflow repair %s --ignore-seq %d\n", x.ID, d.Seq)
		} else {
			fmt.Fprintf(tw, "\tnothing acts on it until an admin runs: jetflow repair %s --ignore-seq %d (docs/operations.md)\n", x.ID, d.Seq)
		}
	}
	if len(x.Repairs) > 0 {
		fmt.Fprintf(tw, "repaired\tfolds pass over the damaged event(s) at sequence %s\n", seqList(x.Repairs))
	}
	if t := x.Truncated; t != nil {
		fmt.Fprintf(tw, "summary\tthis read model leaves out %d finished step(s) and %d large value(s); "+
			"every step: GET /v1/executions/%s/steps, every value: jetflow events %s\n", t.Steps, t.Values, x.ID, x.ID)
	}
	fmt.Fprintf(tw, "input\t%s\n", compact(x.Input))
	_ = tw.Flush()
	fmt.Fprintln(w)
	printLocks(w, x)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tKIND\tSTATUS\tATTEMPT\tDURATION\tOUTPUT / ERROR")
	var whole []string // the errors cut in the table, in full
	for _, s := range x.Steps {
		detail := compact(s.Output)
		if s.Error != "" {
			detail = s.Error
		}
		if s.Child != "" && s.Status == projections.OpPending {
			detail = "child execution " + s.Child
		}
		status, ended := cmpStr(string(s.Status), "-"), s.EndedAt
		if a := s.AfterEnd; a != nil { // what became of it after the execution ended
			status += ", " + string(a.Outcome) + " after the end"
			detail = cmpStr(a.Error, "(its output was not kept)")
			ended = cmp.Or(ended, a.At)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", s.ID, s.Kind, status, s.Attempt, dur(s.StartedAt, ended), truncate(detail, stepDetail))
		if f := failureInFull(x, s, detail); f != "" {
			whole = append(whole, f)
		}
	}
	for _, s := range x.RetiredSteps {
		fmt.Fprintf(tw, "%s\t%s\t%s, retired\t%d\t%s\t%s\n", s.ID, s.Kind, cmpStr(string(s.Status), "-"), s.Attempt, dur(s.StartedAt, s.EndedAt),
			"(left behind by a move to another version: its result is ignored)")
	}
	_ = tw.Flush()
	if len(whole) > 0 {
		fmt.Fprintf(w, "\nfailures in full:\n  %s\n", strings.Join(whole, "\n  "))
	}
	var queues []string
	local := false
	for _, s := range x.Steps {
		q := cmp.Or(s.Queue, workflow.DefaultQueue)
		switch {
		case s.Status != projections.OpSending:
		case q == workflow.LocalQueue:
			local = true
		case !slices.Contains(queues, q):
			queues = append(queues, q)
		}
	}
	if len(queues) > 0 && x.Status.Active() {
		fmt.Fprintf(w, "\nsending: the task waits in its queue (%s) for an agent of that queue, or is being published; "+
			"its storing is recorded with the step's next event\n", strings.Join(queues, ", "))
	}
	if local && x.Status.Active() {
		fmt.Fprintf(w, "\nsending (local): the dispatcher holding the execution runs the step; its result is recorded when it ends "+
			"(run again if that dispatcher stopped first)\n")
	}
}

// seqList prints stream sequences as a list.
func seqList(seqs []uint64) string {
	out := make([]string, len(seqs))
	for i, n := range seqs {
		out[i] = strconv.FormatUint(n, 10)
	}
	return strings.Join(out, ", ")
}

// who says who asked for something: the actor as authenticated, with
// the free-text requested_by as a remark when it says something else.
func who(actor *events.Actor, requestedBy string) string {
	if actor == nil {
		return cmp.Or(requestedBy, "?")
	}
	if requestedBy != "" && requestedBy != actor.Subject {
		return fmt.Sprintf("%s, requested_by %q", actor, requestedBy)
	}
	return actor.String()
}

func cmpStr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func compact(b json.RawMessage) string {
	if len(b) == 0 {
		return "-"
	}
	var v any
	if json.Unmarshal(b, &v) != nil {
		return string(b)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

// truncate is s on one line (its line breaks written \n), cut to n
// letters (the last an ellipsis) if longer, never inside a letter.
func truncate(s string, n int) string {
	s = oneLine(s)
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}

// failureInFull is what show gives of step s's failure below its table,
// whose row showed detail: its error whole when the row cut it (or it
// spans lines) and the execution's error line does not give it whole,
// and the output the failure carries (an exec step's stderr, which the
// error does not hold); "" when there is nothing more to give.
func failureInFull(x projections.Execution, s projections.Step, detail string) string {
	failure, output := s.Error, s.Output
	if a := s.AfterEnd; a != nil {
		failure, output = a.Error, nil
	}
	if failure == "" || failure != detail {
		return ""
	}
	// The table's row, or the execution's error line (one line), gives
	// a short one-line error whole.
	givenWhole := !strings.ContainsAny(failure, "\r\n") && (!cut(failure, stepDetail) || strings.Contains(x.Error, failure))
	var more string
	var out map[string]any
	switch {
	case len(output) == 0 || string(output) == "null":
	case json.Unmarshal(output, &out) == nil && out["stderr"] != nil:
		stderr, _ := out["stderr"].(string)
		if stderr = strings.TrimRight(stderr, "\r\n"); stderr != "" {
			end, left := tail(stderr, stderrLines, stderrBytes), ""
			if len(end) < len(stderr) {
				left = fmt.Sprintf(" (its last %d lines of %d: -o json has it whole)", strings.Count(end, "\n")+1, strings.Count(stderr, "\n")+1)
			}
			more = "\n    stderr:" + left + "\n      " + indented(end, "      ")
		}
	default:
		c := compact(output)
		more = "\n    output: " + truncate(c, failureOutput)
		if cut(c, failureOutput) {
			more += " (cut: -o json has it whole)"
		}
	}
	if givenWhole && more == "" {
		return ""
	}
	return fmt.Sprintf("%s (attempt %d): %s%s", s.ID, s.Attempt, indented(failure, "    "), more)
}

// What show gives of a failure's output: the last stderrLines lines of
// a command's stderr, at most stderrBytes of them (the agent keeps up
// to its -max-output, 256 KiB by default), and failureOutput letters of
// another output.
const (
	stderrLines   = 40
	stderrBytes   = 4 << 10
	failureOutput = 300
)

// tail is the end of s: its last lines lines, at most bytes of them
// (from a line's or a letter's start).
func tail(s string, lines, bytes int) string {
	from := len(s)
	for n := 0; n < lines && from > 0; n++ {
		from = strings.LastIndexByte(s[:from], '\n')
		if from < 0 {
			from = 0
			break
		}
	}
	if s[from] == '\n' {
		from++
	}
	if len(s)-from > bytes {
		from = len(s) - bytes
		for from < len(s) && !utf8.RuneStart(s[from]) {
			from++
		}
		if i := strings.IndexByte(s[from:], '\n'); i >= 0 && i < len(s)-from-1 {
			from += i + 1
		}
	}
	return s[from:]
}

// stepDetail is how many letters of a step's output or error show's
// table shows.
const stepDetail = 100

// eventError is how many letters of an event's error jetflow events
// shows.
const eventError = 300

// cut reports whether truncate(s, n) leaves something of s out.
func cut(s string, n int) bool {
	return utf8.RuneCountInString(oneLine(s)) > n
}

// oneLine is printable(s) on one line: its line breaks written \n.
func oneLine(s string) string { return strings.ReplaceAll(printable(s), "\n", `\n`) }

// indented is printable(s) with each line after the first indented by
// indent.
func indented(s, indent string) string {
	return strings.ReplaceAll(printable(s), "\n", "\n"+indent)
}

// printable is s as it may reach a terminal: a CRLF is a line break, and
// every other control character but a line break and a tab is written
// as Go writes it in a string (\r, \x1b): a carriage return (a progress
// bar's) would take the cursor back over what was printed on the line,
// and an escape sequence (a command's colours, ESC[2J) would act on the
// terminal.
func printable(s string) string {
	s = strings.ReplaceAll(s, "\r\n", "\n")
	if utf8.ValidString(s) && !strings.ContainsFunc(s, unsafeRune) {
		return s
	}
	var b strings.Builder
	for i, r := range s {
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			fmt.Fprintf(&b, `\x%02x`, s[i]) // a byte of no letter (0x9b is a terminal's CSI)
		case unsafeRune(r):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// unsafeRune reports a character printable writes escaped: a control
// character but a line break and a tab, and the marks that reorder
// text (U+202E would show the rest of the line reversed).
func unsafeRune(r rune) bool {
	return r != '\n' && r != '\t' && (unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r))
}

func (a *app) lsCmd() *cobra.Command {
	var o client.ListOptions
	var out output
	var times [4]string // --started-after, --started-before, --ended-after, --ended-before
	cmd := &cobra.Command{
		Use: "ls [--workflow NAME] [--status STATUS] [--damaged] [--attr NAME:VALUE]... [--started-after T] [--started-before T] " +
			"[--ended-after T] [--ended-before T] [--sort ORDER] [--limit N] [--after CURSOR] [-o json]",
		Short: "List executions (filter by workflow, status, damage, times or search attributes; page with --after)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Limit < 1 || o.Limit > 1000 {
				return usagef("--limit %d: give a page size between 1 and 1000", o.Limit)
			}
			if o.Status != "" && !slices.Contains(projections.ListedStatuses, projections.Status(o.Status)) {
				return usagef("--status %q: use one of %s", o.Status, statusList())
			}
			if o.Sort != "" && !slices.Contains(listSorts, o.Sort) {
				return usagef("--sort %q: use one of %s", o.Sort, strings.Join(listSorts, ", "))
			}
			now := time.Now()
			for i, dst := range []*time.Time{&o.StartedAfter, &o.StartedBefore, &o.EndedAfter, &o.EndedBefore} {
				if times[i] == "" {
					continue
				}
				t, err := parseWhen(times[i], now)
				if err != nil {
					return usagef("--%s %q: %v", timeFlags[i], times[i], err)
				}
				*dst = t
			}
			for _, a := range o.Attrs {
				if name, _, ok := strings.Cut(a, ":"); !ok || name == "" {
					return usagef("--attr %q: give NAME:VALUE, a search attribute of the workflow (e.g. --attr customer:acme)", a)
				}
			}
			list, next, err := a.client().ListExecutions(cmd.Context(), lsOrder(o))
			if err != nil {
				return idCursor(err, o)
			}
			if out.json() {
				return printJSON(a.stdout, client.ExecutionList{Executions: list, Next: next})
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tWORKFLOW\tVERSION\tSTATUS\tSTEPS\tSTARTED\tDURATION")
			for _, x := range list {
				status := x.Status
				if x.Damaged != nil {
					status += fmt.Sprintf(" DAMAGED@%d", x.Damaged.Seq)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d/%d\t%s\t%s\n", x.ID, x.Workflow, x.Version, status, x.Done, x.Steps,
					x.StartedAt.Local().Format("2006-01-02 15:04:05"), dur(x.StartedAt, x.EndedAt))
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if next != "" { // on stderr: a pipe counting the lines counts executions
				fmt.Fprintf(a.stderr, "more: %s\n", nextPage(a.pageFlags(cmd), o, next))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Workflow, "workflow", "", "only executions of this workflow")
	f.StringVar(&o.Status, "status", "", "only executions in this status ("+statusList()+")")
	f.BoolVar(&o.Damaged, "damaged", false, "only damaged executions (waiting for an admin's repair)")
	f.IntVar(&o.Limit, "limit", 50, "page size (1-1000)")
	f.StringVar(&o.After, "after", "", "cursor: the page after this one (the \"more:\" line gives the command)")
	f.StringVar(&o.Sort, "sort", "", "order: "+strings.Join(listSorts, ", ")+" (default started_desc, the newest first; with a time range, that time, latest first)")
	f.StringArrayVar(&o.Attrs, "attr", nil, "NAME:VALUE: only executions whose search attribute NAME has this value (repeatable)")
	for i, name := range timeFlags {
		f.StringVar(&times[i], name, "", "only executions "+strings.ReplaceAll(name, "-", " ")+" this time: RFC 3339 (2026-01-02T15:04:05Z), or a duration ago (90m)")
	}
	out.add(cmd)
	return cmd
}

func (a *app) countsCmd() *cobra.Command {
	var workflow string
	var out output
	cmd := &cobra.Command{
		Use:   "counts [--workflow NAME] [-o json]",
		Short: "Count executions by status (all of them, or one workflow's)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.client().CountExecutions(cmd.Context(), workflow)
			if err != nil {
				return err
			}
			if out.json() {
				return printJSON(a.stdout, c)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "STATUS\tEXECUTIONS")
			// The statuses in their usual order, then any other.
			order := append([]string{string(projections.StatusPending)}, strings.Split(statusList(), ", ")...)
			var others []string
			for st := range c.Counts {
				if !slices.Contains(order, st) {
					others = append(others, st)
				}
			}
			slices.Sort(others)
			order = append(order, others...)
			for _, st := range order {
				if n, ok := c.Counts[st]; ok {
					fmt.Fprintf(tw, "%s\t%d\n", cmp.Or(st, "(none)"), n)
				}
			}
			fmt.Fprintf(tw, "total\t%d\n", c.Total)
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&workflow, "workflow", "", "only executions of this workflow")
	out.add(cmd)
	return cmd
}

// lsOrder is the list ls asks for: o, the newest executions first unless
// it names an order or a time range (whose time then orders it, latest
// first, as the api does). The api's own default, id order, is a
// script's stable order, not what a person looking at the list wants.
// The next page's command leaves the order out as o does: it is asked for
// the same way again.
func lsOrder(o client.ListOptions) client.ListOptions {
	if o.Sort == "" && o.StartedAfter.IsZero() && o.StartedBefore.IsZero() && o.EndedAfter.IsZero() && o.EndedBefore.IsZero() {
		o.Sort = "started_desc"
	}
	return o
}

// idCursor turns the api's refusal of ls's --after into what to do: give
// the cursor the more: line gives, or, to page by execution id (ls's
// order before it listed the newest first, which a script may still
// page by), the id order.
func idCursor(err error, o client.ListOptions) error {
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != http.StatusBadRequest || apiErr.Field != "after" {
		return err
	}
	order := lsOrder(o).Sort
	msg := fmt.Sprintf("--after %q: not a cursor of this list", o.After)
	if _, why, ok := strings.Cut(apiErr.Message, ": it is a cursor of "); ok {
		msg += " (it is one of " + why + ")"
	}
	msg += ": give the one its more: line gave"
	switch {
	case order == "id":
	case o.Sort == "" && order != "":
		msg += "; ls lists the newest first: to page by execution id, add --sort id"
	default:
		msg += "; to page by execution id, list with --sort id"
	}
	return usagef("%s", msg)
}

// listSorts are the orders of GET /v1/executions.
var listSorts = []string{"id", "started_desc", "started_asc", "ended_desc", "ended_asc"}

// timeFlags are ls's time range flags, in ListOptions' order.
var timeFlags = [4]string{"started-after", "started-before", "ended-after", "ended-before"}

// parseWhen reads a time flag: an RFC 3339 time, or a duration that long
// before now.
func parseWhen(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, errors.New("give an RFC 3339 time (2026-01-02T15:04:05Z) or a duration ago (90m, 24h)")
}

// pageFlags are the global flags given to this ls that choose what it
// lists (its api and namespace; never the token), for the next page's
// command, and whether its page size was given.
func (a *app) pageFlags(cmd *cobra.Command) pageFlags {
	return pageFlags{prog: commandName(os.Args[0]), api: a.apiURL, namespace: a.namespace, limit: cmd.Flags().Changed("limit")}
}

type pageFlags struct {
	prog           string // how the command was run: bin/jetflow from a checkout ("" is jetflow)
	api, namespace string
	limit          bool
}

// commandName is how to run this command again, from arg0, the path it
// was run by: that path if it names jetflow (bin/jetflow, from a
// checkout), else jetflow (a test binary, a renamed copy).
func commandName(arg0 string) string {
	if filepath.Base(arg0) != "jetflow" {
		return "jetflow"
	}
	return arg0
}

// nextPage is the command that lists the page after cursor next: the
// same api and namespace (those given as flags), o's filters and page
// size.
func nextPage(g pageFlags, o client.ListOptions, next string) string {
	cmd := argQuote(cmp.Or(g.prog, "jetflow"))
	if g.api != "" {
		cmd += " --api " + argQuote(g.api)
	}
	if g.namespace != "" {
		cmd += " --namespace " + argQuote(g.namespace)
	}
	cmd += " ls"
	if o.Workflow != "" {
		cmd += " --workflow " + argQuote(o.Workflow)
	}
	if o.Status != "" {
		cmd += " --status " + o.Status
	}
	if o.Damaged {
		cmd += " --damaged"
	}
	for _, a := range o.Attrs {
		cmd += " --attr " + argQuote(a)
	}
	for i, t := range []time.Time{o.StartedAfter, o.StartedBefore, o.EndedAfter, o.EndedBefore} {
		if !t.IsZero() { // as a time: a duration would move with the clock
			cmd += " --" + timeFlags[i] + " " + t.UTC().Format(time.RFC3339Nano)
		}
	}
	if o.Sort != "" {
		cmd += " --sort " + o.Sort
	}
	if g.limit {
		cmd += " --limit " + strconv.Itoa(o.Limit)
	}
	return cmd + " --after " + argQuote(next)
}

// argQuote quotes s for a POSIX shell when it holds anything but
// letters, digits and -_.:@/ (shellQuote).
func argQuote(s string) string {
	plain := s != "" && strings.IndexFunc(s, func(r rune) bool {
		return (r < 'a' || r > 'z') && (r < 'A' || r > 'Z') && (r < '0' || r > '9') && !strings.ContainsRune("-_.:@/", r)
	}) < 0
	if plain {
		return s
	}
	return shellQuote(s)
}

// statusList names the statuses an execution list can be filtered by.
func statusList() string {
	names := make([]string, len(projections.ListedStatuses))
	for i, st := range projections.ListedStatuses {
		names[i] = string(st)
	}
	return strings.Join(names, ", ")
}

func (a *app) eventsCmd() *cobra.Command {
	var follow bool
	var out output
	var from uint64
	cmd := &cobra.Command{
		Use:   "events ID [--follow] [--from-seq N] [-o json]",
		Short: "Print an execution's history; --follow streams it live until the execution is settled",
		Long: `Print an execution's history. With --follow, stream it live until the
execution is settled as of its latest events (it ended, or it is
suspended; a cancelled execution that is resumed is followed on): exit
status 0 if it succeeded, 1 if it failed, was cancelled or is suspended.
With -o json, print the api's JSON ({"events": [...]}); with --follow,
one JSON line per event.`,
		Args: exactlyOne("name the execution: jetflow events ID (see jetflow ls)"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if follow {
				return a.follow(cmd, args[0], from, out.json())
			}
			evs, err := a.client().Events(cmd.Context(), args[0], from)
			if err != nil {
				return err
			}
			if out.json() {
				return printJSON(a.stdout, client.EventList{Events: evs})
			}
			for _, ev := range evs {
				printEvent(a.stdout, ev)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&follow, "follow", "f", false, "follow live until the execution is settled")
	f.Uint64Var(&from, "from-seq", 0, "start at this stream sequence")
	out.add(cmd)
	return cmd
}

// follow prints events live until the execution is settled, then exits 0
// if it succeeded and 1 if it failed, was cancelled or is suspended, as
// its latest events say (a cancel followed by a resume is not the end).
func (a *app) follow(cmd *cobra.Command, id string, from uint64, asJSON bool) error {
	status := projections.StatusNone
	err := a.client().Follow(cmd.Context(), id, from, func(ev client.Event) error {
		if ev.Invalid != "" {
			fmt.Fprintf(a.stderr, "execution %s is damaged at sequence %d: nothing moves until an admin runs jetflow repair %s --ignore-seq %d (following on)\n",
				id, ev.Seq, id, ev.Seq)
		} else {
			status = projections.StatusAfter(status, ev.Type)
		}
		if asJSON {
			return printJSONLine(a.stdout, ev)
		}
		printEvent(a.stdout, ev)
		return nil
	})
	if err != nil {
		return err
	}
	if status == projections.StatusNone { // --from-seq passed the events that tell
		evs, err := a.client().Events(cmd.Context(), id, 0)
		if err != nil {
			return err
		}
		for _, ev := range evs {
			status = projections.StatusAfter(status, ev.Type)
		}
	}
	why := ""
	switch status {
	case projections.StatusSucceeded:
		return nil
	case projections.StatusFailed:
		why = "failed"
	case projections.StatusCancelled:
		why = "was cancelled"
	case projections.StatusSuspended:
		why = fmt.Sprintf("is suspended: fix the cause, then jetflow resume %s (or jetflow cancel %s)", id, id)
	default:
		why = "is " + cmpStr(string(status), "not started")
	}
	if !asJSON {
		fmt.Fprintf(a.stderr, "execution %s %s\n", id, why)
	}
	return exitError{code: ExitFailed}
}

// timerDetail is what a line says of a timer (a timer event's data, or
// the arming a wait records): its id and purpose.
func timerDetail(d map[string]any) string {
	out := ""
	if id, ok := d["timer_id"].(string); ok && id != "" {
		out += " timer=" + id
	}
	if p, ok := d["purpose"].(string); ok && p != "" {
		out += " purpose=" + p
	}
	return out
}

// waitDetail is what a line says of a wait: a timer's id (which a
// sleep's success that records its firing names: fired=), purpose and
// due time (a timer.armed's, or a step.waiting's that records its
// timer's arming), when a waiting step ends and the signals it takes, a
// signal's name. Times are local, with the date when it is not the
// event's.
func waitDetail(ev client.Event, d map[string]any) string {
	out := ""
	switch ev.Type {
	case events.TypeTimerArmed, events.TypeTimerFired:
		out += timerDetail(d)
	case events.TypeSignalReceived:
		if n, ok := d["name"].(string); ok && n != "" {
			out += " name=" + quoteIfSpaced(n)
		}
	case events.TypeStepWaiting:
		if sigs, ok := d["signals"].([]any); ok && len(sigs) > 0 {
			names := make([]string, 0, len(sigs))
			for _, g := range sigs {
				if n, ok := g.(string); ok {
					names = append(names, n)
				}
			}
			out += " signals=" + strings.Join(names, ",")
		}
		// The timer whose arming it records (docs/adr/0018).
		if tm, ok := d["timer"].(map[string]any); ok {
			out += timerDetail(tm)
		}
	}
	for _, k := range []string{"due", "until"} {
		v, ok := d[k].(string)
		if !ok {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil || t.IsZero() {
			continue
		}
		layout := "15:04:05.000"
		if t.Local().Format(time.DateOnly) != ev.Time.Local().Format(time.DateOnly) {
			layout = "2006-01-02 15:04:05.000"
		}
		out += " " + k + "=" + quoteIfSpaced(t.Local().Format(layout))
	}
	return out
}

// quotedCut is quoteIfSpaced(v), v cut first to about n letters (its
// last an ellipsis) if longer: the quote is closed, and no escape is
// cut in two. It reports whether v was cut.
func quotedCut(v string, n int) (string, bool) {
	if q := quoteIfSpaced(v); !cut(q, n) {
		return q, false
	}
	r := []rune(v)
	for k := min(len(r), n); k > 0; k-- { // the longest start whose quoting fits
		if q := quoteIfSpaced(string(r[:k-1]) + "…"); utf8.RuneCountInString(q) <= n || k == 1 {
			return q, true
		}
	}
	return quoteIfSpaced("…"), true
}

// quoteIfSpaced is v quoted (as Go quotes a string) if it holds a space,
// a tab, a quote, or what printable escapes; v itself otherwise, as the
// other values of an event line are.
func quoteIfSpaced(v string) string {
	if strings.ContainsAny(v, " \t\"") || strings.ContainsFunc(v, unsafeRune) || !utf8.ValidString(v) {
		return strconv.Quote(v)
	}
	return v
}

func printEvent(w io.Writer, ev client.Event) {
	if ev.Invalid != "" {
		fmt.Fprintf(w, "%6d  %s  %-20s INVALID: %s\n", ev.Seq, ev.Time.Local().Format("15:04:05.000"),
			cmpStr(strings.TrimPrefix(string(ev.Type), "io.jetflow."), "?"), truncate(ev.Invalid, 200))
		return
	}
	var d map[string]any
	_ = json.Unmarshal(ev.Data, &d)
	detail := ""
	if s, ok := d["step_id"].(string); ok {
		detail = "step=" + s
	}
	if n, ok := d["ignore_seq"].(float64); ok {
		detail += fmt.Sprintf(" ignore_seq=%d", int64(n))
	}
	if ev.Type == events.TypeDefinitionChanged { // a move to another version
		from, _ := d["from_version"].(float64)
		to, _ := d["version"].(float64)
		detail += fmt.Sprintf(" version=%d->%d", int(from), int(to))
		if r, ok := d["retired"].([]any); ok && len(r) > 0 {
			detail += fmt.Sprintf(" retired=%d", len(r))
		}
	}
	if ev.Type == events.TypeStepChildStarted {
		id, _ := d["execution_id"].(string)
		wf, _ := d["workflow"].(string)
		detail += " child=" + id + " workflow=" + wf
	}
	if c, ok := d["stopped_children"].([]any); ok && len(c) > 0 {
		var ids []string
		for _, one := range c {
			if m, ok := one.(map[string]any); ok {
				id, _ := m["execution_id"].(string)
				ids = append(ids, id)
			}
		}
		detail += " stopped_children=" + truncate(strings.Join(ids, ","), 200)
	}
	if ev.Type == events.TypeExecutionStarted {
		if v, ok := d["version"].(float64); ok && v > 0 { // the version that runs
			detail += fmt.Sprintf(" version=%d", int(v))
		}
		if p, ok := d["parent"].(map[string]any); ok {
			id, _ := p["execution_id"].(string)
			detail += " parent=" + id
		}
	}
	for _, k := range []string{"lock", "path", "error", "agent", "action", "reason", "requested_by"} {
		if v, ok := d[k].(string); ok && v != "" {
			if k == "error" { // the cause a reader looks for: more of it, and where the rest is
				q, cut := quotedCut(v, eventError)
				detail += " error=" + q
				if cut {
					detail += " (cut: -o json has it whole)"
				}
				continue
			}
			q, _ := quotedCut(v, 120)
			detail += " " + strings.TrimPrefix(k, "requested_") + "=" + q
		}
	}
	detail += waitDetail(ev, d)
	if a, ok := d["actor"].(map[string]any); ok {
		actor := &events.Actor{}
		actor.Subject, _ = a["subject"].(string)
		actor.Method, _ = a["method"].(string)
		actor.KeyID, _ = a["key_id"].(string)
		detail += " actor=" + strconv.Quote(actor.String())
	}
	if n, ok := d["delivery"].(float64); ok && n > 1 {
		detail += fmt.Sprintf(" delivery=%d (ran again)", int(n))
	}
	output := func(o any) string {
		b, _ := json.Marshal(o)
		return " output=" + truncate(string(b), 120)
	}
	// A sleep's success that records its timer's firing (docs/adr/0017).
	fired := func(m map[string]any) {
		if f, ok := m["fired"].(string); ok && f != "" {
			detail += " fired=" + f
		}
	}
	if ev.Type == events.TypeStepSucceeded {
		fired(d)
	}
	if o, ok := d["output"]; ok && ev.Type == events.TypeStepSucceeded {
		detail += output(o)
	}
	if st, ok := d["step"].(map[string]any); ok && ev.Type == events.TypeExecutionSucceeded { // the last step's success, in the same event
		if s, ok := st["step_id"].(string); ok {
			detail += " with=succeeded:" + s
		}
		fired(st)
		if a, ok := st["agent"].(string); ok && a != "" {
			detail += " agent=" + truncate(quoteIfSpaced(a), 120)
		}
		if o, ok := st["output"]; ok {
			detail += output(o)
		}
	}
	if then, ok := d["then"].(map[string]any); ok { // the next operation's dispatch, in the same event
		if s, ok := then["step_id"].(string); ok {
			detail += " then=dispatched:" + s
		}
	}
	short := strings.TrimPrefix(string(ev.Type), "io.jetflow.")
	line := fmt.Sprintf("%6d  %s  %-20s %s", ev.Seq, ev.Time.Local().Format("15:04:05.000"), short, strings.TrimSpace(detail))
	fmt.Fprintln(w, strings.TrimRight(line, " "))
}
