package chaos

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/tools/internal/chaoscheck"
)

// DrillConfig configures ModeDrills. Each drill puts a steady load of
// executions on the cluster (a chain of short exec steps; one in four a
// wait for a signal the user sends, some with an operator's action
// before it), injects its fault after LeadIn, and keeps the load for Tail
// after the fault is over (the victim back); then it waits for its
// executions to end.
type DrillConfig struct {
	// Only names the drills to run, in their order ([DrillNames]); empty:
	// all of them.
	Only []string
	// Rate of starts per second during a drill. Default 8 (the
	// commands-leader drill starts twice as fast: a burst).
	Rate float64
	// LeadIn is the load before the fault, Tail the load after it.
	// Defaults 2s and 3s.
	LeadIn, Tail time.Duration
	// Down is how long a killed leader node stays down. Default 1s.
	Down time.Duration
	// NodeDown is how long the killed non-leader node stays down before it
	// is started again. Default 15s.
	NodeDown time.Duration
	// Restart is how long a killed dispatcher, agent or api stays down
	// (a supervisor starting it again). Default 5s.
	Restart time.Duration
	// Stop is how long the starved-dispatcher drill SIGSTOPs the lone
	// dispatcher. Default 2s.
	Stop time.Duration
	// Budget is the longest stall a drill may cause (reported: a loaded
	// machine cannot promise it). Default 5s.
	Budget time.Duration
	// DispatcherAckWait and TaskAckWait, if set, replace the topology's
	// defaults (bootstrap and services), to measure other settings.
	DispatcherAckWait, TaskAckWait time.Duration
}

func (c DrillConfig) withDefaults() (DrillConfig, error) {
	c.Rate = cmp.Or(c.Rate, 8)
	c.LeadIn = cmp.Or(c.LeadIn, 2*time.Second)
	c.Tail = cmp.Or(c.Tail, 3*time.Second)
	c.Down = cmp.Or(c.Down, time.Second)
	c.NodeDown = cmp.Or(c.NodeDown, 15*time.Second)
	c.Restart = cmp.Or(c.Restart, 5*time.Second)
	c.Stop = cmp.Or(c.Stop, 2*time.Second)
	c.Budget = cmp.Or(c.Budget, 5*time.Second)
	for _, name := range c.Only {
		if !slices.Contains(DrillNames(), name) {
			return c, fmt.Errorf("chaos: unknown drill %q (drills: %s)", name, strings.Join(DrillNames(), ", "))
		}
	}
	if c.Rate <= 0 || c.LeadIn < 0 || c.Tail < 0 || c.Down < 0 || c.NodeDown < 0 || c.Restart < 0 || c.Stop < 0 {
		return c, errors.New("chaos: drill rate must be positive and durations not negative")
	}
	return c, nil
}

// describe says a drill's what with the durations it names (NodeDown,
// Down, Restart, Stop) as configured.
func (c DrillConfig) describe(what string) string {
	return strings.NewReplacer("NodeDown", c.NodeDown.String(), "Down", c.Down.String(),
		"Restart", c.Restart.String(), "Stop", c.Stop.String()).Replace(what)
}

// drill is one named failure: prepare runs before the load, fault while
// it runs, finish once the drill's executions have ended.
type drill struct {
	name, what string
	burst      bool // starts at twice the rate
	prepare    func(ctx context.Context, r *run, res *DrillResult) error
	fault      func(ctx context.Context, r *run, res *DrillResult) error
	finish     func(ctx context.Context, r *run, res *DrillResult) error
}

// drills are the drills in the order they run (issue 16's table, then a
// dispatcher starved of CPU).
var drills = []drill{
	{name: "none", what: "no failure: the load alone (the baseline of the stalls)",
		fault: func(context.Context, *run, *DrillResult) error { return nil }},
	{name: "events-leader", what: "SIGKILL of the node leading the events stream (and its share of the dispatchers' consumers), back after Down",
		fault: func(ctx context.Context, r *run, res *DrillResult) error {
			return r.killNodeLeading(ctx, res, bus.StreamEvents, r.cfg.Drills.Down)
		}},
	{name: "events-leader-stop", what: "the node leading the events stream stopped as for maintenance (SIGTERM: it hands its leaderships over first), back after Down",
		fault: func(ctx context.Context, r *run, res *DrillResult) error {
			return r.stopNodeLeading(ctx, res, bus.StreamEvents, syscall.SIGTERM, r.cfg.Drills.Down)
		}},
	{name: "events-leader-ldm", what: "the node leading the events stream put in lame duck mode (SIGUSR2: leaderships handed over, clients moved, then it stops), back after Down",
		fault: func(ctx context.Context, r *run, res *DrillResult) error {
			return r.stopNodeLeading(ctx, res, bus.StreamEvents, syscall.SIGUSR2, r.cfg.Drills.Down)
		}},
	{name: "node", what: "SIGKILL of a node leading neither the events nor the commands stream, started again after NodeDown",
		fault: func(ctx context.Context, r *run, res *DrillResult) error {
			return r.killNodeLeading(ctx, res, "", r.cfg.Drills.NodeDown)
		}},
	{name: "commands-leader", what: "SIGKILL of the node leading the commands stream during a burst of starts, back after Down", burst: true,
		fault: func(ctx context.Context, r *run, res *DrillResult) error {
			return r.killNodeLeading(ctx, res, bus.StreamCommands, r.cfg.Drills.Down)
		}},
	{name: "dispatcher", what: "SIGKILL of one of two dispatchers while results come in, started again after Restart",
		fault: func(ctx context.Context, r *run, res *DrillResult) error {
			return r.killService(ctx, res, "dispatcher-1")
		}},
	{name: "agent", what: "SIGKILL of one of two agents while it runs exec steps, started again after Restart",
		fault: func(ctx context.Context, r *run, res *DrillResult) error {
			return r.killService(ctx, res, "agent-1")
		}},
	{name: "api", what: "SIGKILL of one of two apis during the starts (the user's client turns to the other), started again after Restart",
		fault: func(ctx context.Context, r *run, res *DrillResult) error {
			return r.killService(ctx, res, "api-1")
		}},
	{name: "starved-dispatcher", what: "the lone dispatcher (the other stopped) SIGSTOPped for Stop, then SIGCONT: its leases expire under it",
		prepare: prepareLoneDispatcher, fault: starveDispatcher, finish: finishLoneDispatcher},
}

