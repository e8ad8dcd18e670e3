// Package bus is where jetflow's events meet NATS. It declares the
// JetStream topology (the streams, subjects and KV buckets and their
// names, consumers' shared settings) and creates it idempotently: every
// service calls [Ensure] at start, so any of them can come up first. And
// it puts events on NATS messages: [Encode] and [Decode] are the
// CloudEvents binary-mode codec every service writes and reads with.
//
// Package events, the vocabulary, does not depend on NATS; this package
// holds everything of it that does.
package bus

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/partition"
)

// ErrConflict means another writer appended to the subject first.
var ErrConflict = errors.New("bus: wrong last sequence")

// Config sizes the topology.
type Config struct {
	// Replicas of every stream and bucket: 1 for a single server, 3 in a
	// cluster. Default 1.
	Replicas int
	// Duplicates is the dedupe window of the commands stream: a start
	// CloudEvent re-published within it is dropped by JetStream (the
	// dispatcher recognises it at any time anyway). Default 10m.
	Duplicates time.Duration
	// WorkDuplicates is the dedupe window of the tasks and results streams,
	// long enough for a dispatcher or agent to re-publish after a restart.
	// Default DefaultWorkDuplicates; a dispatcher publishes a task it may
	// have sent again without looking for it only within half of that
	// default (docs/adr/0007), so a shorter one is taken as the default.
	WorkDuplicates time.Duration
	// HistoryDuplicates is the dedupe window of the events stream. History
	// appends are fenced by the expected last subject sequence, and a retried
	// append is recognised by its id, so the window only has to cover an
	// immediate retry; the server keeps every id for the whole window, which
	// costs memory in proportion to the event rate. Default 30s.
	HistoryDuplicates time.Duration
	// CommandsMaxAge bounds how long commands, results and rejections are
	// kept after they were handled (they are an audit trail, not the truth).
	// Default 7 days.
	CommandsMaxAge time.Duration
	// OnRetry, if set, is told why Open (or Bootstrap) is still waiting
	// for JetStream.
	OnRetry func(err error)
	// Partitions splits the executions among the dispatchers (package
	// partition). Recorded at the first bootstrap and fixed afterwards:
	// 0 takes the recorded number, or 8 for a new deployment.
	Partitions int
	// Restricted: the identity may not change the topology (a service
	// running with credentials): Open only connects, and the streams,
	// buckets and consumers are the bootstrap's ([Bootstrap]).
	Restricted bool
	// RequestTimeout bounds a JetStream request that has no deadline of
	// its own (0: nats.go's 5 s). Services use [ServiceRequestTimeout].
	RequestTimeout time.Duration
}

// ServiceRequestTimeout is how long a service's JetStream request without
// a deadline of its own waits for its answer. The client does not fail a
// request in flight when its connection drops (its server died, or moved
// its clients away in lame duck mode): the answer never comes, and the
// request waits this long before it is tried again. nats.go's 5 s made a
// start that was being checked when its api's server died wait 5 s, and
// the execution's first step with it; every caller retries a timeout
// (bus.Transient), and a healthy cluster answers in milliseconds.
const ServiceRequestTimeout = 2 * time.Second

// DefaultWorkDuplicates is the default (and the least) dedupe window of
// the tasks and results streams (Config.WorkDuplicates).
const DefaultWorkDuplicates = 2 * time.Minute

func (c Config) withDefaults() Config {
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.Duplicates <= 0 {
		c.Duplicates = 10 * time.Minute
	}
	c.WorkDuplicates = max(c.WorkDuplicates, DefaultWorkDuplicates)
	if c.HistoryDuplicates <= 0 {
		c.HistoryDuplicates = 30 * time.Second
	}
	if c.CommandsMaxAge <= 0 {
		c.CommandsMaxAge = 7 * 24 * time.Hour
	}
	return c
}

