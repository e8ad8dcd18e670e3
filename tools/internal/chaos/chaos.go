// Package chaos runs jetflow's chaos suite: a mix of executions (exec,
// http, sleep, wait and signal, locks, foreach) through the four services
// and nats-server, each its own process, while it SIGKILLs them at random
// and starts them again; then it reads every history and checks it with
// package chaoscheck. `make chaos` runs it through jetflow-chaos, and a
// short version runs in the end-to-end tests.
package chaos

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/tools/internal/chaoscheck"
	"jetflow.dev/tools/internal/devstack"
)

// Mode says what a run kills.
type Mode string

// The modes.
const (
	// ModeServices runs one standalone nats-server and one process of
	// each service, and kills any of them.
	ModeServices Mode = "services"
	// ModeCluster runs a 3-node cluster (R3 streams and buckets) and the
	// services, and kills one node at a time (the events stream's leader
	// every other time), waiting for the node to be current again before
	// the next kill.
	ModeCluster Mode = "cluster"
	// ModeDrills runs a 3-node cluster with two processes of the api, the
	// dispatcher and the agent (and a janitor), under the topology's
	// default ack waits, and runs the named failure drills one after
	// another under a steady load (drills.go): each fault once, measured.
	ModeDrills Mode = "drills"
)

// Binaries are the programs a run starts.
type Binaries struct {
	NATS, API, Dispatcher, Agent, Janitor string
}

// BinariesIn returns the programs as `make build` names them in dir.
func BinariesIn(dir string) Binaries {
	return Binaries{NATS: filepath.Join(dir, "nats-server"), API: filepath.Join(dir, "jetflow-api"),
		Dispatcher: filepath.Join(dir, "jetflow-dispatcher"), Agent: filepath.Join(dir, "jetflow-agent"),
		Janitor: filepath.Join(dir, "jetflow-janitor")}
}

// Config configures a run.
type Config struct {
	// Bin are the programs. Required.
	Bin Binaries
	// Dir holds the run's data, logs and marks. Required.
	Dir string
	// Mode is what is killed. Default ModeServices.
	Mode Mode
	// Executions to start. Default 1000.
	Executions int
	// Rate of starts per second. Default 20.
	Rate float64
	// KillsPerKind is how often each kind of process is killed (in
	// ModeCluster: how many node kills). Default 5 (ModeCluster: 6).
	KillsPerKind int
	// MaxDowntime bounds how long a killed process stays down before it
	// starts again (a random time from 100ms). Default 1s.
	MaxDowntime time.Duration
	// Settle bounds the wait, after the last kill, for every execution to
	// end. Default 5m.
	Settle time.Duration
	// Seed makes the same choices of victims and pauses (0: random).
	Seed uint64
	// Progress receives a line now and then (nil: none).
	Progress io.Writer
	// Drills configures ModeDrills.
	Drills DrillConfig
}

