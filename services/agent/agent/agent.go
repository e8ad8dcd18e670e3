// Package agent is the agent service: it pulls tasks from its queues'
// work-queue consumers, runs the operation with a registered handler,
// keeps the task alive while it runs (heartbeats), and reports started and
// finished results on the results stream. A task whose agent dies is
// redelivered by JetStream after AckWait and runs again, unless that agent
// had stored its result; one that keeps failing to finish is turned into a
// failure by the janitor.
package agent

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/history"
	"jetflow.dev/pkg/operation"
	"jetflow.dev/pkg/redact"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/pkg/workflow"
)

// Config configures an Agent. Its counts, sizes and durations must lie in
// [Ranges]; zero is the default.
type Config struct {
	// Name identifies this agent in results. Default "<hostname>-<pid>".
	Name string
	// Queues to serve. Default ["default"].
	Queues []string
	// Concurrency is the number of tasks run at once per queue. Default 16.
	Concurrency int
	// AckWait is how long a task may go without a heartbeat before
	// JetStream gives it to another agent. Heartbeats are sent every
	// AckWait/4, and at least every bus.DefaultTaskAckWait/4 (see
	// heartbeatEvery). Default bus.DefaultTaskAckWait (4s).
	AckWait time.Duration
	// MaxDeliver is how many times a task is delivered before the janitor
	// fails it. Default 5.
	MaxDeliver int
	// KillGrace is the time between SIGTERM and SIGKILL for exec steps. Default 5s.
	KillGrace time.Duration
	// HTTPTimeout bounds an http step. Default 60s.
	HTTPTimeout time.Duration
	// MaxOutput caps captured stdout, stderr and response bodies, in bytes.
	// Default 256 KiB. (An output that still does not fit in a result
	// message is replaced by a note saying so.)
	MaxOutput int
	// ShutdownGrace is how long running tasks may finish on shutdown before
	// they are cancelled and handed back. Default 10s.
	ShutdownGrace time.Duration
	// Handlers adds custom operation kinds (or replaces built-ins).
	Handlers map[string]operation.Handler
	// Source is the CloudEvents source of results. Default "jetflow/agent/<name>".
	Source string
	// BindOnly: the queues' consumers exist (made by the bootstrap) and
	// this agent may not create or change them; it binds to them and
	// heartbeats by their ack wait. Agents running with credentials set it.
	BindOnly bool
	// Policy says which exec and http operations the agent runs. The zero
	// Policy refuses exec steps and lets http steps reach any host: a
	// refused operation fails its step (final) without running.
	Policy Policy
	// SecretsDir, if set, is a directory of secrets: the file NAME holds
	// the secret that operations reference as ${secret.NAME} (one
	// trailing newline is removed). Files are read when a task needs
	// them, so a changed file counts from the next task on. The directory
	// must exist.
	SecretsDir string
	// SecretsEnvPrefix, if set, makes the environment variable
	// <prefix>NAME a secret too (a file in SecretsDir wins). Those
	// variables are removed from the environment exec steps get.
	SecretsEnvPrefix string
	// LookupEnv reads the environment for secrets. Default os.LookupEnv.
	LookupEnv func(string) (string, bool)
	// StartedAfter is how long an operation runs before the agent
	// reports it started (io.jetflow.operation.started). An operation
	// that ends sooner is not reported started on its own: its final
	// report says when it started, and the dispatcher records both in
	// one event. Default DefaultStartedAfter; StartedAtOnce reports every
	// start as the operation begins (as agents before this setting did).
	StartedAfter time.Duration
	// NoDirectReports: store every report on the results stream. By
	// default a final report about a task whose dispatcher takes direct
	// reports (events.Task.Partitions) is handed straight to it, a core
	// NATS request; the report is stored only when no dispatcher answers
	// that it recorded it (docs/adr/0009).
	NoDirectReports bool
	// DirectWait is how long an agent waits for a dispatcher's answer to
	// a report handed straight to it before it stores the report instead.
	// Default DefaultDirectWait.
	DirectWait time.Duration
	// Metrics, if set, counts what the agent does (NewMetrics); nil
	// counts nothing.
	Metrics *Metrics
	// Tracer, if set, records a span for each operation it runs, under
	// the step attempt's span its task names (tracing.go); nil records
	// nothing.
	Tracer trace.TracerProvider
}