// Streams returns the stream configurations. The streams read by
// subject (histories, reports, commands, rejections, kill notices) allow
// direct gets: history.Scan reads them in batches from any replica
// (docs/adr/0006). Work queues and advisories are only consumed.
func Streams(c Config) []jetstream.StreamConfig {
	c = c.withDefaults()
	return []jetstream.StreamConfig{
		{
			Name: StreamEvents, Subjects: []string{EventsPrefix + ".>"},
			Description: "jetflow execution histories, one subject per execution (append-only)",
			Storage:     jetstream.FileStorage, Replicas: c.Replicas, Duplicates: c.HistoryDuplicates,
			Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardNew, DenyDelete: true,
			AllowDirect: true, // histories are read in batches from any replica (history.Scan)
			// Group commit (history.Options.GroupCommit, docs/adr/0020)
			// writes appends in atomic batches.
			AllowAtomicPublish: true,
		},
		{
			Name: StreamCommands, Subjects: []string{CommandsPrefix + ".>"},
			Description: "jetflow commands (start, signal, action, reconcile)",
			Storage:     jetstream.FileStorage, Replicas: c.Replicas, Duplicates: c.Duplicates, MaxAge: c.CommandsMaxAge,
			AllowDirect: true,
		},
		{
			Name: StreamTimers, Subjects: []string{SchedulesPrefix + ".>", TimersPrefix + ".>"},
			Description: "jetflow durable timers: message schedules on jf.schedules.<timer> fire into jf.timers.<execution>",
			Storage:     jetstream.FileStorage, Replicas: c.Replicas, Duplicates: c.WorkDuplicates,
			Retention: jetstream.WorkQueuePolicy, AllowMsgSchedules: true, AllowRollup: true,
		},
		{
			Name: StreamTasks, Subjects: []string{TasksPrefix + ".>"},
			Description: "jetflow operations for agents, one subject per queue",
			Storage:     jetstream.FileStorage, Replicas: c.Replicas, Duplicates: c.WorkDuplicates,
			Retention:   jetstream.WorkQueuePolicy,
			AllowDirect: true, // a dispatcher looks for a task sent before the dedupe window (docs/adr/0007)
			AllowMsgTTL: true, // its keepers expire by themselves (TasksKeeperSubject)
			// Group commit (the dispatcher's -group-commit,
			// docs/adr/0020) publishes tasks in atomic batches.
			AllowAtomicPublish: true,
		},
		{
			Name: StreamResults, Subjects: []string{ResultsPrefix + ".>"},
			Description: "jetflow operation results reported by agents, stored on jf.results.<queue>.<partition>.<execution>",
			Storage:     jetstream.FileStorage, Replicas: c.Replicas, Duplicates: c.WorkDuplicates, MaxAge: c.CommandsMaxAge,
			SubjectTransform: ResultsTransform(c.Partitions),
			AllowDirect:      true, // reports are read in batches from any replica (history.ScanReports)
		},
		{
			Name: StreamInbox, Subjects: []string{InboxPrefix + ".>"},
			Description: "jetflow commands checked by the dispatchers' intake, on jf.inbox.<partition>.<execution>",
			Storage:     jetstream.FileStorage, Replicas: c.Replicas, Duplicates: c.WorkDuplicates,
			Retention: jetstream.WorkQueuePolicy,
		},
		{
			Name: StreamKills, Subjects: []string{KillsPrefix + ".>"},
			Description: "jetflow notices for agents: terminate a killed execution's operations, refuse an ended run's tasks, terminate one attempt",
			Storage:     jetstream.FileStorage, Replicas: c.Replicas, Duplicates: c.WorkDuplicates,
			MaxAge: 24 * time.Hour, MaxMsgsPerSubject: 1, AllowDirect: true,
		},
		{
			Name: StreamRejections, Subjects: []string{RejectionsPrefix + ".>"},
			Description: "why jetflow rejected a command",
			Storage:     jetstream.FileStorage, Replicas: c.Replicas, MaxAge: c.CommandsMaxAge, AllowDirect: true,
		},
		{
			Name: StreamAdvisories, Subjects: []string{MaxDeliveriesAdvisories},
			Description: "max-deliveries advisories of task consumers, kept for the janitor",
			Storage:     jetstream.FileStorage, Replicas: c.Replicas, MaxAge: c.CommandsMaxAge,
		},
	}
}

// WholeStream reports whether filter is the whole of the jetflow stream
// named stream (its one subject, e.g. jf.events.> of JF_EVENTS): a
// reader may then ask for every message, which the server answers
// without matching each subject.
func WholeStream(stream, filter string) bool {
	for _, sc := range Streams(Config{}) {
		if sc.Name == stream {
			return len(sc.Subjects) == 1 && sc.Subjects[0] == filter
		}
	}
	return false
}