func (c Config) withDefaults() (Config, error) {
	c.Mode = cmp.Or(c.Mode, ModeServices)
	c.Executions = cmp.Or(c.Executions, 1000)
	c.Rate = cmp.Or(c.Rate, 20)
	def := 5
	if c.Mode == ModeCluster {
		def = 6
	}
	c.KillsPerKind = cmp.Or(c.KillsPerKind, def)
	c.MaxDowntime = cmp.Or(c.MaxDowntime, time.Second)
	c.Settle = cmp.Or(c.Settle, 5*time.Minute)
	if c.Seed == 0 {
		c.Seed = rand.Uint64()
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	switch {
	case c.Dir == "":
		return c, errors.New("chaos: Dir is required")
	case c.Bin.NATS == "" || c.Bin.API == "" || c.Bin.Dispatcher == "" || c.Bin.Agent == "" || c.Bin.Janitor == "":
		return c, errors.New("chaos: every binary is required (make build)")
	case c.Mode != ModeServices && c.Mode != ModeCluster && c.Mode != ModeDrills:
		return c, fmt.Errorf("chaos: unknown mode %q (services, cluster or drills)", c.Mode)
	case c.Executions < 0 || c.Rate <= 0 || c.KillsPerKind < 0 || c.MaxDowntime < 100*time.Millisecond:
		return c, errors.New("chaos: executions and kills must not be negative, the rate must be positive, the downtime at least 100ms")
	}
	if c.Mode == ModeDrills {
		var err error
		if c.Drills, err = c.Drills.withDefaults(); err != nil {
			return c, err
		}
	}
	for _, b := range []string{c.Bin.NATS, c.Bin.API, c.Bin.Dispatcher, c.Bin.Agent, c.Bin.Janitor} {
		if _, err := os.Stat(b); err != nil {
			return c, fmt.Errorf("chaos: %w (make build)", err)
		}
	}
	return c, nil
}

// Kill is one SIGKILL of the run.
type Kill struct {
	// Kind is what was killed: nats, node, api, dispatcher, agent, janitor.
	Kind string
	// Victim names the process (a node's name for a cluster node).
	Victim string
	// Leader: the node was the events stream's leader.
	Leader bool
	// Busy: an operation had just begun to run (and still ran) when the
	// kill came.
	Busy bool
	// At is when it was killed, Back when it was started again.
	At, Back time.Time
	// Recovered is how long after the kill progress resumed (0: none seen).
	Recovered time.Duration
}

// run is the state of one run.
type run struct {
	cfg Config
	// kills and starts are the choices of the killer and of the starter,
	// each its own (one goroutine each) so that a seed makes the same.
	kills, starts *rand.Rand
	authDir       string
	marks         string
	logs          string
	url           string
	replicas      int
	nc            *nats.Conn
	js            jetstream.JetStream
	nodes         []*natsNode
	services      map[string]*Process
	order         []string          // the services' instances, in the order they start
	apiURLs       map[string]string // an api instance's fixed URL (drills), by name
	api           atomic.Pointer[client.Client]
	token         string
	apiLog        string
	web           *httptest.Server
	progress      *progress

	mu       sync.Mutex
	accepted []string
	signals  []chaoscheck.Signal
	waiting  map[string]bool // wait executions never signalled, on purpose
	failures []string        // starts or signals that failed for good
	drills   drillState
}

// Run runs the suite and returns its report; the error is about the run
// itself (a process that would not start, a crash the chaos did not
// cause), not about what the checker found (in the report).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &run{cfg: cfg, kills: rand.New(rand.NewPCG(cfg.Seed, 1)), starts: rand.New(rand.NewPCG(cfg.Seed, 2)), authDir: filepath.Join(cfg.Dir, "auth"),
		marks: filepath.Join(cfg.Dir, "marks"), logs: filepath.Join(cfg.Dir, "logs"), waiting: map[string]bool{},
	}
	defer r.stop()
	began := time.Now()
	if err := r.setUp(ctx); err != nil {
		return nil, err
	}
	if cfg.Mode == ModeDrills {
		return r.runDrills(ctx, began)
	}
	fmt.Fprintf(cfg.Progress, "chaos: %s mode, %d executions at %.0f/s, seed %d, data in %s\n",
		cfg.Mode, cfg.Executions, cfg.Rate, cfg.Seed, cfg.Dir)

	startCtx, stopStarts := context.WithCancel(ctx)
	defer stopStarts()
	started := make(chan struct{})
	var startErr error
	go func() {
		defer close(started)
		startErr = r.startAll(startCtx)
	}()
	kills, err := r.killAll(ctx)
	if err != nil {
		stopStarts()
		<-started
		return nil, err
	}
	<-started
	if startErr != nil {
		return nil, startErr
	}
	fmt.Fprintf(cfg.Progress, "chaos: %d kills done; waiting for the executions to end\n", len(kills))
	if err := r.settle(ctx); err != nil {
		return nil, err
	}
	for _, p := range r.processes() {
		if !p.Running() {
			return nil, r.exitedByItself(p)
		}
	}
	// Reading everything is tried again for a while: in a cluster a
	// request can find no responder while a leader is being elected.
	var in chaoscheck.Input
	for tries := 1; ; tries++ {
		if in, err = r.collect(ctx); err == nil || tries == 10 || ctx.Err() != nil {
			break
		}
		fmt.Fprintf(cfg.Progress, "chaos: %v; again\n", err)
		time.Sleep(time.Second)
	}
	if err != nil {
		return nil, err
	}
	check := chaoscheck.Check(in)
	r.recoveries(kills)
	r.mu.Lock()
	defer r.mu.Unlock()
	return &Report{Mode: cfg.Mode, Seed: cfg.Seed, Dir: cfg.Dir, Started: cfg.Executions, Accepted: len(r.accepted),
		Signals: len(r.signals), Failures: r.failures, Kills: kills, Check: check, Took: time.Since(began)}, nil
}