// DrillNames lists the drills, in the order they run.
func DrillNames() []string {
	var out []string
	for _, d := range drills {
		out = append(out, d.name)
	}
	return out
}

// DrillResult is what one drill measured.
type DrillResult struct {
	// Name and What name the drill; Victim says what was hit.
	Name, What, Victim string
	// At is when the fault began.
	At time.Time
	// Started counts the starts sent, Accepted those accepted.
	Started, Accepted int
	// Signals and Actions count the signals and the operator's actions
	// sent to the drill's executions, as the starts.
	Signals, Actions Requests
	// Failed are the requests a user saw fail (starts, signals, actions):
	// any answer but success after pkg/client's own retries of 503 (and
	// turning to the other api when one cannot be reached), and an action
	// answered recorded that its history does not hold.
	Failed []string
	// Raw counts the 5xx answers the apis gave (retried or not), by status.
	Raw map[int]int
	// Back is when the fault was over (the victim back, the cluster
	// whole); InFault counts the requests first sent between At and Back.
	Back    time.Time
	InFault InFault
	// Stall is the longest time any of the drill's executions made no
	// progress (between its start's sending and its events, and between
	// consecutive events) after the fault began; StallOf is that execution.
	Stall   time.Duration
	StallOf string
	// OverBudget counts the executions with a stall over the budget.
	OverBudget int
	// Reruns are step attempts that ran again after the agent running
	// them was killed (allowed: at least once); LiveTwice those that ran
	// twice while the agent that ran them first still lived, with Twice
	// saying which.
	Reruns, LiveTwice int
	Twice             []string
	// Violations are the checker's findings about the drill's executions.
	Violations int
	// TakenBack and Lost count, for the starved dispatcher, the leases
	// that expired under it and that it took back without a release, and
	// the partitions it lost (released, to be taken again).
	TakenBack, Lost int
	// Note tells more.
	Note string

	logFrom int64       // the starved dispatcher's log before the drill
	sends   []drillSend // every request's first sending
}

// InFault counts the requests of each kind sent while a fault lasted.
type InFault struct {
	Starts, Signals, Actions int
}

// drillSend is the first sending of a request of kind.
type drillSend struct {
	kind string // start, signal, action
	at   time.Time
}

// Requests counts one kind of request a drill sent: Sent, Accepted (a
// success, after the client's retries), Failed (anything else).
type Requests struct {
	Sent, Accepted, Failed int
}

// drillState is what the drills keep besides the run's state.
type drillState struct {
	marks   string           // the exec steps' start and done marks
	users   []*client.Client // one per api, as a user would hold them
	next    atomic.Uint64    // round robin over users
	raw     *countingTransport
	mu      sync.Mutex
	execs   map[string]*drillExec // the accepted starts, by execution id (guarded by run.mu)
	killed  map[int]time.Time     // agents' pids killed, and when
	results []DrillResult
}

// drillExec is one execution a drill started, as its user saw it.
type drillExec struct {
	drill, workflow string
	// sent is its start's first sending; asked the sending of the user's
	// later requests that were accepted (its action, its signal).
	sent  time.Time
	asked []time.Time
	// command is the command key of its accepted action ("": none).
	command string
	// unsignalled: it waits for a signal that was never accepted (a
	// failure counted already): it cannot end.
	unsignalled bool
}

// countingTransport counts the 5xx answers it carries.
type countingTransport struct {
	rt http.RoundTripper
	mu sync.Mutex
	by map[int]int
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.rt.RoundTrip(req)
	if err == nil && resp.StatusCode >= 500 {
		c.mu.Lock()
		c.by[resp.StatusCode]++
		c.mu.Unlock()
	}
	return resp, err
}

// take returns the counts so far and starts again from zero.
func (c *countingTransport) take() map[int]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.by
	c.by = map[int]int{}
	return out
}

