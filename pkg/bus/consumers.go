package bus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/partition"
)

// Durable consumers the services bind to. The bootstrap creates them
// ([Bootstrap]); a service that manages the topology itself (no
// credentials: a test, an insecure dev stack) creates its own as it starts.
const (
	// ConsumerDispatcherCommands is the dispatchers' intake: it delivers
	// commands to any dispatcher, which checks them and puts them on their
	// execution's partition in the inbox stream.
	ConsumerDispatcherCommands = "dispatcher-commands"
	// ConsumerDispatcherResults delivers to any dispatcher the reports
	// stored before partitions (jf.results.<queue>.<execution>).
	ConsumerDispatcherResults = "dispatcher-results"
	// ConsumerDispatcherTimers delivers to any dispatcher the timers that
	// fired before partitions (jf.timers.<execution>).
	ConsumerDispatcherTimers = "dispatcher-timers"
	// ConsumerProjector feeds the api's projector (a pinned priority group:
	// one api replica at a time folds events, in order).
	ConsumerProjector = "projector"
	// ProjectorGroup is the projector consumer's pinned priority group.
	ProjectorGroup = "projector"
	// ConsumerJanitorAdvisories delivers max-deliveries advisories to the janitor.
	ConsumerJanitorAdvisories = "janitor-advisories"
)

// Names of a partition's consumers, each held by the dispatcher that
// holds the partition's lease.
func PartitionInboxConsumer(p int) string   { return fmt.Sprintf("dispatcher-inbox-%d", p) }
func PartitionResultsConsumer(p int) string { return fmt.Sprintf("dispatcher-results-%d", p) }
func PartitionTimersConsumer(p int) string  { return fmt.Sprintf("dispatcher-timers-%d", p) }
func PartitionNoticesConsumer(p int) string { return fmt.Sprintf("dispatcher-notices-%d", p) }

// IntakeAckWait is how long the intake may hold a command before it is
// given to another dispatcher: checking and routing one takes a publish,
// so a command held by a dispatcher that died moves on quickly.
const IntakeAckWait = 2 * time.Second

// AgentConsumer is the durable consumer shared by the agents of a queue.
func AgentConsumer(queue string) string { return "agent-" + queue }

// AgentBulkConsumer is the durable consumer of a queue's bulk lane
// ([BulkTaskSubject]). Every AgentConsumer name starts with "agent-", so
// no queue's name makes one of these.
func AgentBulkConsumer(queue string) string { return "bulk-agent-" + queue }

// DefaultTaskAckWait is how long a task may go without its agent's
// heartbeat (every quarter of it) before JetStream gives it to another
// agent: a dead agent's tasks run again within seconds, and a live agent
// heartbeats three times in it, however long its operation runs.
const DefaultTaskAckWait = 4 * time.Second

// DefaultDispatcherAckWait is how long a command, result or timer may be
// in a dispatcher's hands without its heartbeat (every third of it)
// before JetStream delivers it again. It bounds how long a message lost
// in flight stays unseen: one a consumer's leader delivered just before
// its node died is delivered again by the new leader only after it.
const DefaultDispatcherAckWait = 5 * time.Second

// Durables sizes the durable consumers. The zero value is the default.
type Durables struct {
	// DispatcherAckWait is how long a command, result or timer may be in a
	// dispatcher's hands before JetStream gives it to another. Default
	// DefaultDispatcherAckWait.
	DispatcherAckWait time.Duration
	// DispatcherMaxAckPending bounds messages in flight per dispatcher
	// consumer. Default 1024.
	DispatcherMaxAckPending int
	// Partitions is the number of dispatcher partitions ([Config.Partitions]),
	// each with its inbox, results and timers consumers. Default 8.
	Partitions int
	// Queues are the agent queues to create consumers for. Default ["default"].
	Queues []string
	// TaskAckWait is how long a task may go without an agent's heartbeat
	// before it is given to another agent. Default DefaultTaskAckWait.
	TaskAckWait time.Duration
	// MaxDeliver is how often a task is delivered before the janitor fails
	// it. Default 5.
	MaxDeliver int
}

func (d Durables) withDefaults() Durables {
	d.DispatcherAckWait = cmp.Or(d.DispatcherAckWait, DefaultDispatcherAckWait)
	d.DispatcherMaxAckPending = cmp.Or(d.DispatcherMaxAckPending, 1024)
	d.Partitions = cmp.Or(d.Partitions, partition.DefaultCount)
	if len(d.Queues) == 0 {
		d.Queues = []string{"default"}
	}
	d.TaskAckWait = cmp.Or(d.TaskAckWait, DefaultTaskAckWait)
	d.MaxDeliver = cmp.Or(d.MaxDeliver, 5)
	return d
}

