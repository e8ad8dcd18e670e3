// Package auth issues jetflow's NATS identities and holds what each may
// do. NATS runs in operator mode (docs/adr/0002): an operator signs one
// account per namespace, and each account signs a user per role whose JWT
// carries that role's permissions. The permissions are data in this
// package, so that the server enforces them, the tests check them and
// docs/security.md lists them.
package auth

import (
	"fmt"
	"slices"
	"strings"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/events"
)

// Role is what a NATS identity is for.
type Role string

// Roles.
const (
	// RoleAdmin may do everything: the bootstrap (streams, buckets and
	// durable consumers) and repairs.
	RoleAdmin Role = "admin"
	// RoleDispatcher is the only writer of histories.
	RoleDispatcher Role = "dispatcher"
	// RoleAgent takes the tasks of its queues and reports about them.
	RoleAgent Role = "agent"
	// RoleAPI is the HTTP front door and the projector.
	RoleAPI Role = "api"
	// RoleJanitor does the maintenance sweeps, retention included.
	RoleJanitor Role = "janitor"
	// RoleClient is for external programs: publish start, signal and
	// action commands (never on the api's subjects, jf.commands.api.>,
	// whose commands carry an authenticated actor); read histories and
	// rejections.
	RoleClient Role = "client"
)

// Roles lists the roles, in the order the documentation shows them.
var Roles = []Role{RoleAdmin, RoleDispatcher, RoleAgent, RoleAPI, RoleJanitor, RoleClient}

// ParseRole reads a role's name.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	names := make([]string, len(Roles))
	for i, r := range Roles {
		names[i] = string(r)
	}
	return "", fmt.Errorf("auth: unknown role %q: use one of %s", s, strings.Join(names, ", "))
}

// Permissions are subjects a user may and may not publish and subscribe
// to (NATS wildcards; a deny wins over an allow).
type Permissions struct {
	PubAllow, PubDeny []string
	SubAllow, SubDeny []string
}

// compact sorts each list and drops repeats.
func (p Permissions) compact() Permissions {
	c := func(l []string) []string {
		l = slices.Clone(l)
		slices.Sort(l)
		return slices.Compact(l)
	}
	return Permissions{PubAllow: c(p.PubAllow), PubDeny: c(p.PubDeny), SubAllow: c(p.SubAllow), SubDeny: c(p.SubDeny)}
}

// API subjects of JetStream (nats-server's $JS.API), as used below.
const (
	jsAPI = "$JS.API."
	jsAck = "$JS.ACK."
	jsFC  = "$JS.FC."
)

// streamInfo lets a user look a stream (or a bucket's stream) up.
func streamInfo(streams ...string) []string {
	out := make([]string, len(streams))
	for i, s := range streams {
		out[i] = jsAPI + "STREAM.INFO." + s
	}
	return out
}

// readStream lets a user read a stream: single messages (by sequence, or
// the last of a subject) and, with filters, ordered consumers filtered to
// them. The CONSUMER.CREATE form with the filter in the subject lets the
// permission bound what such a consumer reads. No role gets consumer
// rights on JF_TASKS this way: the agents' durable consumers live there,
// and their names (agent-<queue>) cannot be matched by a wildcard.
func readStream(stream string, filters ...string) []string {
	out := []string{
		jsAPI + "STREAM.INFO." + stream,
		jsAPI + "STREAM.MSG.GET." + stream,
		jsAPI + "DIRECT.GET." + stream,
		jsAPI + "DIRECT.GET." + stream + ".>",
	}
	if len(filters) == 0 {
		return out
	}
	out = append(out,
		jsAPI+"CONSUMER.INFO."+stream+".*",
		jsAPI+"CONSUMER.MSG.NEXT."+stream+".*",
		jsAPI+"CONSUMER.DELETE."+stream+".*",
		// An ordered consumer (a KV watch is one) answers the server's
		// flow control; without it the server stops delivering to it once
		// a few megabytes went by, and the watch stalls without an error.
		jsFC+stream+".>")
	for _, f := range filters {
		out = append(out, jsAPI+"CONSUMER.CREATE."+stream+".*."+f)
	}
	return out
}