// The drills' workflows. wfDrill is a chain of exec steps, each marking
// its start and its end (with the agent's pid and the time) and taking
// 0.4 s. wfDrillSignal waits for the signal signalName, which the drill
// sends as a user would once its start is accepted, then runs one such
// step.
const (
	wfDrill       = "drill-chain"
	wfDrillSignal = "drill-signal"
)

// drillWorkflows returns the drills' definitions, their exec steps
// marking to marks.
func drillWorkflows(marks string) []string {
	step := func(id string) string {
		mark := func(what string) string {
			return fmt.Sprintf(`echo "%s $JETFLOW_EXECUTION_ID $JETFLOW_STEP_ID $JETFLOW_ATTEMPT $PPID $(date +%%s%%N)" >> "$0"`, what)
		}
		script := mark("start") + "; sleep 0.4; " + mark("done")
		return fmt.Sprintf("  - {id: %s, kind: exec, command: sh, args: [\"-c\", %q, %q]}\n", id, script, marks)
	}
	var chain strings.Builder
	fmt.Fprintf(&chain, "name: %s\nsteps:\n", wfDrill)
	for i := range 5 {
		chain.WriteString(step(fmt.Sprintf("s%d", i+1)))
	}
	signal := fmt.Sprintf("name: %s\nsteps:\n  - {id: hold, kind: wait, signals: [%s]}\n%s", wfDrillSignal, signalName, step("s1"))
	return []string{chain.String(), signal}
}

// startDrillServices starts two apis (on fixed ports, as a user's client
// knows them), two dispatchers, two agents of one queue and a janitor.
func (r *run) startDrillServices(tokenFile string) error {
	ports, err := freePorts(2)
	if err != nil {
		return err
	}
	r.apiURLs = map[string]string{}
	host := strings.TrimPrefix(r.web.URL, "http://")
	type instance struct {
		name, kind string
		env        []string
	}
	var list []instance
	for i := range 2 {
		n := strconv.Itoa(i + 1)
		addr := fmt.Sprintf("127.0.0.1:%d", ports[i])
		r.apiURLs["api-"+n] = "http://" + addr
		list = append(list, instance{"api-" + n, "api", []string{"JETFLOW_HTTP_ADDR=" + addr, "JETFLOW_ADMIN_TOKEN_FILE=" + tokenFile}})
	}
	for i := range 2 {
		n := strconv.Itoa(i + 1)
		env := []string{"JETFLOW_DISPATCHER_MEMBER=d" + n}
		if w := r.cfg.Drills.DispatcherAckWait; w > 0 {
			env = append(env, "JETFLOW_DISPATCH_ACK_WAIT="+w.String())
		}
		list = append(list, instance{"dispatcher-" + n, "dispatcher", env})
	}
	for i := range 2 {
		n := strconv.Itoa(i + 1)
		list = append(list, instance{"agent-" + n, "agent", []string{"JETFLOW_AGENT_NAME=drill-agent-" + n,
			"JETFLOW_AGENT_ALLOW_EXEC=true", "JETFLOW_AGENT_EXEC_ALLOW=sh", "JETFLOW_AGENT_HTTP_ALLOW_HOSTS=" + host,
			"JETFLOW_TASK_MAX_DELIVER=50", "JETFLOW_CONCURRENCY=32"}})
		if w := r.cfg.Drills.TaskAckWait; w > 0 {
			list[len(list)-1].env = append(list[len(list)-1].env, "JETFLOW_TASK_ACK_WAIT="+w.String())
		}
	}
	list = append(list, instance{"janitor", "janitor", []string{"JETFLOW_IDLE_AFTER=10s", "JETFLOW_RETENTION_DEFAULT=forever"}})
	bins := map[string]string{"api": r.cfg.Bin.API, "dispatcher": r.cfg.Bin.Dispatcher, "agent": r.cfg.Bin.Agent, "janitor": r.cfg.Bin.Janitor}
	for _, in := range list {
		log, err := r.logFile(in.name)
		if err != nil {
			return err
		}
		env := []string{"JETFLOW_NATS_URL=" + r.url, "JETFLOW_LOG_LEVEL=warn", fmt.Sprintf("JETFLOW_REPLICAS=%d", r.replicas),
			"JETFLOW_NATS_CREDS=" + filepath.Join(r.authDir, auth.DefaultNamespace, auth.CredsFile(auth.Role(in.kind)))}
		p := &Process{Name: in.name, Path: bins[in.kind], Env: append(env, in.env...), Log: log}
		r.services[in.name] = p
		r.order = append(r.order, in.name)
		if err := r.startService(p); err != nil {
			return err
		}
	}
	r.drills.raw = &countingTransport{rt: http.DefaultTransport, by: map[int]int{}}
	for _, name := range []string{"api-1", "api-2"} {
		c := client.New(r.apiURLs[name], client.WithToken(r.token))
		c.HTTP = &http.Client{Transport: r.drills.raw}
		r.drills.users = append(r.drills.users, c)
	}
	r.api.Store(client.New(r.apiURLs["api-1"], client.WithToken(r.token)))
	return nil
}