// Validate reports settings no consumer can have.
func (d Durables) Validate() error {
	switch {
	case d.DispatcherAckWait < 0 || d.TaskAckWait < 0:
		return errors.New("bus: ack waits must not be negative")
	case d.TaskAckWait != 0 && d.TaskAckWait < 300*time.Millisecond:
		return fmt.Errorf("bus: task ack wait %s is below 300ms: agents could not heartbeat in time", d.TaskAckWait)
	case d.DispatcherMaxAckPending < 0 || d.MaxDeliver < 0:
		return errors.New("bus: max ack pending and max deliver must not be negative")
	case d.Partitions < 0 || d.Partitions > partition.MaxCount:
		return fmt.Errorf("bus: %d partitions: use 1 to %d", d.Partitions, partition.MaxCount)
	}
	for _, q := range d.Queues {
		if !events.ValidQueueName(q) {
			return fmt.Errorf("bus: queue %q: %s", q, events.QueueNameRule)
		}
	}
	return nil
}

// Consumer is a durable consumer on a stream.
type Consumer struct {
	Stream string
	Config jetstream.ConsumerConfig
}

func dispatcherConsumer(d Durables, stream, name, filter, what string) Consumer {
	return Consumer{Stream: stream, Config: jetstream.ConsumerConfig{
		Durable: name, FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: d.DispatcherAckWait, MaxAckPending: d.DispatcherMaxAckPending, MaxDeliver: -1,
		DeliverPolicy: jetstream.DeliverAllPolicy, Description: "jetflow dispatchers: " + what,
	}}
}

// DispatcherConsumers are the consumers every dispatcher takes from: the
// intake of commands, and the reports and timers stored before partitions.
func DispatcherConsumers(d Durables) []Consumer {
	d = d.withDefaults()
	intake := dispatcherConsumer(d, StreamCommands, ConsumerDispatcherCommands, CommandsPrefix+".>", "intake of commands")
	intake.Config.AckWait = IntakeAckWait
	return []Consumer{
		intake,
		dispatcherConsumer(d, StreamResults, ConsumerDispatcherResults, ResultsPrefix+".*.*", "reports stored before partitions"),
		dispatcherConsumer(d, StreamTimers, ConsumerDispatcherTimers, TimersPrefix+".*", "timers fired before partitions"),
	}
}

// PartitionConsumers are the consumers of partition p, in the order a
// dispatcher binds them: its long timers' notices (docs/adr/0019; first,
// so that the timers armed by the first commands handled may have
// notices), its inbox (commands), its reports and its timers.
func PartitionConsumers(d Durables, p int) []Consumer {
	d = d.withDefaults()
	part := fmt.Sprintf("partition %d", p)
	timers := dispatcherConsumer(d, StreamTimers, PartitionTimersConsumer(p), fmt.Sprintf("%s.%d.*", TimersPrefix, p), part+" timers")
	timers.Config.MaxAckPending = max(d.DispatcherMaxAckPending, TimersMaxAckPending)
	// Notices come by the thousand too, a minute before their timers.
	notices := dispatcherConsumer(d, StreamTimers, PartitionNoticesConsumer(p), fmt.Sprintf("%s.%d.*", NoticesPrefix, p), part+" long timers' notices")
	notices.Config.MaxAckPending = timers.Config.MaxAckPending
	return []Consumer{
		notices,
		dispatcherConsumer(d, StreamInbox, PartitionInboxConsumer(p), fmt.Sprintf("%s.%d.*", InboxPrefix, p), part+" commands"),
		dispatcherConsumer(d, StreamResults, PartitionResultsConsumer(p), fmt.Sprintf("%s.*.%d.*", ResultsPrefix, p), part+" reports"),
		timers,
	}
}

// TimersMaxAckPending is the least MaxAckPending of a partition's timers
// consumer: a dispatcher keeps a fired timer's message until it has
// recorded the firing and acted on it, and thousands of timers may fall
// due at the same instant; with the commands' bound (1024 by default) the
// rest of a partition's would wait, undelivered, for the first ones'
// acknowledgements. Its messages are small (a few hundred bytes).
const TimersMaxAckPending = 4096

// AgentQueueConsumer is the consumer of one agent queue.
func AgentQueueConsumer(d Durables, queue string) Consumer {
	d = d.withDefaults()
	return Consumer{Stream: StreamTasks, Config: jetstream.ConsumerConfig{
		Durable: AgentConsumer(queue), FilterSubject: TaskSubject(queue), AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: d.TaskAckWait, MaxDeliver: d.MaxDeliver, MaxAckPending: 4096,
		Description: "jetflow agents of queue " + queue,
	}}
}

// AgentBulkQueueConsumer is the consumer of one agent queue's bulk lane:
// the same settings as AgentQueueConsumer.
func AgentBulkQueueConsumer(d Durables, queue string) Consumer {
	c := AgentQueueConsumer(d, queue)
	c.Config.Durable, c.Config.FilterSubject = AgentBulkConsumer(queue), BulkTaskSubject(queue)
	c.Config.Description = "jetflow agents of queue " + queue + ", bulk lane"
	return c
}