// ResultsTransform stores a report published on
// jf.results.<queue>.<execution> under jf.results.<queue>.<partition>.<execution>:
// nats-server's partition() hashes the execution id as [partition.Of] does.
func ResultsTransform(partitions int) *jetstream.SubjectTransformConfig {
	return &jetstream.SubjectTransformConfig{
		Source:      ResultsPrefix + ".*.*",
		Destination: fmt.Sprintf("%s.{{wildcard(1)}}.{{partition(%d,2)}}.{{wildcard(2)}}", ResultsPrefix, max(partitions, 1)),
	}
}

// StreamAdvisories captures JetStream's max-deliveries advisories for the
// tasks stream, so that the janitor never misses one while it is down.
const StreamAdvisories = "JF_ADVISORIES"

// MaxDeliveriesAdvisories is the subject of those advisories.
const MaxDeliveriesAdvisories = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + StreamTasks + ".>"

// DispatchersMarkerTTL is how long the dispatchers' bucket keeps the
// marker of an expired key. A dispatcher taking a partition reads in it
// whether the lease's last holder may have died (partition.Vacancy): an
// expiry whose marker is gone looks like a lease never held, so it must
// outlive how far back a dispatcher looks for the local steps of a
// holder that died (the dispatcher's rescue window and its longest lease
// TTL). Markers cost nothing while they last.
const DispatchersMarkerTTL = 2 * time.Minute

// Buckets returns the KV bucket configurations.
func Buckets(c Config) []jetstream.KeyValueConfig {
	c = c.withDefaults()
	return []jetstream.KeyValueConfig{
		{Bucket: BucketDefinitions, Description: "workflow definitions by name and version", History: 1,
			Storage: jetstream.FileStorage, Replicas: c.Replicas},
		{Bucket: BucketExecutionIDs, Description: "every execution id ever claimed, with its start command", History: 1,
			Storage: jetstream.FileStorage, Replicas: c.Replicas},
		{Bucket: BucketExecutions, Description: "execution read models (rebuildable projection)", History: 1,
			Storage: jetstream.FileStorage, Replicas: c.Replicas},
		{Bucket: BucketLocks, Description: "workflow locks: holders and FIFO waiters per lock name (compare-and-set only)", History: 1,
			Storage: jetstream.FileStorage, Replicas: c.Replicas},
		{Bucket: BucketDispatchers, Description: "dispatchers alive, their partitions' leases and the number of partitions", History: 1,
			Storage: jetstream.FileStorage, Replicas: c.Replicas, LimitMarkerTTL: DispatchersMarkerTTL},
		{Bucket: BucketAPIKeys, Description: "the api's keys: name, scopes, namespaces and the SHA-256 of the token, never the token", History: 1,
			Storage: jetstream.FileStorage, Replicas: c.Replicas},
	}
}

// Ensure creates every stream and bucket that is missing and updates those
// whose settings differ from c. Streams and buckets that are already right
// are only read: in a cluster every update is a proposal to the meta
// leader, and every service calls Ensure at start.
func Ensure(ctx context.Context, js jetstream.JetStream, c Config) error {
	n, err := ensurePartitions(ctx, js, c)
	if err != nil {
		return err
	}
	c.Partitions = n
	for _, sc := range Streams(c) {
		s, err := js.Stream(ctx, sc.Name)
		if err == nil {
			// Never lower replicas: one service started without
			// JETFLOW_REPLICAS must not scale a cluster's streams down.
			// Nor turn off message schedules or rollups a stream has.
			have := s.CachedInfo().Config
			sc.Replicas = max(sc.Replicas, have.Replicas)
			sc.AllowMsgSchedules = sc.AllowMsgSchedules || have.AllowMsgSchedules
			sc.AllowRollup = sc.AllowRollup || have.AllowRollup
			sc.AllowMsgTTL = sc.AllowMsgTTL || have.AllowMsgTTL // cannot be turned off
			if !streamDiffers(s.CachedInfo().Config, sc) {
				continue
			}
		}
		if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("ensure stream %s: %w", sc.Name, err)
		}
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("ensure stream %s: %w%s", sc.Name, err, replicasHint(err, sc.Replicas))
		}
	}
	for _, kc := range Buckets(c) {
		kv, err := js.KeyValue(ctx, kc.Bucket)
		if err == nil {
			if st, err := kv.Status(ctx); err == nil {
				kc.Replicas = max(kc.Replicas, st.Config().Replicas)
				// Nor lower a marker TTL, or turn one off: a later
				// release may have set it (docs/adr/0022), and
				// JetStream cannot turn a bucket's per-message TTLs off.
				kc.LimitMarkerTTL = max(kc.LimitMarkerTTL, st.Config().LimitMarkerTTL)
				if !bucketDiffers(st, kc) {
					continue
				}
			}
		} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("ensure bucket %s: %w", kc.Bucket, err)
		}
		if _, err := js.CreateOrUpdateKeyValue(ctx, kc); err != nil {
			return fmt.Errorf("ensure bucket %s: %w%s", kc.Bucket, err, replicasHint(err, kc.Replicas))
		}
	}
	return nil
}

