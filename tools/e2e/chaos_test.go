package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/tools/internal/chaos"
)

// chaosProcess is a service binary running as its own process
// ([chaos.Process]), which the test SIGKILLs and starts again. Its output
// (the test runs it at log level warn) goes to the test log, which go
// test shows when the test fails.
type chaosProcess struct {
	*chaos.Process
	t *testing.T
}

func newChaosProcess(t *testing.T, name, bin string, args ...string) *chaosProcess {
	return &chaosProcess{t: t, Process: &chaos.Process{Name: name, Path: bin, Args: args,
		Log: &testLogWriter{t: t, prefix: name + ": "}}}
}

func (p *chaosProcess) start() {
	p.t.Helper()
	require.NoError(p.t, p.Start())
}

// kill SIGKILLs the process and waits until it is gone. The process must
// have been running: one that exited by itself fails the test.
func (p *chaosProcess) kill() {
	p.t.Helper()
	require.NoError(p.t, p.Kill())
}

// killed waits until the process, sent SIGKILL, is gone.
func (p *chaosProcess) killed() {
	p.t.Helper()
	require.NoError(p.t, p.Killed())
}

func (p *chaosProcess) requireRunning() {
	p.t.Helper()
	require.True(p.t, p.Running(), "%s (start %d) exited by itself", p.Name, p.Starts)
}

// stop kills the process, if it runs, and waits for it (test cleanup).
func (p *chaosProcess) stop() { p.Stop(0) }

// testLogWriter writes each line written to it to the test log.
type testLogWriter struct {
	t      *testing.T
	prefix string
	mu     sync.Mutex
	buf    []byte
}

func (w *testLogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.t.Log(w.prefix + string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}

// Flush writes what is left of a last line without its newline.
func (w *testLogWriter) Flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.t.Log(w.prefix + string(w.buf))
		w.buf = nil
	}
}