const (
	// DefaultDirectWait is the default DirectWait. A dispatcher answers
	// at once a report it will not handle soon (its execution has many
	// messages waiting there), so the wait matters when the dispatcher
	// died with the report in hand: the report is then stored, and
	// recorded by the partition's next holder, about as soon as it takes
	// the partition.
	DefaultDirectWait = time.Second
)

const (
	// DefaultStartedAfter is the default StartedAfter: most built-in
	// operations (noop, log, a quick http call) end sooner, and an
	// operator watching a step sees it started within a glance.
	DefaultStartedAfter = 50 * time.Millisecond
	// StartedAtOnce is the StartedAfter that reports every start at once.
	StartedAtOnce time.Duration = -1
)

func (c Config) withDefaults() Config {
	if c.Name == "" {
		h, _ := os.Hostname()
		c.Name = cmp.Or(h, "agent") + "-" + strconv.Itoa(os.Getpid())
	}
	if len(c.Queues) == 0 {
		c.Queues = []string{"default"}
	}
	c.Concurrency = cmp.Or(c.Concurrency, 16)
	c.AckWait = cmp.Or(c.AckWait, bus.DefaultTaskAckWait)
	c.MaxDeliver = cmp.Or(c.MaxDeliver, 5)
	c.KillGrace = cmp.Or(c.KillGrace, 5*time.Second)
	c.HTTPTimeout = cmp.Or(c.HTTPTimeout, 60*time.Second)
	c.MaxOutput = cmp.Or(c.MaxOutput, 256<<10)
	c.ShutdownGrace = cmp.Or(c.ShutdownGrace, 10*time.Second)
	c.Source = cmp.Or(c.Source, "jetflow/agent/"+c.Name)
	c.StartedAfter = cmp.Or(c.StartedAfter, DefaultStartedAfter)
	c.DirectWait = cmp.Or(c.DirectWait, DefaultDirectWait)
	if c.LookupEnv == nil {
		c.LookupEnv = os.LookupEnv
	}
	return c
}

// Ranges are the values Config's numeric settings may take once their
// defaults are applied (zero is the default). Validate checks them, and
// jetflow-agent's flags take the same.
var Ranges = struct {
	Concurrency, MaxDeliver, MaxOutput                                       svc.Range[int]
	AckWait, KillGrace, HTTPTimeout, ShutdownGrace, StartedAfter, DirectWait svc.Range[time.Duration]
}{
	Concurrency: svc.Range[int]{Min: 1, Max: 1024},
	// One delivery may be enough (a task whose agent dies is then failed
	// at once); more than 100 only delays the janitor's verdict on a task
	// that never finishes.
	MaxDeliver: svc.Range[int]{Min: 1, Max: 10000},
	// Up to NATS's largest message.
	MaxOutput: svc.Range[int]{Min: 1, Max: 64 << 20},
	// Heartbeats every third of it: shorter than 300ms, a loaded agent
	// misses them.
	AckWait:       svc.Range[time.Duration]{Min: 300 * time.Millisecond, Max: time.Hour},
	KillGrace:     svc.Range[time.Duration]{Min: 10 * time.Millisecond, Max: time.Hour},
	HTTPTimeout:   svc.Range[time.Duration]{Min: 100 * time.Millisecond, Max: time.Hour},
	ShutdownGrace: svc.Range[time.Duration]{Min: time.Millisecond, Max: time.Hour},
	// Or StartedAtOnce (the flag's 0). Beyond a minute a running
	// operation looks, to an operator, like one still waiting for an agent.
	StartedAfter: svc.Range[time.Duration]{Min: 0, Max: time.Minute},
	// Below 10ms a busy dispatcher's answer seldom comes in time; past a
	// minute a report not handled waits too long to be stored.
	DirectWait: svc.Range[time.Duration]{Min: 10 * time.Millisecond, Max: time.Minute},
}