// errCodeReplicasNotSupported is JetStream's "replicas > 1 not supported
// in non-clustered mode".
const errCodeReplicasNotSupported = 10074

// replicasHint says what to do about a stream or bucket of replicas
// refused by a server in no cluster ("" for any other error).
func replicasHint(err error, replicas int) string {
	if apiErrorCode(err) != errCodeReplicasNotSupported {
		return ""
	}
	return fmt.Sprintf(" (this NATS server is not in a cluster, so it keeps one replica of each stream: asked for %d, give replicas 1, "+
		"or run a cluster of as many servers)", replicas)
}

// ensurePartitions creates the dispatchers bucket if it is missing and
// returns the deployment's number of partitions, recording c's (or the
// default) the first time.
func ensurePartitions(ctx context.Context, js jetstream.JetStream, c Config) (int, error) {
	var kc jetstream.KeyValueConfig
	for _, b := range Buckets(c) {
		if b.Bucket == BucketDispatchers {
			kc = b
		}
	}
	kv, err := js.KeyValue(ctx, kc.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateOrUpdateKeyValue(ctx, kc)
	}
	if err != nil {
		return 0, fmt.Errorf("ensure bucket %s: %w", kc.Bucket, err)
	}
	if c.Partitions == 0 { // the recorded number, or the default for a new deployment
		if n, err := partition.Count(ctx, kv); err == nil {
			return n, nil
		}
	}
	n := cmp.Or(c.Partitions, partition.DefaultCount)
	if err := partition.SetCount(ctx, kv, n); err != nil { // refuses another number than the recorded one
		return 0, err
	}
	return n, nil
}

// Partitions reads the deployment's number of partitions.
func Partitions(ctx context.Context, js jetstream.JetStream) (int, error) {
	kv, err := js.KeyValue(ctx, BucketDispatchers)
	if err != nil {
		return 0, fmt.Errorf("open bucket %s (run jetflow bootstrap; jetflow dev does): %w", BucketDispatchers, err)
	}
	return partition.Count(ctx, kv)
}

// ErrNoAtomicBatches: group commit was asked for on a stream that does
// not allow atomic batches: it was made by an earlier release, and
// jetflow bootstrap of this one has not run (docs/adr/0020).
var ErrNoAtomicBatches = errors.New("does not allow atomic batches, which group commit needs: " +
	"run jetflow bootstrap of this release first (docs/upgrades.md)")

// AllowsAtomicBatches returns nil if the stream of cfg allows atomic
// batches, or ErrNoAtomicBatches naming it.
func AllowsAtomicBatches(cfg jetstream.StreamConfig) error {
	if cfg.AllowAtomicPublish {
		return nil
	}
	return fmt.Errorf("stream %s %w", cfg.Name, ErrNoAtomicBatches)
}