// ProjectorPinnedTTL is how long the projector's consumer keeps its pin
// (one api projects at a time) without a pull from the api holding it:
// how long the read models wait when that api dies. The projector pulls
// at least twice in it.
const ProjectorPinnedTTL = 5 * time.Second

// ProjectorConsumerSpec is the projector's consumer.
func ProjectorConsumerSpec() Consumer {
	return Consumer{Stream: StreamEvents, Config: jetstream.ConsumerConfig{
		Durable: ConsumerProjector, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: -1,
		MaxAckPending: 4096, FilterSubject: EventsPrefix + ".>",
		PriorityPolicy: jetstream.PriorityPolicyPinned, PinnedTTL: ProjectorPinnedTTL, PriorityGroups: []string{ProjectorGroup},
		Description: "jetflow read-model projector (api)",
	}}
}

// JanitorConsumerSpec is the janitor's consumer of advisories.
func JanitorConsumerSpec() Consumer {
	return Consumer{Stream: StreamAdvisories, Config: jetstream.ConsumerConfig{
		Durable: ConsumerJanitorAdvisories, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second, MaxDeliver: -1,
	}}
}

// AllConsumers lists every durable consumer of a deployment.
func AllConsumers(d Durables) []Consumer {
	d = d.withDefaults()
	out := DispatcherConsumers(d)
	for p := range d.Partitions {
		out = append(out, PartitionConsumers(d, p)...)
	}
	for _, q := range d.Queues {
		out = append(out, AgentQueueConsumer(d, q), AgentBulkQueueConsumer(d, q))
	}
	return append(out, ProjectorConsumerSpec(), JanitorConsumerSpec())
}

// closedWhileMade reports whether err is the server's answer to a create
// of a consumer that was deleted before the create finished ("consumer
// closed"): made again, it is made.
func closedWhileMade(err error) bool {
	var aerr *jetstream.APIError
	return errors.As(err, &aerr) && aerr.ErrorCode == jetstream.JSErrCodeConsumerCreate &&
		strings.Contains(aerr.Description, "consumer closed")
}

// Bind returns the durable consumer c. A service that manages the topology
// creates (or updates) it, trying again every second while JetStream
// times out or elects a leader (calling wait with the reason); one that
// does not (it runs with credentials
// that may not create consumers) waits until the bootstrap has created
// it, calling wait with the reason every few seconds, until ctx ends.
func Bind(ctx context.Context, js jetstream.JetStream, manage bool, c Consumer, wait func(error)) (jetstream.Consumer, error) {
	for manage {
		cons, err := js.CreateOrUpdateConsumer(ctx, c.Stream, c.Config)
		if err == nil {
			return cons, nil
		}
		err = fmt.Errorf("create consumer %s on %s: %w", c.Config.Durable, c.Stream, err)
		// A timeout or a leader being elected passes: wait, as a bound
		// service waits for the bootstrap, instead of stopping. So does a
		// consumer deleted while it was being made (closed under it).
		if !(Transient(err) || closedWhileMade(err)) || ctx.Err() != nil {
			return nil, err
		}
		if wait != nil {
			wait(err)
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(time.Second):
		}
	}
	for {
		cons, err := js.Consumer(ctx, c.Stream, c.Config.Durable)
		if err == nil {
			return cons, nil
		}
		if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
			err = fmt.Errorf("consumer %s on %s does not exist yet: run jetflow bootstrap (jetflow dev does): %w",
				c.Config.Durable, c.Stream, err)
		} else {
			err = fmt.Errorf("bind consumer %s on %s: %w", c.Config.Durable, c.Stream, err)
		}
		if wait != nil && ctx.Err() == nil {
			wait(err)
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(2 * time.Second):
		}
	}
}

// Bootstrap creates (or brings up to date) every stream, bucket and
// durable consumer: what a deployment's admin identity runs once, and
// `jetflow dev` at every start. Services need no JetStream admin right
// afterwards.
func Bootstrap(ctx context.Context, js jetstream.JetStream, c Config, d Durables) error {
	if err := d.Validate(); err != nil {
		return err
	}
	// A cluster that has just formed may refuse for a while (no meta
	// leader yet, or not every server counted online): tried again for
	// LayoutPatience.
	return retryLayout(ctx, LayoutPatience, c.OnRetry, func() error {
		if err := Ensure(ctx, js, c); err != nil {
			return err
		}
		n, err := Partitions(ctx, js)
		if err != nil {
			return err
		}
		d.Partitions = n
		for _, cons := range AllConsumers(d) {
			if _, err := js.CreateOrUpdateConsumer(ctx, cons.Stream, cons.Config); err != nil {
				return fmt.Errorf("ensure consumer %s on %s: %w", cons.Config.Durable, cons.Stream, err)
			}
		}
		return nil
	})
}