// Validate checks a configuration, its defaults applied: New does, and a
// program may before it connects.
func (c Config) Validate() error {
	c = c.withDefaults()
	if err := cmp.Or(
		Ranges.Concurrency.Check("agent: Concurrency", c.Concurrency),
		Ranges.AckWait.Check("agent: AckWait", c.AckWait),
		Ranges.MaxDeliver.Check("agent: MaxDeliver", c.MaxDeliver),
		Ranges.KillGrace.Check("agent: KillGrace", c.KillGrace),
		Ranges.HTTPTimeout.Check("agent: HTTPTimeout", c.HTTPTimeout),
		Ranges.MaxOutput.Check("agent: MaxOutput", c.MaxOutput),
		Ranges.ShutdownGrace.Check("agent: ShutdownGrace", c.ShutdownGrace),
		Ranges.DirectWait.Check("agent: DirectWait", c.DirectWait),
	); err != nil {
		return err
	}
	if c.StartedAfter != StartedAtOnce {
		if err := Ranges.StartedAfter.Check("agent: StartedAfter (-report-started-after; 0: at once)", c.StartedAfter); err != nil {
			return err
		}
	}
	for i, q := range c.Queues {
		if !events.ValidQueueName(q) {
			return fmt.Errorf("agent: queue %q: %s", q, events.QueueNameRule)
		}
		if slices.Contains(c.Queues[:i], q) {
			return fmt.Errorf("agent: queue %q is given twice", q)
		}
	}
	if err := c.Policy.Validate(); err != nil {
		return err
	}
	return c.secrets().validate()
}

func (c Config) secrets() secretStore {
	return secretStore{dir: c.SecretsDir, envPrefix: c.SecretsEnvPrefix, lookupEnv: c.LookupEnv}
}

// ConsumerName is the durable consumer shared by all agents of a queue.
func ConsumerName(queue string) string { return bus.AgentConsumer(queue) }

// Agent runs operations.
type Agent struct {
	running atomic.Bool // its queues are bound and its kill notices read (Run)

	cfg      Config
	js       jetstream.JetStream
	log      zerolog.Logger
	handlers map[string]operation.Handler
	kills    *kills
	secrets  secretStore
	// direct: the reports handed straight to dispatchers (direct.go).
	direct direct
	// stopping is closed once Run is asked to stop (set before any task
	// runs).
	stopping <-chan struct{}
	// meter counts tasks and operations (nil: Config.Metrics is not set).
	meter *meter
}

// New returns an agent; call Run to start it.
func New(cfg Config, js jetstream.JetStream, log zerolog.Logger) (*Agent, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := Builtins(cfg, log)
	kinds := map[string]struct{}{}
	for k, v := range cfg.Handlers {
		h[k] = v
	}
	for k := range h {
		kinds[k] = struct{}{}
	}
	return &Agent{cfg: cfg, js: js, log: log.With().Str("agent", cfg.Name).Logger(), handlers: h, kills: newKills(),
		secrets: cfg.secrets(), meter: cfg.Metrics.meter(cfg.Queues, kinds)}, nil
}