// processes are every process of the run.
func (r *run) processes() []*Process {
	var ps []*Process
	for _, n := range r.nodes {
		ps = append(ps, n.Process)
	}
	for _, name := range r.order {
		if p := r.services[name]; p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

var serviceNames = []string{"api", "dispatcher", "agent", "janitor"}

func (r *run) stop() {
	if r.web != nil {
		r.web.Close()
	}
	if r.nc != nil {
		r.nc.Close()
	}
	for _, name := range r.order {
		if p := r.services[name]; p != nil {
			_ = p.Signal(syscall.SIGCONT) // a drill may have stopped it
			p.Stop(10 * time.Second)
		}
	}
	for _, n := range r.nodes {
		n.Stop(10 * time.Second)
	}
}

// setUp makes the identities, starts nats-server, bootstraps the
// topology, starts the services and registers the workflows.
func (r *run) setUp(ctx context.Context) error {
	for _, d := range []string{r.cfg.Dir, r.logs} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("chaos: %w", err)
		}
	}
	if err := os.WriteFile(r.marks, nil, 0o600); err != nil {
		return fmt.Errorf("chaos: marks: %w", err)
	}
	trust, err := auth.Init(r.authDir, auth.InitConfig{Namespaces: []string{auth.DefaultNamespace}})
	if err != nil {
		return err
	}
	nodes := 1
	if r.cfg.Mode == ModeCluster || r.cfg.Mode == ModeDrills {
		nodes, r.replicas = 3, 3
	}
	natsLog, err := r.logFile("nats")
	if err != nil {
		return err
	}
	if r.nodes, err = startNATS(r.cfg.Bin.NATS, filepath.Join(r.cfg.Dir, "nats"), trust.ServerConfig(), nodes, natsLog); err != nil {
		return err
	}
	var urls []string
	for _, n := range r.nodes {
		urls = append(urls, n.url())
	}
	r.url = strings.Join(urls, ",")
	if r.nc, r.js, err = connectAdmin(ctx, r.url, r.authDir, "jetflow-chaos"); err != nil {
		return err
	}
	if err := waitJetStream(ctx, r.js, 1, 60*time.Second); err != nil {
		return err
	}
	if err := r.bootstrap(ctx); err != nil {
		return err
	}
	trace, err := r.logFile("trace")
	if err != nil {
		return err
	}
	r.progress = newProgress(trace)
	if err := r.progress.watch(r.nc); err != nil {
		return err
	}
	tokenFile, token, err := devstack.EnsureAdminToken(r.authDir)
	if err != nil {
		return err
	}
	r.token = token
	r.web = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		time.Sleep(50 * time.Millisecond) // in flight a little while, as the exec steps
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	if err := r.startServices(tokenFile); err != nil {
		return err
	}
	defs := workflows(r.marks)
	if r.cfg.Mode == ModeDrills {
		r.drills.marks = filepath.Join(r.cfg.Dir, "drill-marks")
		if err := os.WriteFile(r.drills.marks, nil, 0o600); err != nil {
			return fmt.Errorf("chaos: marks: %w", err)
		}
		defs = append(defs, drillWorkflows(r.drills.marks)...)
	}
	for _, def := range defs {
		err := retry(ctx, time.Minute, func(ctx context.Context) error {
			_, err := r.api.Load().ApplyWorkflow(ctx, []byte(def))
			return err
		})
		if err != nil {
			return fmt.Errorf("chaos: apply workflow: %w\n%s", err, def)
		}
	}
	return nil
}

