package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/workflow"
)

// The browser tests drive the operator UI in a real headless Chromium.
// Without one they skip, saying how to get it, unless
// JETFLOW_REQUIRE_BROWSER is set (CI sets it, after installing Chromium):
// there a missing browser fails the test.
const requireBrowserEnv = "JETFLOW_REQUIRE_BROWSER"

// screenshotsEnv names a directory where the tests save a PNG of each page
// (docs/ui.md shows them): `make docs/screenshots`.
const screenshotsEnv = "JETFLOW_UI_SCREENSHOTS"

// uiWait bounds each wait for the page: generous, since a loaded machine
// can be slow to start a stack and a browser. A passing test waits only
// as long as the page takes.
const uiWait = 60 * time.Second

func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{os.Getenv("JETFLOW_CHROMIUM"), "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if name == "" {
			continue
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv(requireBrowserEnv) != "" {
		t.Fatalf("%s is set but no Chromium was found: install it (Debian: apt-get install -y chromium) or set JETFLOW_CHROMIUM", requireBrowserEnv)
	}
	t.Skip("no Chromium found: install it (Debian: apt-get install -y chromium; make deps/browser) to run the UI's browser tests")
	return ""
}

// browser starts a headless Chromium for the test and returns its tab.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox, // as root in CI
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(cancel)
	// The first run starts the browser and ties it to its context: ctx,
	// not one with a deadline, or the browser would end with it.
	require.NoError(t, chromedp.Do(ctx), "start Chromium")
	return ctx
}

// run runs browser actions, each step bounded by uiWait.
func run(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, uiWait)
	defer cancel()
	if err := chromedp.Do(c, actions...); err != nil {
		// What the page showed, to tell a slow page from a wrong one.
		shown, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`location.hash + "\n" + document.body.innerText.slice(0, 3000)`))
		require.NoError(t, err, "%s; the page at %s", what, shown)
	}
}

// until waits for a JavaScript expression on the page to be true.
func until(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(uiWait))
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv(screenshotsEnv)
	if dir == "" {
		return
	}
	run(t, ctx, "settle", chromedp.Sleep(300*time.Millisecond))
	c, cancel := context.WithTimeout(ctx, uiWait)
	defer cancel()
	png, err := chromedp.Run(c, chromedp.FullScreenshot(100))
	require.NoError(t, err, "screenshot "+name)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ui-"+name+".png"), png, 0o644))
}

// evaluate is the value of a JavaScript expression on the page.
func evaluate[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, uiWait)
	defer cancel()
	v, err := chromedp.Run(c, chromedp.Evaluate[T](expr))
	require.NoError(t, err)
	return v
}

// login logs the page in with token, from the login page.
func login(t *testing.T, ctx context.Context, base, token string) {
	t.Helper()
	run(t, ctx, "log in",
		chromedp.Navigate(base+"/#/login"),
		until(`!!document.querySelector('[data-testid=token]')`),
		chromedp.SendKeys(chromedp.CSS(`[data-testid=token]`), token),
		chromedp.Click(chromedp.CSS(`[data-testid=login]`)),
		until(`location.hash === '#/executions'`),
		until(`!!document.querySelector('[data-testid=executions]')`))
}

// offered is true once the execution page shows the action's control
// (testid act-...), enabled: its status allows it and the token's scopes do.
func offered(testid string) string {
	return fmt.Sprintf(`(() => { const b = document.querySelector('[data-testid=%s]'); return !!b && !b.disabled && !!b.offsetParent; })()`, testid)
}

// notOffered is true once the execution page does not show the action's
// control (its status does not allow it).
func notOffered(testid string) string {
	return fmt.Sprintf(`(() => { const b = document.querySelector('[data-testid=%s]'); return !!b && !b.offsetParent; })()`, testid)
}

// needsScope is true once the page shows the control disabled, its title
// naming the scope it needs.
func needsScope(sel, scope string) string {
	return fmt.Sprintf(`(() => { const b = document.querySelector(%q); return !!b && b.disabled && (b.title || '').includes('needs the scope %s'); })()`, sel, scope)
}

// statusIs is true once the execution page shows status st.
func statusIs(st string) string {
	return fmt.Sprintf(`document.querySelector('[data-testid=status]')?.textContent === %q`, st)
}

// summaryHas is true once an event of type typ in the execution page's
// history has text in its summary line.
func summaryHas(typ events.Type, text string) string {
	return fmt.Sprintf(`[...document.querySelectorAll('[data-testid=timeline] tr[data-type=%q] summary')].some((s) => s.textContent.includes(%q))`, string(typ), text)
}