// Run serves the queues until ctx ends, then lets running tasks finish for
// up to ShutdownGrace before cancelling them.
//
// Each queue has Concurrency workers, and a worker asks JetStream for one
// task only when it is free: no task ever waits in the agent without a
// heartbeat (where AckWait would hand it to another agent while this one
// still means to run it), and at shutdown nothing is left to hand back.
// A quarter of them serve only the queue's normal lane (lanes.go).
func (a *Agent) Run(ctx context.Context) error {
	a.stopping = ctx.Done()
	taskCtx, cancelTasks := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelTasks()
	stopKills, err := a.watchKillsUntil(ctx)
	if err != nil {
		return nil // stopped while starting: not an error
	}
	defer stopKills()
	// Bind every queue's consumer before any task runs: an agent that
	// binds to the bootstrap's consumers heartbeats by their ack wait.
	queues := make([]*lanes, 0, len(a.cfg.Queues))
	for i, q := range a.cfg.Queues {
		spec := bus.AgentQueueConsumer(bus.Durables{TaskAckWait: a.cfg.AckWait, MaxDeliver: a.cfg.MaxDeliver}, q)
		cons, err := bus.Bind(ctx, a.js, !a.cfg.BindOnly, spec, func(err error) {
			a.log.Warn().Err(err).Str("queue", q).Msg("waiting for the bootstrap")
		})
		if err != nil {
			if ctx.Err() != nil {
				return nil // stopped while starting: not an error
			}
			return fmt.Errorf("queue %s: %w", q, err)
		}
		if w := cons.CachedInfo().Config.AckWait; a.cfg.BindOnly && w > 0 && (i == 0 || w < a.cfg.AckWait) {
			a.cfg.AckWait = w // the shortest of its queues' ack waits
		}
		queues = append(queues, &lanes{queue: q, normal: cons, inFlight: a.meter.inFlight(q)})
	}
	// The bulk lanes are bound beside: an agent serves its queues' normal
	// lanes while a bootstrap older than the bulk lanes has not made them.
	// Their workers start once each has been looked up.
	var binding, tried sync.WaitGroup
	defer binding.Wait()
	// A Run that fails below ends the binding with it.
	bindCtx, stopBinding := context.WithCancel(ctx)
	defer stopBinding()
	for _, l := range queues {
		tried.Add(1)
		once := sync.OnceFunc(tried.Done)
		binding.Go(func() { a.bindBulk(bindCtx, l, once) })
	}
	tried.Wait()
	if ctx.Err() != nil {
		return nil // stopped while starting: not an error
	}
	defer a.meter.watchConsumers(a, queues)()
	answers, err := a.listen()
	if err != nil {
		return err
	}
	stopSweep, swept := make(chan struct{}), make(chan struct{})
	go func() { defer close(swept); a.sweep(stopSweep) }()
	defer func() {
		// Once no worker runs: the reports still waiting for their
		// answers are settled (stored, past DirectWait), then no more
		// answer is taken.
		close(stopSweep)
		<-swept
		_ = answers.Unsubscribe()
	}()
	// Each worker's pull requests are answered on a subscription of its
	// own (pull.go), made before any worker starts.
	api := apiPrefix(a.js.Options())
	workersOf := make([][]*worker, len(queues))
	for i := range queues {
		for w := range a.cfg.Concurrency {
			p, err := newPulls(a.js.Conn(), api)
			if err != nil {
				for _, ws := range workersOf {
					for _, w := range ws {
						w.pulls.close()
					}
				}
				return err
			}
			workersOf[i] = append(workersOf[i], &worker{reserved: w < reservedWorkers(a.cfg.Concurrency), pulls: p, asked: a.meter.requests(queues[i].queue)})
		}
	}
	a.running.Store(true)
	context.AfterFunc(ctx, func() { a.running.Store(false) }) // stopping: not ready
	var workers sync.WaitGroup
	for i, l := range queues {
		log := a.log.With().Str("queue", l.queue).Logger()
		for _, w := range workersOf[i] {
			workers.Go(func() {
				defer w.pulls.close()
				a.serve(ctx, taskCtx, l, w, log)
			})
		}
	}
	p := a.cfg.Policy
	a.log.Info().Strs("queues", a.cfg.Queues).Int("concurrency", a.cfg.Concurrency).
		Bool("allow_exec", p.AllowExec).Strs("exec_allow", p.ExecAllow).Strs("http_allow_hosts", p.HTTPAllowHosts).
		Bool("secrets_dir", a.cfg.SecretsDir != "").Str("secrets_env_prefix", a.cfg.SecretsEnvPrefix).
		Dur("report_started_after", a.cfg.StartedAfter).Bool("direct_reports", !a.cfg.NoDirectReports).
		Str("direct_wait", a.cfg.DirectWait.String()).Msg("agent running")
	<-ctx.Done()
	done := make(chan struct{})
	go func() { workers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(a.cfg.ShutdownGrace):
		a.log.Warn().Msg("cancelling running tasks at shutdown")
		cancelTasks()
		<-done
	}
	return nil
}