// exitedByItself is the error of a process found exited that was not
// killed, with the end of its log: the run's directory, where the log
// is, may be gone by the time someone reads the error (a test's).
func (r *run) exitedByItself(p *Process) error {
	b, err := os.ReadFile(filepath.Join(r.logs, p.Name+".log"))
	tail := ""
	if err == nil {
		lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
		tail = "\n" + strings.Join(lines[max(0, len(lines)-logTail):], "\n")
	}
	return fmt.Errorf("chaos: %s exited by itself (not killed): %s; the end of its log:%s", p.Name, p.state(), tail)
}

// logTail is how many of its last log lines a process found exited
// shows.
const logTail = 20

func (r *run) logFile(name string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(r.logs, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("chaos: log: %w", err)
	}
	return f, nil
}

// bootstrap creates the topology as the admin identity, with short
// redelivery times: a message in the hands of a killed process goes to
// the next one within seconds, as a deployment would set it for fast
// failover. The drills measure a deployment as bootstrapped by default
// (only more deliveries of a task, so that the janitor fails none).
func (r *run) bootstrap(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	durables := bus.Durables{DispatcherAckWait: 2 * time.Second, TaskAckWait: 2 * time.Second, MaxDeliver: 50}
	if r.cfg.Mode == ModeDrills {
		durables = bus.Durables{MaxDeliver: 50, DispatcherAckWait: r.cfg.Drills.DispatcherAckWait, TaskAckWait: r.cfg.Drills.TaskAckWait}
	}
	for {
		bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := bus.Bootstrap(bctx, r.js, bus.Config{Replicas: cmp.Or(r.replicas, 1)}, durables)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("chaos: bootstrap: %w", err)
		}
		time.Sleep(500 * time.Millisecond) // a cluster may still be placing replicas
	}
}

// startServices starts one process of each service (ModeDrills: two of
// the api, the dispatcher and the agent), each with its own identity's
// credentials.
func (r *run) startServices(tokenFile string) error {
	r.services = map[string]*Process{}
	if r.cfg.Mode == ModeDrills {
		return r.startDrillServices(tokenFile)
	}
	host := strings.TrimPrefix(r.web.URL, "http://")
	extra := map[string][]string{
		"api":        {"JETFLOW_HTTP_ADDR=127.0.0.1:0", "JETFLOW_ADMIN_TOKEN_FILE=" + tokenFile, "JETFLOW_LOG_LEVEL=info", "JETFLOW_START_WAIT=2s"},
		"dispatcher": {"JETFLOW_DISPATCH_ACK_WAIT=2s", "JETFLOW_WORKERS=16"},
		"agent": {"JETFLOW_AGENT_NAME=chaos-agent", "JETFLOW_AGENT_ALLOW_EXEC=true", "JETFLOW_AGENT_EXEC_ALLOW=sh",
			"JETFLOW_AGENT_HTTP_ALLOW_HOSTS=" + host, "JETFLOW_TASK_ACK_WAIT=2s", "JETFLOW_TASK_MAX_DELIVER=50",
			"JETFLOW_KILL_GRACE=1s", "JETFLOW_CONCURRENCY=16"},
		"janitor": {"JETFLOW_JANITOR_INTERVAL=1s", "JETFLOW_IDLE_AFTER=10s", "JETFLOW_RETENTION_DEFAULT=forever"},
	}
	bins := map[string]string{"api": r.cfg.Bin.API, "dispatcher": r.cfg.Bin.Dispatcher, "agent": r.cfg.Bin.Agent, "janitor": r.cfg.Bin.Janitor}
	for _, name := range serviceNames {
		log, err := r.logFile(name)
		if err != nil {
			return err
		}
		env := []string{"JETFLOW_NATS_URL=" + r.url, "JETFLOW_LOG_LEVEL=warn", fmt.Sprintf("JETFLOW_REPLICAS=%d", cmp.Or(r.replicas, 1)),
			"JETFLOW_NATS_CREDS=" + filepath.Join(r.authDir, auth.DefaultNamespace, auth.CredsFile(auth.Role(name)))}
		p := &Process{Name: name, Path: bins[name], Env: append(env, extra[name]...), Log: log}
		if name == "api" {
			r.apiLog = log.Name()
		}
		r.services[name] = p
		r.order = append(r.order, name)
		if err := r.startService(p); err != nil {
			return err
		}
	}
	return nil
}