// waitAPI waits until the api process p answers at url.
func (r *run) waitAPI(p *Process, url string) error {
	c := client.New(url, client.WithToken(r.token))
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := c.Settings(ctx)
		cancel()
		if err == nil {
			return nil
		}
		if !p.Running() {
			return fmt.Errorf("chaos: %s exited: %s", p.Name, p.state())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: %s did not answer within a minute: %w", p.Name, err)
		}
	}
}

// runDrills runs the drills one after another, then checks every
// history.
func (r *run) runDrills(ctx context.Context, began time.Time) (*Report, error) {
	dc := r.cfg.Drills
	r.drills.execs, r.drills.killed = map[string]*drillExec{}, map[int]time.Time{}
	fmt.Fprintf(r.cfg.Progress, "chaos: drills on a 3-node cluster, %.0f starts/s, data in %s\n", dc.Rate, r.cfg.Dir)
	for _, d := range drills {
		if len(dc.Only) > 0 && !slices.Contains(dc.Only, d.name) {
			continue
		}
		res, err := r.runDrill(ctx, d)
		if err != nil {
			return nil, fmt.Errorf("drill %s: %w", d.name, err)
		}
		r.drills.results = append(r.drills.results, res)
	}
	if err := r.waitProjected(ctx); err != nil {
		return nil, err
	}
	for _, p := range r.processes() {
		if !p.Running() {
			return nil, r.exitedByItself(p)
		}
	}
	var in chaoscheck.Input
	var err error
	for tries := 1; ; tries++ {
		if in, err = r.collect(ctx); err == nil || tries == 10 || ctx.Err() != nil {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		return nil, err
	}
	check := chaoscheck.Check(in)
	marks, err := readDrillMarks(r.drills.marks)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.drills.results {
		res := &r.drills.results[i]
		ofDrill := func(id string) bool { x := r.drills.execs[id]; return x != nil && x.drill == res.Name }
		for _, id := range slices.Sorted(maps.Keys(in.Executions)) {
			x, ok := r.drills.execs[id]
			if !ok || x.drill != res.Name {
				continue
			}
			evs := in.Executions[id].Events
			stall := stallAfter(x.sent, evs, res.At, x.asked...)
			if stall > res.Stall {
				res.Stall, res.StallOf = stall, id
			}
			if stall > dc.Budget {
				res.OverBudget++
			}
			if x.command != "" && !recordsAction(evs, x.command) {
				// The api answered it recorded: its history must hold it.
				msg := fmt.Sprintf("action %s %s: answered recorded (command %s), but its history holds no record of it", drillAction, id, x.command)
				res.Actions.Accepted--
				res.Actions.Failed++
				res.Failed = append(res.Failed, msg)
				r.failures = append(r.failures, fmt.Sprintf("drill %s: %s", res.Name, msg))
			}
		}
		for _, v := range check.Violations {
			if ofDrill(v.Execution) {
				res.Violations++
			}
		}
		res.Reruns, res.LiveTwice, res.Twice = runsAgain(marks, ofDrill, r.drills.killed)
	}
	started := 0
	for _, res := range r.drills.results {
		started += res.Started
	}
	return &Report{Mode: r.cfg.Mode, Seed: r.cfg.Seed, Dir: r.cfg.Dir, Started: started, Accepted: len(r.accepted),
		Signals: len(r.signals), Failures: r.failures, Check: check, Took: time.Since(began), Drills: slices.Clone(r.drills.results),
		Budget: dc.Budget}, nil
}

// recordsAction reports whether a history records the action command.
func recordsAction(evs []events.Event, command string) bool {
	for _, ev := range evs {
		if p, ok := ev.Data.(*events.ExecutionResumed); ok && p.Command == command {
			return true
		}
	}
	return false
}

// runDrill runs one drill: load, fault, more load, then waits for the
// drill's executions to end and the cluster to be whole again.
func (r *run) runDrill(ctx context.Context, d drill) (DrillResult, error) {
	dc := r.cfg.Drills
	res := DrillResult{Name: d.name, What: dc.describe(d.what)}
	fmt.Fprintf(r.cfg.Progress, "chaos: drill %s: %s\n", d.name, res.What)
	if d.prepare != nil {
		if err := d.prepare(ctx, r, &res); err != nil {
			return res, err
		}
	}
	_ = r.drills.raw.take()
	rate := dc.Rate
	if d.burst {
		rate *= 2
	}
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var mu sync.Mutex // guards res's counts while the load runs
	var wg sync.WaitGroup
	loaded := make(chan struct{})
	go func() {
		defer close(loaded)
		every := time.Duration(float64(time.Second) / rate)
		for i := 0; ; i++ {
			u := drillUser{workflow: wfDrill}
			if i%4 == 3 { // one in four waits for its user's signal; every other one of them is acted on first
				u = drillUser{workflow: wfDrillSignal, delay: time.Duration(100+r.starts.IntN(401)) * time.Millisecond}
				if i%8 == 3 {
					u.act, u.actAfter = true, time.Duration(100+r.starts.IntN(1901))*time.Millisecond
				}
			}
			u.id = fmt.Sprintf("%s-%s-%04d", u.workflow, d.name, i)
			wg.Go(func() { r.runUser(ctx, u, &res, &mu) })
			select {
			case <-loadCtx.Done():
				return
			case <-time.After(every):
			}
		}
	}()
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(dc.LeadIn):
	}
	res.At = time.Now()
	faultErr := d.fault(ctx, r, &res)
	mu.Lock()
	res.Back = time.Now()
	mu.Unlock()
	if faultErr == nil {
		select {
		case <-ctx.Done():
		case <-time.After(dc.Tail):
		}
	}
	stopLoad()
	<-loaded
	wg.Wait()
	res.Raw = r.drills.raw.take()
	res.InFault = countInFault(res.sends, res.At, res.Back)
	if faultErr != nil {
		return res, faultErr
	}
	if err := r.waitDrillEnded(ctx, d.name, 2*time.Minute); err != nil {
		return res, err
	}
	if d.finish != nil {
		if err := d.finish(ctx, r, &res); err != nil {
			return res, err
		}
	}
	if err := waitJetStream(ctx, r.js, r.replicas, 2*time.Minute); err != nil {
		return res, err
	}
	victim := ""
	if res.Victim != "" {
		victim = "; " + res.Victim
	}
	fmt.Fprintf(r.cfg.Progress, "chaos: drill %s done: %d of %d starts, %d of %d signals, %d of %d actions accepted%s\n", d.name,
		res.Accepted, res.Started, res.Signals.Accepted, res.Signals.Sent, res.Actions.Accepted, res.Actions.Sent, victim)
	return res, nil
}