// Ready says why the agent does not serve (nil when it does): it has
// not yet read the kill notices kept (a task of a killed execution must
// be refused) and bound its queues' consumers.
func (a *Agent) Ready() error {
	if !a.running.Load() {
		return errors.New("reading the kill notices and binding its queues")
	}
	return nil
}

// heartbeatEvery is how often a running task's agent tells JetStream it
// still runs it: every quarter of its ack wait (so that three heartbeats
// fall inside the wait, not two and one at its very end), and at least
// every quarter of bus.DefaultTaskAckWait. The queue's ack wait is read once, when the
// agent binds; a bootstrap that lowers it later to the default (the
// upgrade from a release whose default was 30 s) must not have the tasks
// this agent runs given to another agent meanwhile.
func (a *Agent) heartbeatEvery() time.Duration {
	return min(a.cfg.AckWait, bus.DefaultTaskAckWait) / 4
}

func (a *Agent) runTask(ctx context.Context, m jetstream.Msg) {
	ev, err := bus.Decode(m.Headers(), m.Data())
	task, ok := ev.Data.(*events.Task)
	if err != nil || !ok {
		a.log.Error().Err(err).Str("subject", m.Subject()).Msg("drop malformed task")
		_ = m.Term()
		return
	}
	delivery := 1
	md, mdErr := m.Metadata()
	if mdErr == nil {
		delivery = int(md.NumDelivered)
	}
	if delivery > 1 {
		a.meter.redelivered(task.Queue)
	}
	log := a.log.With().Str("execution_id", task.ExecutionID).Str("step_id", task.StepID).
		Str("task_id", task.TaskID).Int("delivery", delivery).Logger()
	ref := task.Ref(a.cfg.Name, delivery)
	if mdErr == nil {
		// Where and when the task was stored: the dispatcher records the
		// step's sending from its report when it did not (docs/adr/0007).
		ref.TaskSeq, ref.StoredAt = md.Sequence.Stream, md.Timestamp.UTC()
	}

	// Heartbeat while it runs. Its delivery, a moment ago, started its
	// ack wait: the first beat is due heartbeatEvery later (a quarter of
	// the wait), and a task that ends sooner, most of them, costs none.
	stopHB := a.keepAlive(m, log)
	defer stopHB()

	// A task delivered again may have been run and reported by an agent
	// that died (or lost its connection) before acknowledging it. Once its
	// result is stored the dispatcher may have recorded it and gone on,
	// releasing the step's lock to the next holder: running the operation
	// again would run it outside its lock, after the steps that followed
	// it. Acknowledge it instead.
	if delivery > 1 {
		done, err := a.reported(ctx, task)
		if err != nil {
			handBack(ctx, m, log, err, "look for the result of an earlier delivery")
			return
		}
		if !done {
			// An earlier delivery's report may have been handed straight
			// to the dispatcher, recorded, and its task not acknowledged
			// (its agent died between the answer and the ack): ask.
			switch a.attemptOver(ctx, task, ref, delivery, log) {
			case attemptOver:
				done = true
			case attemptHandBack:
				_ = m.Nak()
				return
			}
		}
		if done {
			log.Info().Msg("task already reported by an earlier delivery: acknowledged without running it again")
			if err := m.Ack(); err != nil {
				log.Warn().Err(err).Msg("ack task")
			}
			return
		}
	}

	// Secrets are resolved and the policy decides before anything is
	// reported started: a refused operation never runs.
	spec, red, err := a.prepare(task)
	if err != nil {
		final := errors.Is(err, ErrRefused) || errors.Is(err, ErrSecretMissing)
		msg := red.String(err.Error())
		log.Warn().Str("kind", task.Kind).Bool("final", final).Str("reason", msg).Msg("operation not run")
		a.meter.operation(task.Kind, opRefused, 0)
		a.deliver(ctx, m, task, fmt.Sprintf("%s.done.%d", task.TaskID, delivery), &events.OperationFailed{TaskRef: ref, Error: msg, Final: final}, log)
		return
	}

	h, ok := a.handlers[task.Kind]
	opCtx, done, refused := a.kills.start(ctx, task.ExecutionID, task.TaskID, task.Token)
	if errors.Is(refused, ErrKilled) || errors.Is(refused, ErrEnded) {
		// A task sent after a resume can come before its lift is read.
		lifted, err := a.liftedAt(ctx, task.ExecutionID)
		if err != nil {
			handBack(ctx, m, log, err, "look for the lift of a kill")
			return
		}
		if lifted > 0 {
			opCtx, done, refused = a.kills.startLifted(ctx, task.ExecutionID, task.TaskID, task.Token, lifted)
		}
	}
	defer done()
	alive := refused == nil
	var out any
	var began time.Time // when the operation began (zero: it did not run)
	final := false
	if !alive {
		err = refused
		log.Info().Err(refused).Msg("refuse a task: its execution was killed or ended, or its step gave up on it")
	} else if !ok {
		err = fmt.Errorf("agent %s has no handler for operation kind %q", a.cfg.Name, task.Kind)
	} else {
		began = time.Now()
		var span trace.Span
		opCtx, span = a.startSpan(opCtx, ev, task, delivery)
		started := a.reportStarted(startedReportID(task.TaskID, delivery), ref, began)
		defer started.wait(a.cfg.AckWait, log)
		var stopWatch func()
		opCtx, stopWatch = watchHeartbeat(opCtx, heartbeatOf(spec))
		defer stopWatch()
		out, err = operation.Run(opCtx, h, operation.Task{TaskID: task.TaskID, ExecutionID: task.ExecutionID,
			Workflow: task.Workflow, StepID: task.StepID, Attempt: task.Attempt, Delivery: delivery,
			Kind: task.Kind, Spec: spec, Input: operation.InputOf(spec)})
		started.stop()
		// Nothing the operation reports may show a secret it was given.
		final = errors.Is(err, ErrRefused) // e.g. a redirect to a host not allowed
		err = redactError(red, err)
		endSpan(span, err) // the run, not the report: with no secret in its error
		if err == nil {
			out, err = redactOutput(red, out)
		}
		log.Debug().Dur("took", time.Since(began)).Err(err).Msg("operation finished")
		if err == nil {
			var raw json.RawMessage
			if raw, err = operation.EncodeOutput(out); err == nil {
				took := time.Since(began)
				a.meter.operation(task.Kind, opSucceeded, took)
				a.deliver(ctx, m, task, fmt.Sprintf("%s.done.%d", task.TaskID, delivery),
					&events.OperationSucceeded{TaskRef: ref, Output: a.fitOutput(raw), Duration: took.Milliseconds(),
						StartedAt: began.UTC()}, log)
				return
			}
		}
	}
	if ctx.Err() != nil { // shutting down: hand the task to another agent
		_ = m.Nak()
		return
	}
	if began.IsZero() {
		a.meter.operation(task.Kind, opRefused, 0) // killed, ended, or no handler
	} else {
		a.meter.operation(task.Kind, opFailed, time.Since(began))
	}
	lost := false
	if alive {
		cause := context.Cause(opCtx)
		if errors.Is(cause, ErrKilled) || errors.Is(cause, ErrTerminated) || errors.Is(cause, ErrNoHeartbeat) {
			log.Info().Err(err).AnErr("cause", cause).Dur("ran", time.Since(began)).Msg("operation terminated")
			err = fmt.Errorf("%w after running %s (%w)", cause, time.Since(began).Round(time.Millisecond), err)
			lost = errors.Is(cause, ErrNoHeartbeat) // hung: as if its agent had died
		}
	}
	msg, raw := operation.Failed(err)
	a.deliver(ctx, m, task, fmt.Sprintf("%s.done.%d", task.TaskID, delivery), &events.OperationFailed{TaskRef: ref, Error: msg,
		Output: a.fitOutput(raw), Final: final, Lost: lost, StartedAt: began.UTC()}, log)
}