// TestLocksUnderSIGKILL is TestLocksUnderDispatcherCrashes with real
// processes: three jetflow-dispatcher and two jetflow-agent binaries run
// against one JetStream server, and the test SIGKILLs random ones (now and
// then every dispatcher at once, or everything; every third time an agent
// the moment it has stored a result, before it acknowledges the task) and
// starts them again while executions contend for a mutex, a semaphore of 3
// and a lock around a read-then-write counter. The holders' critical
// sections are exec steps that append their enter and exit to a file, and
// the counter is a file too, so the record comes from the operations
// themselves: no two holders of the mutex (no four of the semaphore) are
// ever inside at once, not even by an operation run again after its agent
// died, the counter counts every increment, every execution succeeds
// within the deadline (nobody waits forever) and the lock bucket ends
// empty.
//
// JETFLOW_CHAOS_SEED=n makes the same choices of victims and pauses as the
// run that logged it (the timing of the processes differs).
func TestLocksUnderSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos test: builds the service binaries and kills them")
	}
	t.Parallel()
	dispatcherBin, agentBin := buildService(t, "dispatcher"), buildService(t, "agent")
	srv := natstest.RunJetStream(t)
	nc, js := natstest.Connect(t, srv)

	dir := t.TempDir()
	marks, counter := filepath.Join(dir, "marks"), filepath.Join(dir, "counter")
	// One write of a short line with O_APPEND: lines from concurrent
	// commands never mix, and the file's order is the order they ran.
	note := func(wf, what string) string {
		return fmt.Sprintf(`{id: %s, kind: exec, command: sh, args: ["-c", "echo \"%s $JETFLOW_EXECUTION_ID %s\" >> \"$0\"", %q]}`,
			what, wf, what, marks)
	}
	// A holder of the semaphore stays in its enter until two executions
	// entered (itself and another, which is then inside with it), for at
	// most 20 s: a semaphore that lets in one holder at a time fails the
	// test instead of passing for a mutex.
	semaEnter := fmt.Sprintf(`{id: enter, kind: exec, command: sh, args: ["-c", "echo \"sema $JETFLOW_EXECUTION_ID enter\" >> \"$0\"; i=0; while [ $(grep '^sema .* enter$' \"$0\" | sort -u | wc -l) -lt 2 ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done", %q]}`,
		marks)
	applyWorkflows(t, js, `
name: mutex
lock: crit
steps:
  - `+note("mutex", "enter")+`
  - {id: hold, kind: sleep, duration: 15ms}
  - `+note("mutex", "exit")+`
`, `
name: sema
lock: pool
semaphore: 3
steps:
  - `+semaEnter+`
  - {id: hold, kind: sleep, duration: 30ms}
  - `+note("sema", "exit")+`
`, fmt.Sprintf(`
name: counter
steps:
  - id: increment
    kind: workflow
    lock: counter-${input.name}
    steps:
      - {id: read, kind: exec, command: sh, args: ["-c", "cat \"$0\" 2>/dev/null || echo 0", %[1]q]}
      # Write by rename: a write killed half-way (its agent SIGKILLed) never
      # leaves a torn counter, and a write run again writes the same value.
      - id: write
        kind: exec
        command: sh
        args: ["-c", "echo \"$1\" > \"$0.$$\" && mv \"$0.$$\" \"$0\"", %[1]q, "${int(trim(steps.read.output.stdout)) + 1}"]
`, counter))

	var procs, dispatchers []*chaosProcess
	for i := range 3 {
		p := newChaosProcess(t, fmt.Sprintf("dispatcher-%d", i), dispatcherBin,
			"-nats", srv.ClientURL(), "-ack-wait", "2s", "-workers", "8", "-log-level", "warn")
		procs, dispatchers = append(procs, p), append(dispatchers, p)
	}
	for i := range 2 {
		name := fmt.Sprintf("agent-%d", i)
		// A task whose agent is killed goes to the other agent after the
		// ack wait; it may be delivered many times in this test, and no
		// janitor runs to fail it.
		procs = append(procs, newChaosProcess(t, name, agentBin,
			"-nats", srv.ClientURL(), "-name", name, "-task-ack-wait", "1s", "-max-deliver", "1000",
			"-kill-grace", "1s", "-log-level", "warn", "-allow-exec"))
	}
	for _, p := range procs {
		t.Cleanup(p.stop)
		p.start()
	}

	seed := rand.Uint64()
	if s := os.Getenv("JETFLOW_CHAOS_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "JETFLOW_CHAOS_SEED")
	}
	t.Logf("JETFLOW_CHAOS_SEED=%d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))

	const perWorkflow = 25
	began := time.Now()
	ids := startLockExecutions(t, js, perWorkflow)
	stream, err := js.Stream(t.Context(), bus.StreamEvents)
	require.NoError(t, err)
	ended := func() int {
		n := 0
		for _, e := range ids {
			m, err := stream.GetLastMsgForSubject(t.Context(), bus.ExecutionSubject(e.wf, e.id))
			switch {
			case errors.Is(err, jetstream.ErrMsgNotFound):
				continue
			case timedOut(err):
				// A machine starved by other work (all the services
				// missed their renewals then): not known this round. The
				// ends are checked below, with patience of their own.
				continue
			}
			require.NoError(t, err)
			switch events.Type(m.Header.Get("ce-type")) {
			case events.TypeExecutionSucceeded, events.TypeExecutionFailed, events.TypeExecutionCancelled:
				n++
			}
		}
		return n
	}

	// The sniper kills an agent the moment one of its results is stored:
	// the agent dies between storing the result and acknowledging its task,
	// so JetStream hands the task to an agent again after the step has
	// ended, and maybe after its lock went to the next holder. Or the
	// moment it hands one straight to a dispatcher (docs/adr/0009): it dies
	// waiting for the answer, the dispatcher records the report, and the
	// task delivered again asks whether its attempt is over.
	agents := map[string]*chaosProcess{}
	for _, p := range procs[len(dispatchers):] {
		agents[p.Name] = p
	}
	var armed atomic.Bool
	sniped := make(chan *chaosProcess, 1)
	snipeOn := func(m *nats.Msg) {
		if !armed.Load() {
			return
		}
		ev, err := bus.Decode(m.Header, m.Data)
		if err != nil {
			return
		}
		r, ok := ev.Data.(*events.OperationSucceeded)
		if !ok || agents[r.Agent] == nil || !armed.CompareAndSwap(true, false) {
			return
		}
		p := agents[r.Agent]
		_ = p.Signal(syscall.SIGKILL)
		sniped <- p
	}
	sub, err := nc.Subscribe(bus.ResultsPrefix+".>", snipeOn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	// A subscription on jf.direct.> is interest there: while it lasts, an
	// agent whose report no dispatcher takes waits for an answer instead
	// of hearing "no responders" at once. So it lasts only while armed.
	armDirect := func() func() {
		sub, err := nc.Subscribe(bus.DirectPrefix+".>", snipeOn)
		require.NoError(t, err)
		return func() { _ = sub.Unsubscribe() }
	}
	snipe := func() *chaosProcess {
		disarm := armDirect()
		defer disarm()
		armed.Store(true)
		select {
		case p := <-sniped:
			return p
		case <-time.After(2 * time.Second):
			if armed.CompareAndSwap(true, false) {
				return nil // no result in 2 s
			}
			return <-sniped
		}
	}

	kill := func(ps ...*chaosProcess) []*chaosProcess {
		for _, p := range ps {
			p.kill()
		}
		return ps
	}

	// Kill while the executions contend: one process at a time mostly,
	// an agent right after it stored a result every third round, every
	// dispatcher at once every fourth round (nobody dispatches until they
	// are back), and everything once in a while.
	const maxRounds = 40
	rounds, killsWhileRunning, snipes := 0, 0, 0
	for ; rounds < maxRounds; rounds++ {
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		if ended() == len(ids) {
			break
		}
		var victims []*chaosProcess
		switch {
		case rounds%8 == 7:
			victims = kill(procs...)
		case rounds%4 == 3:
			victims = kill(dispatchers...)
		case rounds%3 == 1:
			if p := snipe(); p != nil {
				p.killed()
				snipes++
				victims = []*chaosProcess{p}
			}
		default:
			victims = kill(procs[rng.IntN(len(procs))])
		}
		killsWhileRunning += len(victims)
		time.Sleep(time.Duration(50+rng.IntN(350)) * time.Millisecond)
		for _, p := range victims {
			p.start()
		}
	}
	chaos := time.Since(began)
	left := len(ids) - ended()

	requireLockExecutionsSucceeded(t, js, ids, 60*time.Second)
	for _, p := range procs {
		p.requireRunning()
	}
	var kills []string
	for _, p := range procs {
		kills = append(kills, fmt.Sprintf("%s %d", p.Name, p.Kills))
	}
	t.Logf("%d executions: %d kill rounds, %d SIGKILLs (%s; %d agents right after a result) in %s; %d executions still running after the last kill, all ended %s after the start",
		len(ids), rounds, killsWhileRunning, strings.Join(kills, ", "), snipes, chaos.Round(time.Millisecond), left, time.Since(began).Round(time.Millisecond))
	require.Positive(t, killsWhileRunning, "nothing was killed while the executions ran")

	log := readMarks(t, marks)
	for _, e := range ids {
		if e.wf == "counter" {
			continue
		}
		require.Contains(t, log, mark{workflow: e.wf, execution: e.id, enter: true}, "%s never entered", e.id)
		require.Contains(t, log, mark{workflow: e.wf, execution: e.id, enter: false}, "%s never left", e.id)
	}
	most := maxInside(log)
	if most["mutex"] != 1 || most["sema"] > 3 || most["sema"] < 2 {
		b, _ := os.ReadFile(marks)
		t.Logf("enter and exit marks, in order:\n%s", b)
	}
	require.Equal(t, 1, most["mutex"], "holders of the mutex overlapped")
	require.LessOrEqual(t, most["sema"], 3, "more than 3 holders of the semaphore at once")
	require.GreaterOrEqual(t, most["sema"], 2, "never two holders of the semaphore of 3 at once")
	b, err := os.ReadFile(counter)
	require.NoError(t, err)
	require.Equal(t, strconv.Itoa(perWorkflow), strings.TrimSpace(string(b)),
		"an increment was lost (or made twice): two read-then-write sections overlapped")
}

// readMarks reads the enter and exit lines the exec steps appended:
// "<workflow> <execution> enter|exit".
func readMarks(t *testing.T, path string) []mark {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var log []mark
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		require.Len(t, f, 3, "malformed mark %q", line)
		require.Contains(t, []string{"enter", "exit"}, f[2], "malformed mark %q", line)
		log = append(log, mark{workflow: f[0], execution: f[1], enter: f[2] == "enter"})
	}
	return log
}