// streamDiffers compares the settings jetflow chooses.
func streamDiffers(have, want jetstream.StreamConfig) bool {
	return !slices.Equal(have.Subjects, want.Subjects) || have.Retention != want.Retention ||
		have.Storage != want.Storage || have.Replicas != want.Replicas || have.MaxAge != want.MaxAge ||
		(want.Duplicates != 0 && have.Duplicates != want.Duplicates) || have.Discard != want.Discard || have.DenyDelete != want.DenyDelete ||
		have.Description != want.Description || have.AllowMsgSchedules != want.AllowMsgSchedules || have.AllowDirect != want.AllowDirect ||
		have.AllowMsgTTL != want.AllowMsgTTL || have.AllowAtomicPublish != want.AllowAtomicPublish ||
		!sameTransform(have.SubjectTransform, want.SubjectTransform)
}

func sameTransform(a, b *jetstream.SubjectTransformConfig) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// bucketDiffers compares the settings jetflow chooses.
func bucketDiffers(have jetstream.KeyValueStatus, want jetstream.KeyValueConfig) bool {
	cfg := have.Config()
	return have.History() != max(int64(want.History), 1) || cfg.Replicas != want.Replicas || cfg.Description != want.Description ||
		cfg.LimitMarkerTTL != want.LimitMarkerTTL
}

// IsConflict reports whether err is a wrong-last-sequence error, on a
// single server (10071) or a replicated stream (10164).
func IsConflict(err error) bool {
	if errors.Is(err, ErrConflict) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}

// KeyChanged reports whether a compare-and-set on a key-value key was
// refused because another writer created or changed the key first:
// jetstream.ErrKeyExists, ErrKeyRevisionMismatch, or the refusal nats.go
// returns as it is ([IsConflict]'s codes) when Create tries again from the
// revision of a deleted or expired key and a replicated bucket answers
// 10164 (a quarter of the losers of such a race on a 3-node cluster).
func KeyChanged(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || IsConflict(err)
}

// SyncQueueLen is the buffer of a connection's synchronous
// subscriptions (nats.SyncQueueLen). jetflow's only ones are the history
// reads' batched direct gets (jetstreamext.GetBatch subscribes for each
// request), which take at most a batch of 1,000 messages (history's
// readBatch) and its end: nats.go's default, 65,536 entries, allocated
// and cleared 512 KiB for each read.
const SyncQueueLen = 4096

// Connect dials a NATS server with jetflow's reconnect settings.
func Connect(url, name string, opts ...nats.Option) (*nats.Conn, error) {
	base := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true), nats.SyncQueueLen(SyncQueueLen)}
	nc, err := nats.Connect(url, append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats at %s: %w", url, err)
	}
	return nc, nil
}

// Beside opens a second connection with nc's options (its servers, its
// identity), named as nc is with "-"+suffix, and a JetStream context on
// it: for a long bulk read that must not queue in front of what nc
// carries (a dispatcher's appends are acknowledged on it). The handlers
// of nc's life (connected, disconnected, reconnected, closed: a drain's
// among them, svc.Drain) are nc's, not copied; its handler of
// asynchronous errors is. nc's options are read as they are: Beside is
// not to be called while nc's handlers are being changed (a drain). It
// gives up when ctx ends, and the caller closes what it returns.
func Beside(ctx context.Context, nc *nats.Conn, suffix string) (*nats.Conn, jetstream.JetStream, error) {
	if nc.IsClosed() {
		return nil, nil, fmt.Errorf("connect beside %s: %w", nc.Opts.Name, nats.ErrConnectionClosed)
	}
	if err := ctx.Err(); err != nil { // no dial that would only be closed
		return nil, nil, fmt.Errorf("connect beside %s: %w", nc.Opts.Name, err)
	}
	o := nc.Opts
	o.Name = cmp.Or(o.Name, "jetflow") + "-" + suffix
	o.RetryOnFailedConnect = false // a read that cannot begin fails now
	o.ClosedCB, o.DisconnectedCB, o.DisconnectedErrCB, o.ConnectedCB, o.ReconnectedCB = nil, nil, nil, nil, nil
	o.DiscoveredServersCB, o.LameDuckModeHandler, o.ReconnectErrCB = nil, nil, nil
	type dialed struct {
		c   *nats.Conn
		err error
	}
	done := make(chan dialed, 1)
	go func() {
		c, err := o.Connect()
		done <- dialed{c, err}
	}()
	var d dialed
	select {
	case d = <-done:
	case <-ctx.Done():
		go func() { // a connection made after all is closed
			if d := <-done; d.c != nil {
				d.c.Close()
			}
		}()
		return nil, nil, fmt.Errorf("connect %s: %w", o.Name, ctx.Err())
	}
	if d.err != nil {
		return nil, nil, fmt.Errorf("connect %s: %w", o.Name, d.err)
	}
	js, err := jetstream.New(d.c)
	if err != nil {
		d.c.Close()
		return nil, nil, fmt.Errorf("jetstream on %s: %w", o.Name, err)
	}
	return d.c, js, nil
}

