package chaos

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"jetflow.dev/pkg/client"
)

// The workflows of the mix. Every exec step first appends a run mark
// ("run EXECUTION STEP ATTEMPT") to the marks file, with one write of a
// short line in append mode (lines never mix, and the file's order is the
// order they ran), then takes a little time: a kill lands while it runs,
// and a run again after its agent died shows as a second mark for the
// same attempt. The holders of a lock mark their enter and exit too.
const (
	wfExec    = "chaos-exec"
	wfHTTP    = "chaos-http"
	wfSleep   = "chaos-sleep"
	wfWait    = "chaos-wait"
	wfMutex   = "chaos-mutex"
	wfSema    = "chaos-sema"
	wfForeach = "chaos-foreach"
)

// mix is the order in which executions of each workflow are started:
// every workflow in turn, the exec-heavy ones more often.
var mix = []string{wfExec, wfHTTP, wfSleep, wfWait, wfForeach, wfExec, wfMutex, wfHTTP, wfSema, wfForeach}

// Lock names and the holders each allows.
const (
	lockMutex = "chaos-mutex"
	lockSema  = "chaos-pool"
	semaLimit = 3
)

// signalName is the signal the wait workflow waits for.
const signalName = "go"

// runMark is a shell command that appends the run mark of the step.
const runMark = `echo "run $JETFLOW_EXECUTION_ID $JETFLOW_STEP_ID $JETFLOW_ATTEMPT" >> "$0"`

// execStep is an exec step that marks its run, then runs script; $0 is
// the marks file.
func execStep(id, marks, script string) string {
	return fmt.Sprintf(`{id: %s, kind: exec, command: sh, args: ["-c", %q, %q]}`, id, runMark+"; "+script, marks)
}

// workflows returns the definitions of the mix, writing marks to marks.
// The http step has a timeout of 60 s: a node kill in a cluster holds
// tasks back for 10 to 20 s on a loaded 2-core machine, and a tighter
// timeout fails steps that the checker then counts (not as violations).
func workflows(marks string) []string {
	step := func(id, script string) string { return execStep(id, marks, script) }
	enter := func(lock string) string {
		return fmt.Sprintf(`echo "enter %s $JETFLOW_EXECUTION_ID" >> "$0"; sleep 0.05`, lock)
	}
	exit := func(lock string) string {
		return fmt.Sprintf(`sleep 0.05; echo "exit %s $JETFLOW_EXECUTION_ID" >> "$0"`, lock)
	}
	return []string{
		fmt.Sprintf("name: %s\nsteps:\n  - %s\n  - {id: between, kind: noop}\n  - %s\n",
			wfExec, step("first", "sleep 0.3"), step("second", "sleep 0.1")),
		fmt.Sprintf("name: %s\nsteps:\n  - {id: get, kind: http, url: '${input.url}', timeout: 60s}\n  - %s\n",
			wfHTTP, step("after", "sleep 0.1")),
		fmt.Sprintf("name: %s\nsteps:\n  - {id: nap, kind: sleep, duration: 1s}\n  - %s\n",
			wfSleep, step("after", "sleep 0.1")),
		fmt.Sprintf("name: %s\nsteps:\n  - {id: hold, kind: wait, signals: [%s]}\n  - %s\n",
			wfWait, signalName, step("after", "sleep 0.1")),
		fmt.Sprintf("name: %s\nlock: %s\nsteps:\n  - %s\n  - %s\n",
			wfMutex, lockMutex, step("enter", enter(lockMutex)), step("exit", exit(lockMutex))),
		fmt.Sprintf("name: %s\nlock: %s\nsemaphore: %d\nsteps:\n  - %s\n  - %s\n",
			wfSema, lockSema, semaLimit, step("enter", enter(lockSema)+"; sleep 0.2"), step("exit", exit(lockSema))),
		fmt.Sprintf("name: %s\nsteps:\n  - id: each\n    kind: foreach\n    items: [1, 2, 3, 4]\n    concurrency: 2\n    steps:\n      - %s\n",
			wfForeach, step("op", "sleep 0.15")),
	}
}

// retry calls fn until it succeeds, a client error says it never will, or
// within passes: the api is killed too, and a request it did not answer
// is sent again (the same start or signal again is recognised).
func retry(ctx context.Context, within time.Duration, fn func(context.Context) error) error {
	deadline := time.Now().Add(within)
	for {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := fn(rctx)
		cancel()
		if err == nil {
			return nil
		}
		var apiErr *client.Error
		if errors.As(err, &apiErr) && apiErr.Status < 500 && apiErr.Status != http.StatusTooManyRequests {
			return err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not within %s: %w", within, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}