// readBucket lets a user get keys and watch or list a bucket.
func readBucket(b string) []string {
	return readStream(bus.BucketStream(b), bus.BucketSubject(b, ">"))
}

// writeBucket lets a user put, create, update and delete keys under
// prefix ("" for every key) of a bucket: a KV write is a publish on the
// key's subject.
func writeBucket(b, prefix string) []string {
	if prefix == "" {
		return []string{bus.BucketSubject(b, ">")}
	}
	return []string{bus.BucketSubject(b, prefix+">")}
}

// consume lets a user pull from and acknowledge a durable consumer.
func consume(stream, consumer string) []string {
	return []string{
		jsAPI + "STREAM.INFO." + stream,
		jsAPI + "CONSUMER.INFO." + stream + "." + consumer,
		jsAPI + "CONSUMER.MSG.NEXT." + stream + "." + consumer,
		jsAck + stream + "." + consumer + ".>",
	}
}

// consumeAny lets a user pull from, acknowledge and reset any durable
// consumer of a stream: the dispatchers' partition consumers, whose
// names a subject wildcard cannot single out. Only streams on which no
// other role has a durable consumer get it.
func consumeAny(stream string) []string {
	return []string{
		jsAPI + "STREAM.INFO." + stream,
		jsAPI + "CONSUMER.INFO." + stream + ".*",
		jsAPI + "CONSUMER.MSG.NEXT." + stream + ".*",
		jsAPI + "CONSUMER.RESET." + stream + ".*",
		jsAck + stream + ".>",
	}
}

// denyOthersDurables keeps a role off the durable consumers it does not
// own on the streams it may read with consumers: no pulling from them
// (which would hold their messages), no updating or deleting them. (The
// agents' consumers are on JF_TASKS, where only agents of the queue and
// the admin have consumer rights at all.)
func denyOthersDurables(own ...string) []string {
	var out []string
	for _, name := range []string{bus.ConsumerDispatcherCommands, bus.ConsumerDispatcherResults, bus.ConsumerDispatcherTimers,
		bus.ConsumerProjector, bus.ConsumerJanitorAdvisories} {
		if !slices.Contains(own, name) {
			out = append(out, denyDurable(name)...)
		}
	}
	return out
}

func denyDurable(name string) []string {
	return []string{
		jsAPI + "CONSUMER.CREATE.*." + name,
		jsAPI + "CONSUMER.CREATE.*." + name + ".>",
		jsAPI + "CONSUMER.DURABLE.CREATE.*." + name,
		jsAPI + "CONSUMER.MSG.NEXT.*." + name,
		jsAPI + "CONSUMER.DELETE.*." + name,
		jsAck + "*." + name + ".>",
	}
}

// admin operations nobody but the admin may call, whatever else a role
// allows: creating, changing, purging or deleting streams (and buckets).
var adminOnly = []string{
	jsAPI + "STREAM.CREATE.>",
	jsAPI + "STREAM.UPDATE.>",
	jsAPI + "STREAM.DELETE.>",
	jsAPI + "STREAM.RESTORE.>",
	jsAPI + "STREAM.SNAPSHOT.>",
	jsAPI + "STREAM.PEER.>",
	jsAPI + "STREAM.LEADER.>",
	jsAPI + "CONSUMER.DURABLE.CREATE.>",
	jsAPI + "ACCOUNT.>",
	jsAPI + "META.>",
}

// Inbox is the prefix of a user's reply subjects: its own, so that no user
// can subscribe to the JetStream deliveries and answers of another.
func Inbox(userPublicKey string) string {
	if len(userPublicKey) > 17 {
		userPublicKey = userPublicKey[1:17]
	}
	return "_INBOX_" + userPublicKey
}