// startService starts a service; the api is waited for until it answers,
// on the port it picked (read from its log).
func (r *run) startService(p *Process) error {
	var from int64
	if p.Name == "api" {
		if st, err := os.Stat(r.apiLog); err == nil {
			from = st.Size()
		}
	}
	if err := p.Start(); err != nil {
		return err
	}
	if url, ok := r.apiURLs[p.Name]; ok {
		return r.waitAPI(p, url)
	}
	if p.Name != "api" {
		return nil
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if base := r.apiAddr(from); base != "" {
			c := client.New(base, client.WithToken(r.token))
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := c.Settings(ctx)
			cancel()
			if err == nil {
				r.api.Store(c)
				return nil
			}
		}
		if !p.Running() {
			return fmt.Errorf("chaos: the api exited: %s (see %s)", p.state(), r.apiLog)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: the api did not answer within a minute (see %s)", r.apiLog)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var apiListening = regexp.MustCompile(`"addr":"(127\.0\.0\.1:\d+)".*"message":"api listening"`)

// apiAddr finds the address the api logged after offset from of its log.
func (r *run) apiAddr(from int64) string {
	f, err := os.Open(r.apiLog)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	if m := apiListening.FindSubmatch(b); m != nil {
		return "http://" + string(m[1])
	}
	return ""
}

// startAll starts the executions at the configured rate, each start (and
// the signal of a wait) in its own goroutine: while the api is down they
// are sent again until it answers.
func (r *run) startAll(ctx context.Context) error {
	var wg sync.WaitGroup
	began := time.Now()
	every := time.Duration(float64(time.Second) / r.cfg.Rate)
	for i := range r.cfg.Executions {
		if d := time.Until(began.Add(time.Duration(i) * every)); d > 0 {
			select {
			case <-ctx.Done():
				wg.Wait() // each gives up as ctx ends
				return ctx.Err()
			case <-time.After(d):
			}
		}
		wf := mix[i%len(mix)]
		id := fmt.Sprintf("%s-%04d", wf, i)
		// One wait in ten (the third, the 13th...) is never signalled: it
		// must still be waiting, legitimately, at the end.
		never := wf == wfWait && (i/len(mix))%10 == 2
		delay := time.Duration(200+r.starts.IntN(1500)) * time.Millisecond
		wg.Go(func() { r.start(ctx, wf, id, never, delay) })
		if i%100 == 99 {
			fmt.Fprintf(r.cfg.Progress, "chaos: %d started\n", i+1)
		}
	}
	wg.Wait()
	return nil
}

func (r *run) start(ctx context.Context, wf, id string, never bool, delay time.Duration) {
	// A request sent again because its answer was lost (the api or NATS
	// killed meanwhile) must be the same command, not a second one.
	req := client.StartRequest{Workflow: wf, ID: id, IdempotencyKey: "start-" + id}
	if wf == wfHTTP {
		req.Input = map[string]any{"url": r.web.URL + "/" + id}
	}
	err := retry(ctx, 3*time.Minute, func(ctx context.Context) error {
		_, err := r.api.Load().Start(ctx, req)
		return err
	})
	r.mu.Lock()
	if err != nil {
		r.failures = append(r.failures, fmt.Sprintf("start %s: %v", id, err))
	} else {
		r.accepted = append(r.accepted, id)
		r.waiting[id] = never
	}
	r.mu.Unlock()
	if err != nil || wf != wfWait || never {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(delay):
	}
	err = retry(ctx, 3*time.Minute, func(ctx context.Context) error {
		_, err := r.api.Load().SignalOnce(ctx, id, signalName, nil, "signal-"+id)
		if client.IsStatus(err, http.StatusNotFound) {
			return fmt.Errorf("not there yet: %w", errRetry) // accepted, maybe not yet started
		}
		return err
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.failures = append(r.failures, fmt.Sprintf("signal %s: %v", id, err))
		return
	}
	r.signals = append(r.signals, chaoscheck.Signal{Execution: id, Name: signalName})
}

var errRetry = errors.New("try again")

// settle waits until every accepted execution has ended (or waits on
// purpose) and the projector has caught up.
func (r *run) settle(ctx context.Context) error {
	deadline := time.Now().Add(r.cfg.Settle)
	ended := map[string]bool{}
	last := time.Now()
	for ; ; time.Sleep(500 * time.Millisecond) {
		stream, err := r.js.Stream(ctx, bus.StreamEvents)
		if err != nil { // a cluster electing a leader: again
			if time.Now().After(deadline) {
				return fmt.Errorf("chaos: %w", err)
			}
			continue
		}
		r.mu.Lock()
		ids := append([]string(nil), r.accepted...)
		for _, id := range ids {
			if r.waiting[id] {
				ended[id] = true // waits for ever, on purpose
			}
		}
		r.mu.Unlock()
		left := 0
		for _, id := range ids {
			if ended[id] {
				continue
			}
			wf := id[:strings.LastIndex(id, "-")]
			m, err := stream.GetLastMsgForSubject(ctx, bus.ExecutionSubject(wf, id))
			if err == nil && events.Type(m.Header.Get("ce-type")).IsTerminal() {
				ended[id] = true
				continue
			}
			left++
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			fmt.Fprintf(r.cfg.Progress, "chaos: %d executions still running after %s: the checker says why\n", left, r.cfg.Settle)
			break
		}
		if time.Since(last) > 10*time.Second {
			fmt.Fprintf(r.cfg.Progress, "chaos: %d executions still running\n", left)
			last = time.Now()
		}
	}
	return r.waitProjected(ctx)
}

// waitProjected waits until the projector has acknowledged every event.
func (r *run) waitProjected(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		cons, err := r.js.Consumer(ctx, bus.StreamEvents, bus.ConsumerProjector)
		if err == nil {
			var ci *jetstream.ConsumerInfo
			if ci, err = cons.Info(ctx); err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 {
				return nil
			} else if err == nil {
				err = fmt.Errorf("%d pending, %d unacknowledged", ci.NumPending, ci.NumAckPending)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: the projector did not catch up: %w", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// collect reads every history, read model and mark.
func (r *run) collect(ctx context.Context) (chaoscheck.Input, error) {
	in := chaoscheck.Input{Executions: map[string]chaoscheck.Execution{},
		Limits: map[string]int{lockMutex: 1, lockSema: semaLimit}}
	err := history.ScanStored(ctx, r.js, bus.StreamEvents, bus.EventsPrefix+".>", 0, 0, func(subject string, ev events.Event) error {
		_, id, ok := bus.ParseExecutionSubject(subject)
		if !ok {
			return nil
		}
		x := in.Executions[id]
		x.ID, x.Events = id, append(x.Events, ev)
		in.Executions[id] = x
		return nil
	})
	if err != nil {
		return in, fmt.Errorf("chaos: read the histories: %w", err)
	}
	kv, err := r.js.KeyValue(ctx, bus.BucketExecutions)
	if err != nil {
		return in, fmt.Errorf("chaos: %w", err)
	}
	for id, x := range in.Executions {
		e, err := kv.Get(ctx, id)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return in, fmt.Errorf("chaos: read model %s: %w", id, err)
		default:
			x.ReadModel = e.Value()
			in.Executions[id] = x
		}
	}
	b, err := os.ReadFile(r.marks)
	if err != nil {
		return in, fmt.Errorf("chaos: marks: %w", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		m, err := chaoscheck.ParseMark(line)
		if err != nil {
			return in, err
		}
		in.Marks = append(in.Marks, m)
	}
	r.mu.Lock()
	in.Accepted = append([]string(nil), r.accepted...)
	in.Signals = append([]chaoscheck.Signal(nil), r.signals...)
	r.mu.Unlock()
	in.Now = time.Now()
	return in, nil
}

// progress keeps the times at which the system made progress, as seen
// on the subjects: steps that succeeded (by an agent, or any) and read
// models written. It also writes a trace of what it sees (every event
// appended and every read model written, with its last sequence), to
// tell how a violation came about.
type progress struct {
	mu                   sync.Mutex
	steps, agents, reads []time.Time
	trace                io.Writer
}

func newProgress(trace io.Writer) *progress { return &progress{trace: trace} }

// lastSeq finds a read model's last sequence without decoding all of it.
var lastSeq = regexp.MustCompile(`"last_seq":(\d+)`)

func (p *progress) watch(nc *nats.Conn) error {
	_, err := nc.Subscribe(bus.EventsPrefix+".>", func(m *nats.Msg) {
		now := time.Now()
		typ := events.Type(m.Header.Get("ce-type"))
		p.mu.Lock()
		defer p.mu.Unlock()
		fmt.Fprintf(p.trace, "%s event %s %s prevseq %s\n", now.Format("15:04:05.000000"), m.Subject, typ, m.Header.Get("ce-"+events.ExtPrevSeq))
		// An execution's success may carry its last step's (docs/adr/0015):
		// written with schema version 3, or 4 when that success records a
		// sleep's firing (0017), which only such an end is.
		schema := m.Header.Get("ce-" + events.ExtSchema)
		carried := typ == events.TypeExecutionSucceeded && (schema == "3" || schema == "4")
		if typ != events.TypeStepSucceeded && !carried {
			return
		}
		p.steps = append(p.steps, now)
		if bytes.Contains(m.Data, []byte(`"agent":`)) {
			p.agents = append(p.agents, now)
		}
	})
	if err != nil {
		return fmt.Errorf("chaos: watch events: %w", err)
	}
	_, err = nc.Subscribe(bus.BucketSubject(bus.BucketExecutions, ">"), func(m *nats.Msg) {
		now := time.Now()
		seq := "-"
		if s := lastSeq.FindSubmatch(m.Data); s != nil {
			seq = string(s[1])
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		fmt.Fprintf(p.trace, "%s model %s last_seq %s (%d bytes)\n", now.Format("15:04:05.000000"), m.Subject, seq, len(m.Data))
		p.reads = append(p.reads, now)
	})
	if err != nil {
		return fmt.Errorf("chaos: watch read models: %w", err)
	}
	return nil
}

// after returns the first time of ts at or after t (zero if none).
func after(ts []time.Time, t time.Time) time.Time {
	for _, x := range ts {
		if !x.Before(t) {
			return x
		}
	}
	return time.Time{}
}

// recoveries sets each kill's recovery: the time from the kill to the
// first progress made after its victim was back. The progress that shows
// a victim works again: for an agent a step it ran, for the api a read
// model its projector wrote, for anything else any step recorded.
func (r *run) recoveries(kills []Kill) {
	p := r.progress
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range kills {
		k := &kills[i]
		ts := p.steps
		switch k.Kind {
		case "agent":
			ts = p.agents
		case "api":
			ts = p.reads
		}
		if t := after(ts, k.Back); !t.IsZero() {
			k.Recovered = t.Sub(k.At)
		}
	}
}