// drillUser is what one user of a drill does: start an execution of
// workflow, and for wfDrillSignal, once the start is accepted, send an
// operator's action if act (actAfter later: an operator takes a moment,
// so the actions of executions started before the fault are sent during
// it), then the signal after delay.
type drillUser struct {
	id, workflow    string
	act             bool
	actAfter, delay time.Duration
}

// drillAction is the operator's action the drills send: a resume of an
// execution that waits for its signal. The api offers no action that
// pauses an execution and lets it go on (there is no suspend: an
// execution is suspended only by its own failure with wait_after_fail),
// and cancel, force-cancel and kill end it. A resume of a started
// execution is allowed and ends nothing: it records
// io.jetflow.execution.resumed with a new execution token and runs no
// step again (it resets only failed steps and steps waiting for a retry;
// a task already sent keeps its token and its result is waited for). It
// goes through the same path as every action (the command, the
// dispatcher's decision, the api waiting for its record). It is sent
// while the execution waits for its signal, before the signal, so it
// cannot find the execution ended (a conflict); answered 202 (stored,
// not yet recorded), it is sent again with the same key until it is
// recorded, so that the signal cannot overtake it. It may be sent while
// the start is accepted but not yet recorded (the start waits for the
// events stream's new leader): the dispatcher handles it once the start
// is (the api refused it with a 409 "has already pending" until a drill
// run found it).
const drillAction = events.ActionResume

// errNotRecorded is an action answered 202: stored, not yet recorded.
var errNotRecorded = errors.New("stored, not yet recorded")

// runUser runs one user of a drill (drillUser's fields). mu guards
// res's counts; it is taken before r.mu (the only place the two are held
// together).
func (r *run) runUser(ctx context.Context, u drillUser, res *DrillResult, mu *sync.Mutex) {
	// fail records a request that failed; mu is held.
	fail := func(what string, err error) {
		res.Failed = append(res.Failed, fmt.Sprintf("%s %s: %v", what, u.id, err))
		r.mu.Lock()
		r.failures = append(r.failures, fmt.Sprintf("drill %s: %s %s: %v", res.Name, what, u.id, err))
		r.mu.Unlock()
	}
	count := func(n *Requests, what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			n.Failed++
			fail(what, err)
			return
		}
		n.Accepted++
	}
	sent := time.Now()
	mu.Lock()
	res.Started++
	res.sends = append(res.sends, drillSend{"start", sent})
	mu.Unlock()
	req := client.StartRequest{Workflow: u.workflow, ID: u.id, IdempotencyKey: "start-" + u.id}
	err := r.asUser(ctx, nil, func(ctx context.Context, c *client.Client) error {
		_, err := c.Start(ctx, req)
		return err
	})
	mu.Lock()
	if err != nil {
		fail("start", err)
		mu.Unlock()
		return
	}
	x := &drillExec{drill: res.Name, workflow: u.workflow, sent: sent, unsignalled: u.workflow == wfDrillSignal}
	res.Accepted++
	r.mu.Lock()
	r.accepted = append(r.accepted, u.id)
	r.waiting[u.id] = false
	r.drills.execs[u.id] = x
	r.mu.Unlock()
	mu.Unlock()
	if u.workflow != wfDrillSignal {
		return
	}
	// "Not found" while the start is on its way (accepted, not yet
	// recorded) is sent again, as the chaos suite's user does.
	notYet := func(err error) bool { return client.IsStatus(err, http.StatusNotFound) }
	if u.act {
		select {
		case <-ctx.Done():
			return
		case <-time.After(u.actAfter):
		}
		mu.Lock()
		res.Actions.Sent++
		mu.Unlock()
		asked, command := time.Now(), ""
		again := func(err error) bool { return notYet(err) || errors.Is(err, errNotRecorded) }
		mu.Lock()
		res.sends = append(res.sends, drillSend{"action", asked})
		mu.Unlock()
		err := r.asUser(ctx, again, func(ctx context.Context, c *client.Client) error {
			a, err := c.Act(client.WithIdempotencyKey(ctx, drillAction+"-"+u.id), u.id,
				client.ActionRequest{Action: drillAction, Reason: "a drill: an operator's action during the fault", RequestedBy: "jetflow-chaos"})
			if err == nil && !a.Recorded {
				return fmt.Errorf("command %s: %w", a.Command, errNotRecorded)
			}
			command = a.Command
			return err
		})
		if err == nil {
			r.mu.Lock()
			x.asked, x.command = append(x.asked, asked), command
			r.mu.Unlock()
		}
		count(&res.Actions, "action "+drillAction, err)
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(u.delay):
	}
	asked := time.Now()
	mu.Lock()
	res.Signals.Sent++
	res.sends = append(res.sends, drillSend{"signal", asked})
	mu.Unlock()
	err = r.asUser(ctx, notYet, func(ctx context.Context, c *client.Client) error {
		_, err := c.SignalOnce(ctx, u.id, signalName, nil, "signal-"+u.id)
		return err
	})
	if err == nil {
		r.mu.Lock()
		x.asked, x.unsignalled = append(x.asked, asked), false
		r.signals = append(r.signals, chaoscheck.Signal{Execution: u.id, Name: signalName})
		r.mu.Unlock()
	}
	count(&res.Signals, "signal", err)
}