// startedReportID is the CloudEvent id of the started report of a task's
// delivery.
func startedReportID(taskID string, delivery int) string {
	return fmt.Sprintf("%s.started.%d", taskID, delivery)
}

// startReport is the report that an operation started, published once
// the operation has run for StartedAfter (at once with StartedAtOnce), and
// never after the operation ended: an operation that ends sooner is
// reported started by its final report (StartedAt), which spares the
// results stream a message and the execution's history an append.
type startReport struct {
	mu     sync.Mutex
	timer  *time.Timer
	ended  bool
	future jetstream.PubAckFuture // nil until published (or if it could not be)
}

// reportStarted arms the started report of an operation that begins now.
func (a *Agent) reportStarted(id string, ref events.TaskRef, began time.Time) *startReport {
	r := &startReport{}
	publish := func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if !r.ended {
			// Published without waiting: the operation need not wait for
			// it, and the final report on the same subject and connection
			// is stored after it (stop waits for this function).
			r.future = a.reportAsync(id, &events.OperationStarted{TaskRef: ref, StartedAt: began.UTC()})
		}
	}
	if a.cfg.StartedAfter == StartedAtOnce {
		publish()
		return r
	}
	r.mu.Lock()
	r.timer = time.AfterFunc(a.cfg.StartedAfter, publish)
	r.mu.Unlock()
	return r
}