// Conn is a NATS connection with its JetStream context.
type Conn struct {
	NC *nats.Conn
	JS jetstream.JetStream
}

// Dial is Open with the default Config, returning a Conn.
func Dial(ctx context.Context, url, name string, opts ...nats.Option) (*Conn, error) {
	nc, js, err := Open(ctx, url, name, Config{}, opts...)
	if err != nil {
		return nil, err
	}
	return &Conn{NC: nc, JS: js}, nil
}

// Open connects to NATS, binds JetStream and ensures the topology.
func Open(ctx context.Context, url, name string, c Config, opts ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	// Why the server cannot be reached (connection refused, no route):
	// the client keeps it from its attempts, not as its LastError.
	var dialErr atomic.Pointer[error]
	opts = append([]nats.Option{nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
		if err != nil {
			dialErr.Store(&err)
		}
	})}, opts...)
	nc, err := Connect(url, name, opts...)
	if err != nil {
		return nil, nil, err
	}
	// An asynchronous publish (history.Store.AppendBatch) whose ack never
	// comes (a stream electing its leader) fails after this instead of
	// staying pending until the connection is replaced: enough such
	// publishes would stall every later one.
	jsOpts := []jetstream.JetStreamOpt{jetstream.WithPublishAsyncTimeout(2 * PublishAttempt)}
	if c.RequestTimeout > 0 {
		jsOpts = append(jsOpts, jetstream.WithDefaultTimeout(c.RequestTimeout))
	}
	js, err := jetstream.New(nc, jsOpts...)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	// Wait for the (possibly still starting) server instead of failing,
	// saying why it waits: the server does not answer, or refused us.
	var said string
	var saidAt, placingSince time.Time
	for {
		switch {
		case nc.IsClosed():
			// The client gave up: the server refused the credentials (or
			// their absence) twice. Waiting will not help.
			err := fmt.Errorf("the connection to nats at %s was closed", url)
			if last := nc.LastError(); last != nil {
				err = fmt.Errorf("the connection to nats at %s was closed: %w (check -creds and -nats)", url, last)
			}
			return nil, nil, err
		case !nc.IsConnected():
			err = fmt.Errorf("not connected to nats at %s yet", url)
			if last := nc.LastError(); last != nil {
				err = fmt.Errorf("not connected to nats at %s yet: %w", url, last)
			} else if last := dialErr.Load(); last != nil {
				err = fmt.Errorf("not connected to nats at %s yet: %w", url, *last)
			}
		case c.Restricted:
			err = nil
		default:
			err = Ensure(ctx, js, c)
		}
		if err == nil {
			return nc, js, nil
		}
		var apiErr *jetstream.APIError
		switch {
		case !Placing(err):
			placingSince = time.Time{}
		case placingSince.IsZero():
			placingSince = time.Now()
		case time.Since(placingSince) >= LayoutPatience:
			nc.Close()
			return nil, nil, placementHint(err, LayoutPatience)
		}
		// The server answered: waiting will not help, unless a cluster
		// that has just formed could not yet place a replicated stream
		// (for LayoutPatience, as Bootstrap waits).
		if errors.As(err, &apiErr) && !Placing(err) {
			nc.Close()
			return nil, nil, err
		}
		// Said at once, then when the reason changes or every 5 s, not
		// at every half-second try.
		if c.OnRetry != nil && ctx.Err() == nil && (err.Error() != said || time.Since(saidAt) >= 5*time.Second) {
			c.OnRetry(err)
			said, saidAt = err.Error(), time.Now()
		}
		select {
		case <-ctx.Done():
			nc.Close()
			return nil, nil, err
		case <-time.After(500 * time.Millisecond):
		}
	}
}