// PermissionsFor returns the permissions of role; queues are an agent's
// queues (every other role ignores them). inbox is the user's inbox
// prefix ([Inbox]).
func PermissionsFor(role Role, queues []string, inbox string) (Permissions, error) {
	inboxSub := []string{inbox + ".>"}
	switch role {
	case RoleAdmin:
		return Permissions{PubAllow: []string{">"}, SubAllow: []string{">"}}, nil

	case RoleDispatcher:
		// Reports agents hand straight to it, which it answers on the
		// agents' answer subjects, nowhere else (docs/adr/0009).
		p := Permissions{SubAllow: slices.Concat(inboxSub, []string{bus.DirectPrefix + ".>"})}
		p.PubAllow = slices.Concat(
			[]string{
				bus.EventsPrefix + ".>",     // the only writer of histories
				bus.AnswersPrefix + ".>",    // answers to reports handed straight to it
				bus.TasksPrefix + ".>",      // tasks for any queue
				bus.SchedulesPrefix + ".>",  // durable timers
				bus.RejectionsPrefix + ".>", // why a command changed nothing
				bus.KillsPrefix + ".>",      // kill notices for agents
				bus.InboxPrefix + ".>",      // checked commands, on their partition; wakes of lock holders
			},
			consume(bus.StreamCommands, bus.ConsumerDispatcherCommands),
			// The partitions' consumers (dispatcher-<kind>-<partition>), and
			// the reset that hands a dead owner's messages to the next.
			consumeAny(bus.StreamInbox), consumeAny(bus.StreamResults), consumeAny(bus.StreamTimers),
			readBucket(bus.BucketDispatchers), writeBucket(bus.BucketDispatchers, "member."), writeBucket(bus.BucketDispatchers, "lease."),
			readStream(bus.StreamEvents, bus.EventsPrefix+".>"),
			readStream(bus.StreamResults, bus.ResultsPrefix+".>"),
			readStream(bus.StreamKills, bus.KillsPrefix+".>"),
			readStream(bus.StreamTasks), // a task sent before the dedupe window is looked for before it is sent again
			streamInfo(bus.StreamTimers, bus.StreamRejections),
			readBucket(bus.BucketDefinitions),
			readBucket(bus.BucketExecutionIDs), writeBucket(bus.BucketExecutionIDs, ""),
			readBucket(bus.BucketLocks), writeBucket(bus.BucketLocks, ""),
		)
		p.PubDeny = slices.Concat(adminOnly, denyOthersDurables(bus.ConsumerDispatcherCommands,
			bus.ConsumerDispatcherResults, bus.ConsumerDispatcherTimers))
		return p, nil

	case RoleAgent:
		if len(queues) == 0 {
			return Permissions{}, fmt.Errorf("auth: an agent's identity names the queues it serves")
		}
		// The answers to its direct reports: its own (docs/adr/0009).
		p := Permissions{SubAllow: slices.Concat(inboxSub, []string{bus.AnswerSubjects(inbox)})}
		for _, q := range queues {
			if !events.ValidQueueName(q) {
				return Permissions{}, fmt.Errorf("auth: queue %q: %s", q, events.QueueNameRule)
			}
			p.PubAllow = slices.Concat(p.PubAllow,
				[]string{bus.ResultSubject(q, "*"), // reports about its queues' tasks only
					bus.DirectQueueSubjects(q)}, // stored, or handed straight to a dispatcher
				consume(bus.StreamTasks, bus.AgentConsumer(q)),
				consume(bus.StreamTasks, bus.AgentBulkConsumer(q)), // and its bulk lane
				readStream(bus.StreamResults))
		}
		p.PubAllow = slices.Concat(p.PubAllow, readStream(bus.StreamKills, bus.KillsPrefix+".>"))
		p.PubDeny = slices.Concat(adminOnly, denyOthersDurables())
		return p, nil

	case RoleAPI:
		p := Permissions{SubAllow: slices.Concat(inboxSub, []string{
			bus.EventsPrefix + ".>",     // what became of a command it sent
			bus.RejectionsPrefix + ".>", // and why not
		})}
		p.PubAllow = slices.Concat(
			// Its commands carry the authenticated actor: only the api
			// may publish where commands may carry one.
			[]string{bus.APICommandsPrefix + ".>"},
			consume(bus.StreamEvents, bus.ConsumerProjector),
			[]string{jsAPI + "CONSUMER.UNPIN." + bus.StreamEvents + "." + bus.ConsumerProjector},
			readStream(bus.StreamEvents, bus.EventsPrefix+".>"),
			readStream(bus.StreamRejections, bus.RejectionsPrefix+".>"),
			readBucket(bus.BucketDefinitions), writeBucket(bus.BucketDefinitions, "def."), writeBucket(bus.BucketDefinitions, "latest."),
			readBucket(bus.BucketExecutionIDs),
			readBucket(bus.BucketExecutions), writeBucket(bus.BucketExecutions, ""),
			readBucket(bus.BucketLocks),
			readBucket(bus.BucketAPIKeys), writeBucket(bus.BucketAPIKeys, ""), // the HTTP callers' keys
		)
		p.PubDeny = slices.Concat(adminOnly, denyOthersDurables(bus.ConsumerProjector))
		return p, nil

	case RoleJanitor:
		p := Permissions{SubAllow: inboxSub}
		p.PubAllow = slices.Concat(
			[]string{bus.SubjectReconcile, bus.SubjectExpire, bus.SubjectClearLock,
				bus.ResultsPrefix + ".*.*",                                       // reports of tasks lost with their agents
				jsAPI + "STREAM.PURGE." + bus.StreamEvents,                       // retention: expired histories
				jsAPI + "STREAM.PURGE." + bus.StreamResults,                      // and their reports
				jsAPI + "STREAM.MSG.DELETE." + bus.StreamTasks,                   // a lost task, once failed
				jsAPI + "STREAM.PURGE." + bus.BucketStream(bus.BucketExecutions), // and read models
			},
			consume(bus.StreamAdvisories, bus.ConsumerJanitorAdvisories),
			readStream(bus.StreamEvents, bus.EventsPrefix+".>"),
			readStream(bus.StreamResults), // reports of a lost task, one get at a time: no consumer rights where the dispatchers' are
			readStream(bus.StreamTasks),
			readBucket(bus.BucketExecutions), writeBucket(bus.BucketExecutions, ""),
			readBucket(bus.BucketExecutionIDs), writeBucket(bus.BucketExecutionIDs, ""),
			readBucket(bus.BucketLocks),
			readBucket(bus.BucketDefinitions), writeBucket(bus.BucketDefinitions, "setting."),
		)
		p.PubDeny = slices.Concat(adminOnly, denyOthersDurables(bus.ConsumerJanitorAdvisories))
		return p, nil

	case RoleClient:
		p := Permissions{SubAllow: slices.Concat(inboxSub, []string{bus.EventsPrefix + ".>", bus.RejectionsPrefix + ".>"})}
		p.PubAllow = slices.Concat(
			[]string{bus.SubjectStart, bus.SubjectSignal, bus.SubjectAction},
			readStream(bus.StreamEvents, bus.EventsPrefix+".>"),
			readStream(bus.StreamRejections, bus.RejectionsPrefix+".>"),
		)
		p.PubDeny = slices.Concat(adminOnly, denyOthersDurables())
		return p, nil
	}
	return Permissions{}, fmt.Errorf("auth: unknown role %q", role)
}

// LooksUp reports whether p lets its user look stream up (its info).
func (p Permissions) LooksUp(stream string) bool {
	want := jsAPI + "STREAM.INFO." + stream
	for _, a := range p.PubAllow {
		if a == want || a == ">" || a == jsAPI+">" {
			return true
		}
	}
	return false
}