// inTimeline is true once the execution page's history has an event of type typ.
func inTimeline(typ events.Type) string {
	return fmt.Sprintf(`!!document.querySelector('[data-testid=timeline] tr[data-type=%q]')`, string(typ))
}

// TestOperatorUIInABrowser: in a real headless Chromium, an operator logs
// in with the admin token; the list shows an execution started elsewhere
// on its next refresh; an execution's page follows it live to its end; a
// signal, a cancel and a resume sent from the page are recorded in the
// history; a workflow's page starts an execution from its input form;
// and the locks page shows a waiter, whom a force-clear from the page
// lets acquire the lock.
func TestOperatorUIInABrowser(t *testing.T) {
	t.Parallel()
	chromiumPath(t) // skip before starting anything
	s := startStack(t, nil)
	bg := context.Background()
	const approve = `
name: approve
description: waits for an approval, then greets
search_attributes: [input.who]
input:
  type: object
  properties:
    who: {type: string, description: whom to greet}
    times: {type: integer}
  required: [who]
steps:
  - {id: approval, kind: wait, signal: approve}
  - {id: greet, kind: noop}
`
	s.apply(t, approve)
	s.apply(t, `
name: gated
lock: gate
steps:
  - {id: hold, kind: wait, signal: go}
`)
	ctx := browser(t)

	t.Log("a caller without a token is sent to log in; the admin token lets it in")
	run(t, ctx, "open the UI", chromedp.Navigate(s.info.APIURL+"/"), until(`location.hash.startsWith('#/login')`))
	screenshot(t, ctx, "login")
	run(t, ctx, "log in",
		chromedp.SendKeys(chromedp.CSS(`[data-testid=token]`), s.info.AdminToken),
		chromedp.Click(chromedp.CSS(`[data-testid=login]`)),
		until(`location.hash === '#/executions'`),
		until(`!!document.querySelector('[data-testid=executions]')`))

	t.Log("the list shows an execution started through the api on its next refresh")
	began := time.Now()
	_, err := s.c.Start(bg, client.StartRequest{Workflow: "approve", ID: "ui-1", Input: map[string]any{"who": "ops"}})
	require.NoError(t, err)
	run(t, ctx, "the list shows ui-1", until(`!!document.querySelector('[data-testid=executions] tr[data-id="ui-1"]')`))
	t.Logf("listed %s after the start was answered", time.Since(began).Round(time.Millisecond))
	screenshot(t, ctx, "executions")

	t.Log("the list filters by search attribute and by time range")
	run(t, ctx, "filter by a search attribute",
		chromedp.SendKeys(chromedp.CSS(`[data-testid=filter-attr]`), "who:ops"),
		chromedp.Click(chromedp.CSS(`[data-testid=filter]`)),
		until(`location.hash.includes('attr=who%3Aops')`),
		until(`document.querySelectorAll('[data-testid=executions] tr').length === 1 && !!document.querySelector('[data-testid=executions] tr[data-id="ui-1"]')`))
	run(t, ctx, "no execution has another value",
		chromedp.Navigate(s.info.APIURL+"/#/executions?attr=who%3Anobody"),
		until(`document.querySelector('[data-testid=counts]')?.textContent.includes('no executions')`))
	future := url.QueryEscape(time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	past := url.QueryEscape(time.Now().Add(-time.Hour).UTC().Format(time.RFC3339))
	run(t, ctx, "a range from an hour ago lists it, latest first",
		chromedp.Navigate(s.info.APIURL+"/#/executions?sort=started_desc&started_after="+past),
		until(`!!document.querySelector('[data-testid=executions] tr[data-id="ui-1"]')`),
		until(`document.querySelector('[data-testid=filter-sort]').value === 'started_desc'`))
	run(t, ctx, "a range after now lists none",
		chromedp.Navigate(s.info.APIURL+"/#/executions?started_after="+future),
		until(`document.querySelector('[data-testid=counts]')?.textContent.includes('no executions')`))
	run(t, ctx, "a bad filter is shown, naming it",
		chromedp.Navigate(s.info.APIURL+"/#/executions?sort=sideways"),
		until(`(document.querySelector('[data-testid=error]')?.textContent || '').includes('sort')`))

	t.Log("a search attribute value with a space, a colon and a comma filters, from the box and from the address")
	_, err = s.c.Start(bg, client.StartRequest{Workflow: "approve", ID: "ui-sp", Input: map[string]any{"who": "ops team: a,b"}})
	require.NoError(t, err)
	_, err = s.c.Start(bg, client.StartRequest{Workflow: "approve", ID: "ui-sp2", Input: map[string]any{"who": "ops team"}})
	require.NoError(t, err)
	onlyRow := func(id string) string {
		return fmt.Sprintf(`document.querySelectorAll('[data-testid=executions] tr').length === 1 && !!document.querySelector('[data-testid=executions] tr[data-id=%q]')`, id)
	}
	run(t, ctx, "filter from the box, the value quoted",
		chromedp.Navigate(s.info.APIURL+"/#/executions"),
		until(`!!document.querySelector('[data-testid=executions] tr[data-id="ui-sp"]') && !!document.querySelector('[data-testid=executions] tr[data-id="ui-sp2"]')`),
		chromedp.SendKeys(chromedp.CSS(`[data-testid=filter-attr]`), `who:"ops team: a,b"`),
		chromedp.Click(chromedp.CSS(`[data-testid=filter]`)),
		until(`location.hash.includes('attr=who%3Aops+team%3A+a%2Cb')`),
		until(onlyRow("ui-sp")))
	run(t, ctx, "the address holds it: opened again, the box shows it quoted",
		chromedp.Navigate(s.info.APIURL+"/#/executions?attr=who%3Aops+team"),
		until(onlyRow("ui-sp2")),
		chromedp.Navigate(s.info.APIURL+"/#/executions?attr=who%3Aops+team%3A+a%2Cb"),
		until(onlyRow("ui-sp")),
		until(`document.querySelector('[data-testid=filter-attr]').value === 'who:"ops team: a,b"'`))
	// The counts are of every execution of the workflow (GET
	// /v1/executions/_counts), not of the page: the page shows one of the
	// three started (ui-1, ui-sp, ui-sp2).
	run(t, ctx, "the counts are of every execution, not of the page",
		chromedp.Navigate(s.info.APIURL+"/#/executions?workflow=approve&attr=who%3Aops+team"),
		until(onlyRow("ui-sp2")),
		until(`document.querySelector('[data-testid=counts-scope]')?.textContent === 'All executions of approve:'`),
		until(`/total 3\b/.test(document.querySelector('[data-testid=counts]')?.textContent)`))

	t.Log("its page follows it live: a signal from the page lets it go on to succeeded")
	run(t, ctx, "open ui-1",
		chromedp.Navigate(s.info.APIURL+"/#/executions"),
		until(`!!document.querySelector('[data-testid=executions] tr[data-id="ui-1"] a')`),
		chromedp.Click(chromedp.CSS(`[data-testid=executions] tr[data-id="ui-1"] a`)),
		until(`location.hash === '#/executions/ui-1'`),
		until(statusIs("started")),
		until(offered("act-cancel")), until(offered("act-signal")), until(offered("act-resume")),
		until(`!!document.querySelector('[data-testid=steps] tr[data-step="approval"] .st-waiting')`),
		until(inTimeline(events.TypeExecutionStarted)))
	screenshot(t, ctx, "execution-waiting")
	run(t, ctx, "send the signal",
		chromedp.SendKeys(chromedp.CSS(`[data-testid=signal-name]`), "approve"),
		chromedp.SendKeys(chromedp.CSS(`[data-testid=signal-data]`), `{"by": "the UI"}`),
		chromedp.Click(chromedp.CSS(`[data-testid=act-signal]`)),
		until(inTimeline(events.TypeSignalReceived)),
		until(inTimeline(events.TypeExecutionSucceeded)),
		until(statusIs("succeeded")))
	run(t, ctx, "what an event carries is in its summary: the wait's success greet's dispatch, the end greet's success",
		until(summaryHas(events.TypeStepSucceeded, "then=dispatched:greet")),
		until(summaryHas(events.TypeExecutionSucceeded, "with=succeeded:greet")))
	run(t, ctx, "a succeeded execution offers a replay, not a cancel, a resume or a signal",
		until(offered("act-replay")),
		until(notOffered("act-cancel")), until(notOffered("act-kill")), until(notOffered("act-force-cancel")),
		until(notOffered("act-resume")), until(notOffered("act-signal")))
	screenshot(t, ctx, "execution-succeeded")
	x, err := s.c.Execution(bg, "ui-1")
	require.NoError(t, err)
	require.Len(t, x.Signals, 1)
	require.Equal(t, "approve", x.Signals[0].Name)
	require.JSONEq(t, `{"by": "the UI"}`, string(x.Signals[0].Data))

	t.Log("a workflow's page starts an execution from its input form; cancel and resume from the page are in the history")
	run(t, ctx, "start from the form",
		chromedp.Navigate(s.info.APIURL+"/#/workflows/approve"),
		until(`!!document.querySelector('[data-testid=definition]')`),
		chromedp.SendKeys(chromedp.CSS(`input[name=who]`), "form"),
		chromedp.SendKeys(chromedp.CSS(`input[name=times]`), "3"),
		chromedp.SendKeys(chromedp.CSS(`[data-testid=start-id]`), "ui-2"),
		chromedp.Click(chromedp.CSS(`[data-testid=start]`)),
		until(`location.hash === '#/executions/ui-2'`),
		until(statusIs("started")))
	x, err = s.c.Execution(bg, "ui-2")
	require.NoError(t, err)
	require.JSONEq(t, `{"who": "form", "times": 3}`, string(x.Input))
	run(t, ctx, "cancel from the page",
		chromedp.SendKeys(chromedp.CSS(`[data-testid=reason]`), "cancelled from the UI"),
		chromedp.Click(chromedp.CSS(`[data-testid=act-cancel]`)),
		until(inTimeline(events.TypeExecutionCancelled)),
		until(statusIs("cancelled")))
	run(t, ctx, "resume from the page",
		chromedp.Click(chromedp.CSS(`[data-testid=act-resume]`)),
		until(inTimeline(events.TypeExecutionResumed)),
		until(statusIs("started")))
	evs := s.history(t, "ui-2")
	n := countTypes(evs)
	require.Equal(t, 1, n[string(events.TypeExecutionCancelled)], "%v", n)
	require.Equal(t, 1, n[string(events.TypeExecutionResumed)], "%v", n)
	var cancelled *events.ExecutionCancelled
	for _, ev := range evs {
		if p, ok := ev.Data.(*events.ExecutionCancelled); ok {
			cancelled = p
		}
	}
	require.NotNil(t, cancelled)
	require.Equal(t, "cancelled from the UI", cancelled.Reason)
	require.Equal(t, "jetflow UI", cancelled.RequestedBy)
	screenshot(t, ctx, "execution-resumed")

	t.Log("the locks page shows a waiter; a force-clear from the page lets it acquire the lock")
	for _, id := range []string{"ui-g1", "ui-g2"} {
		_, err := s.c.Start(bg, client.StartRequest{Workflow: "gated", ID: id})
		require.NoError(t, err)
	}
	run(t, ctx, "the locks page shows the holder and the waiter",
		chromedp.Navigate(s.info.APIURL+"/#/locks"),
		until(`!!document.querySelector('[data-lock="gate"] [data-holder="ui-g1"]') && !!document.querySelector('[data-lock="gate"] [data-waiter="ui-g2"]')`))
	screenshot(t, ctx, "locks")
	run(t, ctx, "force-clear ui-g1's hold",
		chromedp.SendKeys(chromedp.CSS(`[data-testid=clear-reason]`), "stuck holder"),
		chromedp.Click(chromedp.CSS(`[data-holder="ui-g1"] [data-testid=clear]`)),
		chromedp.Click(chromedp.CSS(`[data-holder="ui-g1"] [data-testid=clear]`)), // the second click confirms
		until(`!!document.querySelector('[data-lock="gate"] [data-holder="ui-g2"]')`))
	l, err := s.c.Lock(bg, "gate")
	require.NoError(t, err)
	require.Equal(t, []string{"ui-g2"}, entryIDs(l.Holders))
	evs = s.history(t, "ui-g1")
	var cleared *events.LockCleared
	for _, ev := range evs {
		if p, ok := ev.Data.(*events.LockCleared); ok {
			cleared = p
		}
	}
	require.NotNil(t, cleared, "ui-g1's history records the clear")
	require.Equal(t, "stuck holder", cleared.Reason)

	t.Log("the workflows page lists both workflows")
	run(t, ctx, "workflows", chromedp.Navigate(s.info.APIURL+"/#/workflows"),
		until(`document.querySelectorAll('[data-testid=workflows] tr').length === 2`))
	screenshot(t, ctx, "workflows")
	run(t, ctx, "a workflow", chromedp.Navigate(s.info.APIURL+"/#/workflows/approve"), until(`!!document.querySelector('[data-testid=definition]')`))
	screenshot(t, ctx, "workflow")

	t.Log("the definition is shown as YAML, which reads back as the registered definition")
	shown := evaluate[string](t, ctx, `document.querySelector('[data-testid=definition][data-format=yaml]')?.textContent || ''`)
	require.True(t, strings.HasPrefix(shown, "name: approve\ndescription: waits for an approval, then greets\n"), "%s", shown)
	def, err := workflow.Parse([]byte(shown))
	require.NoError(t, err, "%s", shown)
	applied, err := workflow.Parse([]byte(approve))
	require.NoError(t, err)
	want, err := json.Marshal(applied)
	require.NoError(t, err)
	got, err := json.Marshal(def)
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(got), "%s", shown)

	t.Log("what a page shows is text: a value with markup in it is not run")
	_, err = s.c.Start(bg, client.StartRequest{Workflow: "approve", ID: "ui-3", Input: map[string]any{"who": `<img src=x onerror=window.pwned=1>`}})
	require.NoError(t, err)
	run(t, ctx, "open ui-3", chromedp.Navigate(s.info.APIURL+"/#/executions/ui-3"),
		until(`(document.querySelector('[data-testid=input]')?.textContent || '').includes('onerror')`),
		until(inTimeline(events.TypeExecutionStarted)))
	// Set as HTML, the input would be an element (whether or not the
	// policy then stopped its handler): it must be text only.
	elements := evaluate[int](t, ctx, `document.querySelector('[data-testid=input]').childElementCount + document.querySelectorAll('main img').length`)
	require.Zero(t, elements, "the input's markup became elements")
	pwned := evaluate[bool](t, ctx, `window.pwned === 1`)
	require.False(t, pwned, "the input's markup ran")

	t.Log("a read-only token is offered no action; an operate token its actions but a signal; the api still decides")
	reader, err := s.c.CreateKey(bg, client.KeyRequest{Name: "viewer", Scopes: []string{"read"}, Namespaces: []string{"default"}})
	require.NoError(t, err)
	operator, err := s.c.CreateKey(bg, client.KeyRequest{Name: "operator", Scopes: []string{"read", "operate"}, Namespaces: []string{"default"}})
	require.NoError(t, err)
	login(t, ctx, s.info.APIURL, reader.Token)
	run(t, ctx, "the header says who the token is",
		until(`document.getElementById('who').textContent.includes('viewer (read)')`))
	run(t, ctx, "a read-only token: every action disabled, naming the scope it needs",
		chromedp.Navigate(s.info.APIURL+"/#/executions/ui-3"),
		until(statusIs("started")),
		until(needsScope(`[data-testid=act-cancel]`, "operate")), until(needsScope(`[data-testid=act-kill]`, "operate")),
		until(needsScope(`[data-testid=act-resume]`, "operate")), until(needsScope(`[data-testid=act-signal]`, "signal")),
		until(`!!document.querySelector('[data-testid=read-only]')`))
	screenshot(t, ctx, "execution-read-only")
	run(t, ctx, "a read-only token: no start, no force-clear",
		chromedp.Navigate(s.info.APIURL+"/#/workflows/approve"),
		until(needsScope(`[data-testid=start]`, "start")),
		chromedp.Navigate(s.info.APIURL+"/#/locks"),
		until(needsScope(`[data-holder="ui-g2"] [data-testid=clear]`, "operate")))
	login(t, ctx, s.info.APIURL, operator.Token)
	run(t, ctx, "an operate token: the actions, not the signal",
		chromedp.Navigate(s.info.APIURL+"/#/executions/ui-3"),
		until(statusIs("started")),
		until(offered("act-cancel")), until(offered("act-resume")),
		until(needsScope(`[data-testid=act-signal]`, "signal")),
		until(`!document.querySelector('[data-testid=read-only]')`))
	run(t, ctx, "its cancel goes through",
		chromedp.Click(chromedp.CSS(`[data-testid=act-cancel]`)),
		until(statusIs("cancelled")),
		until(notOffered("act-cancel")), until(offered("act-resume")))
	x, err = s.c.Execution(bg, "ui-3")
	require.NoError(t, err)
	require.NotNil(t, x.Cancellation)
	require.NotNil(t, x.Cancellation.Actor)
	require.Equal(t, "operator", x.Cancellation.Actor.Subject)

	t.Log("a sleep's end records its timer's firing in the same event, and its wait the arming, and their summaries say so (docs/adr/0017, 0018)")
	s.apply(t, "name: nap\nsteps:\n  - {id: rest, kind: sleep, duration: 10ms}\n")
	_, err = s.c.Start(bg, client.StartRequest{Workflow: "nap", ID: "ui-nap"})
	require.NoError(t, err)
	run(t, ctx, "the end carries the sleep's success, which records the firing",
		chromedp.Navigate(s.info.APIURL+"/#/executions/ui-nap"),
		until(statusIs("succeeded")),
		until(summaryHas(events.TypeExecutionSucceeded, "with=succeeded:rest")),
		until(summaryHas(events.TypeExecutionSucceeded, "fired=t")),
		until(summaryHas(events.TypeStepWaiting, "timer=t")),
		until(summaryHas(events.TypeStepWaiting, "purpose=sleep")))
}