// countInFault counts the requests first sent from at until back.
func countInFault(sends []drillSend, at, back time.Time) InFault {
	var n InFault
	for _, s := range sends {
		if s.at.Before(at) || s.at.After(back) {
			continue
		}
		switch s.kind {
		case "start":
			n.Starts++
		case "signal":
			n.Signals++
		case "action":
			n.Actions++
		}
	}
	return n
}

// asUser sends one request as a user would: call sends it through
// pkg/client (which sends it again, with the same Idempotency-Key, when
// answered 503), to the apis in turn from the next of the round robin,
// turning to the other when one cannot be reached, or when again (nil:
// never) says the answer is worth sending again; until it succeeds, or
// client.DefaultRetryFor has passed.
func (r *run) asUser(ctx context.Context, again func(error) bool, call func(context.Context, *client.Client) error) error {
	users := r.drills.users
	first := int(r.drills.next.Add(1))
	deadline := time.Now().Add(client.DefaultRetryFor)
	for i := 0; ; i++ {
		rctx, cancel := context.WithTimeout(ctx, client.DefaultRetryFor+10*time.Second)
		err := call(rctx, users[(first+i)%len(users)])
		cancel()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		if !errors.Is(err, client.ErrUnreachable) && (again == nil || !again(err)) {
			return err
		}
		if i%len(users) == len(users)-1 {
			time.Sleep(200 * time.Millisecond) // every api tried: a moment before the next round
		}
	}
}

// waitDrillEnded waits until every accepted execution of the drill has a
// terminal event (the checker says why one did not), but those waiting
// for a signal that was never accepted (a failure already).
func (r *run) waitDrillEnded(ctx context.Context, name string, within time.Duration) error {
	r.mu.Lock()
	subjects := map[string]string{} // by execution id
	for id, x := range r.drills.execs {
		if x.drill == name && !x.unsignalled {
			subjects[id] = bus.ExecutionSubject(x.workflow, id)
		}
	}
	r.mu.Unlock()
	ended := map[string]bool{}
	for deadline := time.Now().Add(within); ; time.Sleep(300 * time.Millisecond) {
		stream, err := r.js.Stream(ctx, bus.StreamEvents)
		if err == nil {
			for id, subject := range subjects {
				if ended[id] {
					continue
				}
				m, err := stream.GetLastMsgForSubject(ctx, subject)
				if err == nil && events.Type(m.Header.Get("ce-type")).IsTerminal() {
					ended[id] = true
				}
			}
		}
		if len(ended) == len(subjects) {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(r.cfg.Progress, "chaos: drill %s: %d executions still running after %s: the checker says why\n", name, len(subjects)-len(ended), within)
			return nil
		}
	}
}

// stallAfter is the longest time one execution made no progress, among
// the gaps that end after at between consecutive moments of its
// progress: its start's sending (sent), its events, and the sending of
// each later request of its user (asked: an action, a signal). A gap
// that ends at such a request while the execution waited for a signal
// (from a step.waiting for signals until a signal.received) is the
// user's time, not a stall: the measure goes on from the request's
// sending.
func stallAfter(sent time.Time, evs []events.Event, at time.Time, asked ...time.Time) time.Duration {
	type moment struct {
		t    time.Time
		user bool // a request's sending
		ev   events.Event
	}
	ms := []moment{{t: sent, user: true}}
	for _, ev := range evs {
		ms = append(ms, moment{t: ev.Time, ev: ev})
	}
	for _, t := range asked {
		if !t.IsZero() {
			ms = append(ms, moment{t: t, user: true})
		}
	}
	slices.SortStableFunc(ms, func(a, b moment) int { return a.t.Compare(b.t) })
	var most time.Duration
	waiting := false
	for i := 1; i < len(ms); i++ {
		if m := ms[i]; m.t.After(at) && !(m.user && waiting) {
			most = max(most, m.t.Sub(ms[i-1].t))
		}
		switch p := ms[i].ev.Data.(type) {
		case *events.StepWaiting:
			waiting = waiting || len(p.Signals) > 0
		case *events.SignalReceived:
			waiting = false
		}
	}
	return most
}