// stop is called when the operation ended, before its final report: a
// started report not yet published never will be.
func (r *startReport) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = true
	if r.timer != nil {
		r.timer.Stop()
	}
}

// wait waits up to d for the started report's ack, if it was published,
// so that its failure is logged.
func (r *startReport) wait(d time.Duration, log zerolog.Logger) {
	r.stop()
	r.mu.Lock()
	f := r.future
	r.mu.Unlock()
	if f == nil {
		return
	}
	select {
	case <-f.Ok():
	case err := <-f.Err():
		log.Warn().Err(err).Msg("report started")
	case <-time.After(d):
	}
}

// prepare returns the spec a task's operation runs with, its secrets
// resolved, and the Replacer that hides their values (nil without
// secrets); or why the operation must not run: a secret is missing
// (ErrSecretMissing) or the policy refuses it (ErrRefused). The returned
// Replacer is valid with an error too, to hide values in its text.
func (a *Agent) prepare(task *events.Task) (json.RawMessage, *redact.Replacer, error) {
	spec, red, err := a.secrets.resolveSpec(task.Spec)
	if err != nil {
		return nil, nil, fmt.Errorf("agent %s: %w", a.cfg.Name, err)
	}
	if task.Kind != workflow.KindExec && task.Kind != workflow.KindHTTP {
		return spec, red, nil
	}
	s, err := stepOf(spec)
	if err != nil {
		return nil, red, fmt.Errorf("agent %s: %w", a.cfg.Name, err)
	}
	if err := a.cfg.Policy.Decide(OperationOf(task.Kind, s, exec.LookPath)); err != nil {
		return nil, red, fmt.Errorf("agent %s: %w", a.cfg.Name, err)
	}
	return spec, red, nil
}

// handBack returns a task that could not be checked before running (what
// failed): at once when the agent stops, else after a second, to this
// agent or another.
func handBack(ctx context.Context, m jetstream.Msg, log zerolog.Logger, err error, what string) {
	if ctx.Err() != nil {
		_ = m.Nak()
		return
	}
	log.Warn().Err(err).Msg(what + "; task will be redelivered")
	_ = m.NakWithDelay(time.Second)
}