// drillMark is one line of the drills' marks: an exec step's start or
// end, by the agent process pid, at a time.
type drillMark struct {
	done                 bool
	execution, step, try string
	pid                  int
	at                   time.Time
}

func readDrillMarks(path string) ([]drillMark, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("chaos: drill marks: %w", err)
	}
	defer f.Close()
	var out []drillMark
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) != 6 || (fs[0] != "start" && fs[0] != "done") {
			return nil, fmt.Errorf("chaos: malformed drill mark %q", sc.Text())
		}
		pid, err1 := strconv.Atoi(fs[4])
		ns, err2 := strconv.ParseInt(fs[5], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("chaos: malformed drill mark %q", sc.Text())
		}
		out = append(out, drillMark{done: fs[0] == "done", execution: fs[1], step: fs[2], try: fs[3], pid: pid, at: time.Unix(0, ns)})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("chaos: drill marks: %w", err)
	}
	return out, nil
}

// runsAgain counts, among the executions of the drill (in), the step attempts
// that began to run more than once: again after the agent that ran them
// was killed (reruns, allowed), or again while that agent lived (twice:
// a task given to a second agent, or to the same one, while the first
// run went on or after it ended).
func runsAgain(marks []drillMark, in func(execution string) bool, killed map[int]time.Time) (reruns, twice int, which []string) {
	last := map[string]drillMark{}
	for _, m := range marks {
		if m.done || !in(m.execution) {
			continue
		}
		key := m.execution + " " + m.step + " " + m.try
		prev, again := last[key]
		last[key] = m
		if !again {
			continue
		}
		if k, ok := killed[prev.pid]; ok && k.Before(m.at) {
			reruns++
			continue
		}
		twice++
		which = append(which, fmt.Sprintf("%s step %s attempt %s: run by the agent of pid %d, again by pid %d %s later",
			m.execution, m.step, m.try, prev.pid, m.pid, m.at.Sub(prev.at).Round(time.Millisecond)))
	}
	return reruns, twice, which
}

// leaderOf names the node leading stream ("" if unknown).
func (r *run) leaderOf(ctx context.Context, stream string) string {
	return streamLeader(ctx, r.js, stream)
}

// consumerLeaders counts the dispatchers' partition consumers each node
// leads, and how many there are.
func (r *run) consumerLeaders(ctx context.Context) (map[string]int, int) {
	n := partition.DefaultCount
	if kv, err := r.js.KeyValue(ctx, bus.BucketDispatchers); err == nil {
		if c, err := partition.Count(ctx, kv); err == nil {
			n = c
		}
	}
	by, all := map[string]int{}, 0
	for p := range n {
		for _, c := range bus.PartitionConsumers(bus.Durables{Partitions: n}, p) {
			all++
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			cons, err := r.js.Consumer(cctx, c.Stream, c.Config.Durable)
			var ci *jetstream.ConsumerInfo
			if err == nil {
				ci, err = cons.Info(cctx)
			}
			cancel()
			if err == nil && ci.Cluster != nil {
				by[ci.Cluster.Leader]++
			}
		}
	}
	return by, all
}

// killNodeLeading SIGKILLs the node leading stream (stream "": a node
// leading neither the events nor the commands stream), starts it again
// after down, and waits until the events stream's replicas are current.
func (r *run) killNodeLeading(ctx context.Context, res *DrillResult, stream string, down time.Duration) error {
	return r.stopNodeLeading(ctx, res, stream, syscall.SIGKILL, down)
}

// stopNodeLeading ends the node leading stream (any other node for "")
// with sig, waits until it has exited (SIGTERM and lame duck mode hand
// its leaderships over first), and starts it again after down.
func (r *run) stopNodeLeading(ctx context.Context, res *DrillResult, stream string, sig syscall.Signal, down time.Duration) error {
	leaders, all := r.consumerLeaders(ctx)
	var victim *natsNode
	if stream != "" {
		leader := r.leaderOf(ctx, stream)
		for _, n := range r.nodes {
			if n.name == leader {
				victim = n
			}
		}
		if victim == nil {
			return fmt.Errorf("chaos: no leader of %s known", stream)
		}
	} else {
		events, commands := r.leaderOf(ctx, bus.StreamEvents), r.leaderOf(ctx, bus.StreamCommands)
		for _, n := range r.nodes {
			if n.name != events && (n.name != commands || victim == nil) {
				victim = n
			}
		}
	}
	var led []string
	for _, s := range []string{bus.StreamEvents, bus.StreamCommands, bus.StreamResults, bus.StreamInbox, bus.StreamTasks} {
		if r.leaderOf(ctx, s) == victim.name {
			led = append(led, s)
		}
	}
	res.Victim = fmt.Sprintf("node %s (leader of %s; of %d of %d dispatcher partition consumers), down %s", victim.name,
		cmp.Or(strings.Join(led, ", "), "no stream"), leaders[victim.name], all, down)
	res.At = time.Now()
	if sig == syscall.SIGKILL {
		if err := victim.Kill(); err != nil {
			return err
		}
	} else {
		res.Victim += ", " + map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGUSR2: "lame duck mode"}[sig]
		if err := victim.Signal(sig); err != nil {
			return err
		}
		// Lame duck mode ends by itself after the node's lame_duck_duration.
		if !victim.Wait(lameDuckDuration + 30*time.Second) {
			_ = victim.Kill() // not left running half stopped
			return fmt.Errorf("chaos: node %s did not stop after %s", victim.name, sig)
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(down):
	}
	if err := victim.Start(); err != nil {
		return err
	}
	return waitJetStream(ctx, r.js, r.replicas, 2*time.Minute)
}

// killService SIGKILLs a service process (an agent: while it runs an
// exec step) and starts it again after Restart.
func (r *run) killService(ctx context.Context, res *DrillResult, name string) error {
	p := r.services[name]
	p.mu.Lock()
	pid := p.proc.Pid
	p.mu.Unlock()
	res.Victim = fmt.Sprintf("%s (pid %d), down %s", name, pid, r.cfg.Drills.Restart)
	if strings.HasPrefix(name, "agent") {
		if !r.waitRunning(pid, 10*time.Second) {
			res.Victim += "; it ran no exec step when killed"
		}
	}
	res.At = time.Now()
	if err := p.Kill(); err != nil {
		return err
	}
	if strings.HasPrefix(name, "agent") {
		r.drills.mu.Lock()
		r.drills.killed[pid] = res.At
		r.drills.mu.Unlock()
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(r.cfg.Drills.Restart):
	}
	return r.startService(p)
}

// waitRunning waits (at most within) until the agent of pid has begun an
// exec step it has not finished.
func (r *run) waitRunning(pid int, within time.Duration) bool {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		marks, err := readDrillMarks(r.drills.marks)
		if err != nil {
			continue
		}
		open := map[string]bool{}
		for _, m := range marks {
			if m.pid == pid {
				open[m.execution+" "+m.step+" "+m.try] = !m.done
			}
		}
		for _, running := range open {
			if running {
				return true
			}
		}
	}
	return false
}

// prepareLoneDispatcher stops the second dispatcher (SIGTERM: it gives
// its partitions back) and waits until the first holds every lease.
func prepareLoneDispatcher(ctx context.Context, r *run, _ *DrillResult) error {
	r.services["dispatcher-2"].Stop(10 * time.Second)
	kv, err := r.js.KeyValue(ctx, bus.BucketDispatchers)
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	n, err := partition.Count(ctx, kv)
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		mine := 0
		for p := range n {
			if e, err := kv.Get(ctx, partition.LeaseKey(p)); err == nil && string(e.Value()) == "d1" {
				mine++
			}
		}
		if mine == n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: dispatcher-1 holds %d of %d partitions 30 s after dispatcher-2 stopped", mine, n)
		}
	}
}

// starveDispatcher SIGSTOPs the lone dispatcher for Stop (its leases
// expire under it), then SIGCONTs it.
func starveDispatcher(ctx context.Context, r *run, res *DrillResult) error {
	p := r.services["dispatcher-1"]
	res.Victim = fmt.Sprintf("dispatcher-1 alone, SIGSTOPped %s", r.cfg.Drills.Stop)
	from := logSize(p)
	res.At = time.Now()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(r.cfg.Drills.Stop):
	}
	if err := p.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	res.logFrom = from
	return ctx.Err()
}

// finishLoneDispatcher counts what the starved dispatcher logged of its
// leases, and starts the second dispatcher again.
func finishLoneDispatcher(_ context.Context, r *run, res *DrillResult) error {
	b, err := readFrom(r.services["dispatcher-1"], res.logFrom)
	if err != nil {
		return err
	}
	res.TakenBack = strings.Count(b, "taken back, nothing released")
	res.Lost = strings.Count(b, " lost: ")
	res.Note = fmt.Sprintf("leases taken back without a release: %d; partitions lost (released and taken again): %d", res.TakenBack, res.Lost)
	return r.startService(r.services["dispatcher-2"])
}

// logSize is the size of a process's log now (0 if unknown).
func logSize(p *Process) int64 {
	f, ok := p.Log.(*os.File)
	if !ok {
		return 0
	}
	st, err := os.Stat(f.Name())
	if err != nil {
		return 0
	}
	return st.Size()
}

// readFrom reads a process's log from offset.
func readFrom(p *Process, offset int64) (string, error) {
	f, ok := p.Log.(*os.File)
	if !ok {
		return "", nil
	}
	b, err := os.ReadFile(f.Name())
	if err != nil {
		return "", fmt.Errorf("chaos: %w", err)
	}
	if offset > int64(len(b)) {
		offset = 0
	}
	return string(b[offset:]), nil
}