// reported reports whether the results stream holds a final result of
// task (this attempt, under the token the task carries) from an earlier
// delivery. A malformed message on the subject is passed over.
func (a *Agent) reported(ctx context.Context, task *events.Task) (bool, error) {
	found := false
	err := history.ScanReports(ctx, a.js, bus.StreamResults, bus.QueueResults(task.Queue, task.ExecutionID), func(ev events.Event) error {
		ref, ok := events.ResultRef(ev.Data)
		if ok && ev.Type != events.TypeOperationStarted &&
			ref.TaskID == task.TaskID && ref.Attempt == task.Attempt && ref.Token == task.Token {
			found = true
		}
		return nil
	})
	return found, err
}

// finish acks the task once its result is stored; if the result could not
// be stored, the task is handed back to run again.
func (a *Agent) finish(m jetstream.Msg, reportErr error, log zerolog.Logger) {
	if reportErr != nil {
		log.Error().Err(reportErr).Msg("report result; task will be redelivered")
		_ = m.NakWithDelay(time.Second)
		return
	}
	if err := m.Ack(); err != nil {
		log.Warn().Err(err).Msg("ack task")
	}
}

// fitOutput replaces an output too large to store in a result message with
// a note saying so: the operation did run, and its status must still be
// recorded.
func (a *Agent) fitOutput(raw json.RawMessage) json.RawMessage {
	limit := int(a.js.Conn().MaxPayload()) - resultOverhead
	if len(raw) <= limit {
		return raw
	}
	note, _ := json.Marshal(map[string]any{"output_dropped": true, "bytes": len(raw),
		"reason": fmt.Sprintf("the output is %d bytes; a result message holds at most %d", len(raw), limit)})
	return note
}

// resultOverhead is room kept in a result message for headers and the
// task reference.
const resultOverhead = 16 << 10

// reportAsync publishes a result without waiting for its ack.
func (a *Agent) reportAsync(id string, p events.Payload) jetstream.PubAckFuture {
	msg, err := a.resultMsg(id, p)
	if err != nil {
		return nil
	}
	f, err := a.js.PublishMsgAsync(msg, jetstream.WithMsgID(id))
	if err != nil {
		a.log.Warn().Err(err).Str("result_id", id).Msg("report")
		return nil
	}
	return f
}

func (a *Agent) resultMsg(id string, p events.Payload) (*nats.Msg, error) {
	ref, _ := events.ResultRef(p)
	ev := events.New(a.cfg.Source, ref.ExecutionID, ref.Workflow, time.Now(), p)
	ev.ID = id
	return bus.Encode(bus.ResultSubject(ref.Queue, ref.ExecutionID), ev)
}

// reportFor is how long an agent tries to store a result before it hands
// its task back, to run again: far longer than a stream leader's election
// (4 to 9 s) and the task's ack wait, since a task handed back after its
// operation ran runs twice.
const reportFor = time.Minute

// report publishes a result, retrying for up to reportFor if JetStream
// is unreachable or the results stream has no leader (the heartbeat
// keeps the task ours meanwhile; the message id makes a retry of a
// stored result a no-op).
func (a *Agent) report(ctx context.Context, id string, p events.Payload) error {
	msg, err := a.resultMsg(id, p)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(reportFor)
	for backoff := 50 * time.Millisecond; ; backoff = min(backoff*2, 2*time.Second) {
		// Each attempt bounded: one sent as the results stream's leader
		// stopped (its node stopped or died) gets no answer, and would
		// wait the client's whole timeout.
		actx, cancel := context.WithTimeout(ctx, bus.PublishAttempt)
		_, err = a.js.PublishMsg(actx, msg, jetstream.WithMsgID(id))
		cancel()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil || errors.Is(err, nats.ErrMaxPayload) {
			return err
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
