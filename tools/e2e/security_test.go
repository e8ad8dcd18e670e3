package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/catalog"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/client"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/partition"
	"jetflow.dev/pkg/projections"
	"jetflow.dev/pkg/workflow"
	"jetflow.dev/tools/internal/devstack"
)

// identity is a NATS connection of one role that reports the permission
// violations the server sends it.
type identity struct {
	nc         *nats.Conn
	js         jetstream.JetStream
	violations chan error
}

func (s *stack) as(t *testing.T, role auth.Role) *identity {
	t.Helper()
	id := &identity{violations: make(chan error, 64)}
	opts, err := auth.ConnectOptions(s.info.Creds(role))
	require.NoError(t, err)
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			id.violations <- err
		}
	}))
	id.nc, err = nats.Connect(s.info.NATSURL, opts...)
	require.NoError(t, err)
	t.Cleanup(id.nc.Close)
	id.js, err = jetstream.New(id.nc)
	require.NoError(t, err)
	return id
}

// denied publishes msg (a plain publish, or a JetStream API request) and
// requires the server to refuse it with a permission violation naming
// its subject.
func (id *identity) denied(t *testing.T, msg *nats.Msg) {
	t.Helper()
	if msg.Reply == "" {
		msg.Reply = id.nc.NewRespInbox()
	}
	require.NoError(t, id.nc.PublishMsg(msg))
	require.NoError(t, id.nc.Flush())
	id.refused(t, msg.Subject)
}

// refused requires the next permission violation the server tells this
// identity of to contain what.
func (id *identity) refused(t *testing.T, what string) {
	t.Helper()
	select {
	case err := <-id.violations:
		require.Contains(t, err.Error(), what)
	case <-time.After(10 * time.Second):
		t.Fatalf("no permission violation naming %s came", what)
	}
}

// streamState is what an attempt to break in must leave as it was.
func (s *stack) streamState(t *testing.T, name string) jetstream.StreamState {
	t.Helper()
	st, err := s.js.Stream(context.Background(), name)
	require.NoError(t, err)
	info, err := st.Info(context.Background())
	require.NoError(t, err)
	return info.State
}

// TestNATSIdentitiesAreLeastPrivilege tries to break in with each
// identity jetflow dev makes, as an outsider with stolen credentials
// would: every attempt is refused by the server and changes nothing,
// while what the role is for still works.
func TestNATSIdentitiesAreLeastPrivilege(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s.apply(t, gated)
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "gated", ID: "victim"})
	require.NoError(t, err)
	x := s.waitStepStatus(t, "victim", "gate", projections.OpWaiting)
	subject := bus.ExecutionSubject("gated", "victim")

	// Nobody without credentials gets in.
	_, err = nats.Connect(s.info.NATSURL)
	require.Error(t, err)
	require.Contains(t, strings.ToLower(err.Error()), "authorization violation")

	forged := func(subject string, p events.Payload) *nats.Msg {
		msg, err := bus.Encode(subject, events.New("mallory", "victim", "gated", time.Now(), p))
		require.NoError(t, err)
		return msg
	}
	historyBefore := s.streamState(t, bus.StreamEvents)

	t.Run("ClientCannotWriteHistoryResultsOrTopology", func(t *testing.T) {
		c := s.as(t, auth.RoleClient)
		c.denied(t, forged(subject, &events.ExecutionSucceeded{}))
		c.denied(t, forged(bus.ResultSubject("default", "victim"), &events.OperationSucceeded{TaskRef: events.TaskRef{
			TaskID: "victim.before.1", ExecutionID: "victim", Workflow: "gated", StepID: "before", Attempt: 1, Token: x.Token, Queue: "default"}}))
		c.denied(t, &nats.Msg{Subject: "$JS.API.STREAM.PURGE." + bus.StreamEvents, Data: []byte(`{"filter":"` + subject + `"}`)})
		c.denied(t, &nats.Msg{Subject: "$JS.API.STREAM.DELETE." + bus.StreamRejections})
		c.denied(t, &nats.Msg{Subject: "$JS.API.STREAM.PURGE.KV_" + bus.BucketLocks})
		c.denied(t, &nats.Msg{Subject: "$KV." + bus.BucketLocks + ".some-lock", Header: nats.Header{"KV-Operation": {"PURGE"}}})
		c.denied(t, &nats.Msg{Subject: claim.Subject("victim"), Header: nats.Header{"KV-Operation": {"DEL"}}})
		c.denied(t, &nats.Msg{Subject: "$JS.API.CONSUMER.DELETE." + bus.StreamCommands + "." + bus.ConsumerDispatcherCommands})
		c.denied(t, &nats.Msg{Subject: "$JS.API.CONSUMER.MSG.NEXT." + bus.StreamEvents + "." + bus.ConsumerProjector, Data: []byte(`{"batch":1}`)})
		c.denied(t, &nats.Msg{Subject: "$JS.API.CONSUMER.DURABLE.CREATE." + bus.StreamEvents + ".spy"})
		c.denied(t, &nats.Msg{Subject: bus.TaskSubject("default")})
		// Reports handed straight to a dispatcher are the agents', and so
		// are their tasks' acknowledgements.
		c.denied(t, forged(bus.DirectResultSubject("default", partition.Of("victim", partition.DefaultCount), "victim"), &events.OperationSucceeded{}))
		c.denied(t, &nats.Msg{Subject: "$JS.ACK." + bus.StreamTasks + ".agent-default.1.1.1.1700000000000000000.0"})
		c.denied(t, &nats.Msg{Subject: bus.CommandsPrefix + ".expire"})
		c.denied(t, &nats.Msg{Subject: bus.SubjectAPIAction}) // commands that carry an actor are the api's
		// The inbox holds commands the dispatchers checked; a partition's
		// consumers and their lease are the dispatchers'.
		c.denied(t, forged(bus.InboxSubject(partition.Of("victim", partition.DefaultCount), "victim"),
			&events.ExecutionAction{ExecutionID: "victim", Action: events.ActionForceCancel}))
		c.denied(t, &nats.Msg{Subject: "$JS.API.CONSUMER.RESET." + bus.StreamResults + "." + bus.PartitionResultsConsumer(0)})
		c.denied(t, &nats.Msg{Subject: "$JS.API.CONSUMER.MSG.NEXT." + bus.StreamInbox + "." + bus.PartitionInboxConsumer(0), Data: []byte(`{"batch":1}`)})
		c.denied(t, &nats.Msg{Subject: "$KV." + bus.BucketDispatchers + "." + partition.LeaseKey(0), Header: nats.Header{"KV-Operation": {"PURGE"}}})

		// What a client is for still works: it reads the history...
		evs, err := func() ([]events.Event, error) {
			cons, err := c.js.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subject}})
			if err != nil {
				return nil, err
			}
			var out []events.Event
			for range x.Events {
				m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
				if err != nil {
					return nil, err
				}
				ev, err := bus.Decode(m.Headers(), m.Data())
				if err != nil {
					return nil, err
				}
				out = append(out, ev)
			}
			return out, nil
		}()
		require.NoError(t, err)
		require.Equal(t, events.TypeExecutionStarted, evs[0].Type)
		// ...and sends commands: this signal lets the execution finish.
		sig, err := bus.Encode(bus.SubjectSignal, events.New("tour/nats", "victim", "gated", time.Now(),
			&events.SignalExecution{ExecutionID: "victim", Name: "go"}))
		require.NoError(t, err)
		_, err = c.js.PublishMsg(ctx, sig)
		require.NoError(t, err)
	})

	t.Run("AgentCannotWriteHistoryNorReportForAnotherQueue", func(t *testing.T) {
		a := s.as(t, auth.RoleAgent)
		a.denied(t, forged(subject, &events.StepSucceeded{StepID: "gate", Attempt: 1}))
		a.denied(t, forged(bus.ResultSubject("gpu", "victim"), &events.OperationSucceeded{}))
		a.denied(t, forged(bus.DirectResultSubject("gpu", partition.Of("victim", partition.DefaultCount), "victim"), &events.OperationSucceeded{}))
		// A report handed straight to a dispatcher names its reply subject,
		// as any request does: the dispatcher answers on the agents'
		// answer subjects only, so no reply subject makes it publish on a
		// history or the JetStream API (checked at the end: nothing purged,
		// nothing forged in the history). A reply on a JetStream subject
		// ($JS.>) is refused by the server itself (since nats-server
		// 2.15.3: a reply must not make another client issue a JetStream
		// request).
		for _, reply := range []string{"$JS.API.STREAM.PURGE." + bus.StreamEvents, subject, "$KV." + bus.BucketLocks + ".some-lock"} {
			msg := forged(bus.DirectResultSubject("default", partition.Of("victim", partition.DefaultCount), "victim"),
				&events.OperationSucceeded{TaskRef: events.TaskRef{TaskID: "victim.before.1", ExecutionID: "victim", Workflow: "gated",
					StepID: "before", Attempt: 1, Token: "stale", Queue: "default"}})
			msg.Reply = reply
			require.NoError(t, a.nc.PublishMsg(msg))
			require.NoError(t, a.nc.Flush())
			if strings.HasPrefix(reply, "$JS.API.") {
				a.refused(t, `Publish with Reply of "`+reply+`"`)
			}
		}
		a.denied(t, &nats.Msg{Subject: "$KV." + bus.BucketLocks + ".some-lock"})
		a.denied(t, &nats.Msg{Subject: "$JS.API.CONSUMER.MSG.NEXT." + bus.StreamCommands + "." + bus.ConsumerDispatcherCommands, Data: []byte(`{"batch":1}`)})
		a.denied(t, &nats.Msg{Subject: "$JS.API.STREAM.PURGE." + bus.StreamTasks})
		a.denied(t, &nats.Msg{Subject: bus.InboxSubject(0, "victim")})
		a.denied(t, &nats.Msg{Subject: "$JS.API.CONSUMER.RESET." + bus.StreamTimers + "." + bus.PartitionTimersConsumer(0)})
		// The dispatchers' partition consumers on the reports stream: an
		// agent may neither pull from, re-point nor delete them (it reads
		// reports one get at a time).
		part := bus.PartitionResultsConsumer(0)
		a.denied(t, &nats.Msg{Subject: "$JS.API.CONSUMER.MSG.NEXT." + bus.StreamResults + "." + part, Data: []byte(`{"batch":1}`)})
		a.denied(t, &nats.Msg{Subject: "$JS.API.CONSUMER.DELETE." + bus.StreamResults + "." + part})
		a.denied(t, &nats.Msg{Subject: "$JS.API.CONSUMER.CREATE." + bus.StreamResults + "." + part + ".jf.results.default.*.*",
			Data: []byte(`{"stream_name":"JF_RESULTS","config":{"durable_name":"` + part + `","filter_subject":"jf.results.default.*.*","ack_policy":"explicit"}}`)})
	})

	t.Run("OnlyTheDispatcherSetsTimers", func(t *testing.T) {
		// No other role arms a timer (a schedule), fires one, forges a
		// long timer's notice, or takes a partition's timers or notices.
		p := partition.Of("victim", partition.DefaultCount)
		for _, role := range []auth.Role{auth.RoleClient, auth.RoleAPI, auth.RoleJanitor, auth.RoleAgent} {
			id := s.as(t, role)
			id.denied(t, forged(bus.ScheduleSubject("forged"), &events.FireTimer{ExecutionID: "victim", Workflow: "gated", TimerID: "forged"}))
			id.denied(t, forged(bus.PartitionTimerSubject(p, "victim"), &events.FireTimer{ExecutionID: "victim", Workflow: "gated", TimerID: "forged"}))
			id.denied(t, forged(bus.PartitionNoticeSubject(p, "victim"),
				&events.TimerNotice{ExecutionID: "victim", Workflow: "gated", TimerID: "forged", Due: time.Now()}))
			id.denied(t, &nats.Msg{Subject: "$JS.API.CONSUMER.MSG.NEXT." + bus.StreamTimers + "." + bus.PartitionTimersConsumer(p), Data: []byte(`{"batch":1}`)})
			id.denied(t, &nats.Msg{Subject: "$JS.API.CONSUMER.MSG.NEXT." + bus.StreamTimers + "." + bus.PartitionNoticesConsumer(p), Data: []byte(`{"batch":1}`)})
		}
	})

	t.Run("APIAndJanitorCannotWriteHistory", func(t *testing.T) {
		for _, role := range []auth.Role{auth.RoleAPI, auth.RoleJanitor} {
			id := s.as(t, role)
			id.denied(t, forged(subject, &events.ExecutionFailed{Error: "forged"}))
			id.denied(t, &nats.Msg{Subject: "$JS.API.STREAM.DELETE." + bus.StreamEvents})
			id.denied(t, &nats.Msg{Subject: "$KV." + bus.BucketLocks + ".some-lock"})
		}
	})

	// The execution ended by its real steps; nothing forged is in its
	// history, and no stream lost anything.
	x = s.waitDone(t, "victim", 30*time.Second)
	require.Equal(t, projections.StatusSucceeded, x.Status)
	evs := s.history(t, "victim")
	requireLinear(t, evs)
	for _, ev := range evs {
		require.Equal(t, "jetflow/dispatcher", ev.Source, "%s", ev.Type)
	}
	after := s.streamState(t, bus.StreamEvents)
	require.GreaterOrEqual(t, after.Msgs, historyBefore.Msgs)
	require.Equal(t, historyBefore.FirstSeq, after.FirstSeq, "nothing was purged")
}

// TestForeignQueueReportIsIgnored: even with the execution's token (which
// every task of it carries), a report published on another queue's
// results subject never counts for a step of this queue.
func TestForeignQueueReportIsIgnored(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	ctx := context.Background()
	s.apply(t, gated)
	_, err := s.c.Start(ctx, client.StartRequest{Workflow: "gated", ID: "foreign"})
	require.NoError(t, err)
	s.waitStepStatus(t, "foreign", "gate", projections.OpWaiting)
	var token string
	for _, ev := range s.history(t, "foreign") {
		if p, ok := ev.Data.(*events.ExecutionStarted); ok {
			token = p.Token
		}
	}
	// The admin identity may publish anywhere: it stands for an agent of
	// queue gpu whose permissions let it report on jf.results.gpu.>.
	ref := events.TaskRef{TaskID: events.TaskID("foreign", "before", 1), ExecutionID: "foreign", Workflow: "gated",
		StepID: "before", Attempt: 1, Token: token, Queue: "gpu", Agent: "rogue"}
	msg, err := bus.Encode(bus.ResultSubject("gpu", "foreign"), events.New("rogue", "foreign", "gated", time.Now(),
		&events.OperationFailed{TaskRef: ref, Error: "forged"}))
	require.NoError(t, err)
	_, err = s.js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		for _, ev := range s.history(t, "foreign") {
			if p, ok := ev.Data.(*events.ResultIgnored); ok {
				return strings.Contains(p.Reason, `queue "gpu"`)
			}
		}
		return false
	}, 20*time.Second, 20*time.Millisecond, "the foreign report was not recorded as ignored")
	x, err := s.c.Execution(ctx, "foreign")
	require.NoError(t, err)
	require.Equal(t, projections.OpSucceeded, stepByID(t, x, "before").Status)
}

// TestRevokedCredentialsAreRefused: a leaked creds file is revoked in its
// account; once the server loads the accounts again (a restart of
// jetflow dev), it refuses those credentials, and the new ones work.
func TestRevokedCredentialsAreRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	run := func() *stack { return startStack(t, func(c *devstack.Config) { c.DataDir = dir }) }
	s := run()
	leaked := filepath.Join(t.TempDir(), "leaked.creds")
	b, err := os.ReadFile(s.info.Creds(auth.RoleClient))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(leaked, b, 0o600))
	opts, err := auth.ConnectOptions(leaked)
	require.NoError(t, err)
	nc, err := nats.Connect(s.info.NATSURL, opts...)
	require.NoError(t, err, "the creds work before they are revoked")
	nc.Close()

	_, err = auth.Revoke(filepath.Join(dir, devstack.AuthDir), auth.DefaultNamespace, leaked)
	require.NoError(t, err)
	s.stop()
	s = run()
	_, err = nats.Connect(s.info.NATSURL, opts...)
	require.Error(t, err, "revoked credentials were accepted")
	id := s.as(t, auth.RoleClient) // the client identity issued at this start
	require.True(t, id.nc.IsConnected())
}

// TestNamespacesAreIsolated: each namespace is a NATS account with its
// own topology and services. An execution in one is invisible from the
// other, over core subscriptions and streams alike, and ids, workflows and
// histories are each namespace's own.
func TestNamespacesAreIsolated(t *testing.T) {
	t.Parallel()
	s := startStack(t, func(c *devstack.Config) { c.Namespaces = []string{auth.DefaultNamespace, "team-b"} })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	b, err := s.info.ConnectIn("team-b", auth.RoleClient, "team-b-client")
	require.NoError(t, err)
	defer b.Close()
	seen := make(chan *nats.Msg, 256)
	sub, err := b.ChanSubscribe("jf.events.>", seen)
	require.NoError(t, err)
	defer sub.Unsubscribe()
	require.NoError(t, b.Flush())

	// An execution of the default namespace: team-b hears nothing of it.
	s.apply(t, "name: hello\nsteps:\n  - id: a\n    kind: noop\n")
	x := s.runToEnd(t, client.StartRequest{Workflow: "hello", ID: "same-id"})
	require.Equal(t, projections.StatusSucceeded, x.Status)

	// team-b registers its own workflow and starts an execution with the
	// same id, over NATS: its own dispatcher and agent run it.
	admB, err := s.info.ConnectIn("team-b", auth.RoleAdmin, "team-b-admin")
	require.NoError(t, err)
	defer admB.Close()
	jsB, err := jetstream.New(admB)
	require.NoError(t, err)
	defs, err := catalog.Open(ctx, jsB)
	require.NoError(t, err)
	def, err := workflow.Parse([]byte("name: hello\nsteps:\n  - id: only-in-b\n    kind: noop\n"))
	require.NoError(t, err)
	_, _, err = defs.Apply(ctx, def)
	require.NoError(t, err)
	bjs, err := jetstream.New(b)
	require.NoError(t, err)
	start, err := bus.Encode(bus.SubjectStart, events.New("team-b/app", "", "", time.Now(),
		&events.StartExecution{Workflow: "hello", ExecutionID: "same-id"}))
	require.NoError(t, err)
	_, err = bjs.PublishMsg(ctx, start)
	require.NoError(t, err)

	var types []events.Type
	stepEvents := 0
	for done := false; !done; {
		select {
		case m := <-seen:
			ev, err := bus.Decode(m.Header, m.Data)
			require.NoError(t, err)
			types = append(types, ev.Type)
			if id, ok := stepIDOf(t, ev); ok {
				stepEvents++
				require.Equal(t, "only-in-b", id, "team-b saw another namespace's step")
			}
			done = ev.Type == events.TypeExecutionSucceeded
		case <-ctx.Done():
			t.Fatalf("team-b's execution did not finish; saw %v", types)
		}
	}
	require.Equal(t, events.TypeExecutionStarted, types[0], "the first event team-b heard is its own start: %v", types)
	require.Positive(t, stepEvents, "team-b heard its own step's events: %v", types)

	// Over HTTP, the api serves both: the namespace header picks which.
	cb := client.New(s.info.APIURL, client.WithToken(s.info.AdminToken), client.WithNamespace("team-b"))
	var xb projections.Execution
	require.Eventually(t, func() bool {
		var err error
		xb, err = cb.Execution(ctx, "same-id")
		return err == nil && xb.Status == projections.StatusSucceeded
	}, 20*time.Second, 20*time.Millisecond, "team-b's execution over HTTP")
	require.Equal(t, "only-in-b", stepByID(t, xb, "only-in-b").ID)
	xd, err := s.c.Execution(ctx, "same-id")
	require.NoError(t, err)
	require.Equal(t, "a", stepByID(t, xd, "a").ID)
	_, err = client.New(s.info.APIURL, client.WithToken(s.info.AdminToken), client.WithNamespace("team-c")).Execution(ctx, "same-id")
	require.True(t, client.IsStatus(err, http.StatusNotFound), "a namespace the api does not serve: %v", err)

	// The default namespace's history of same-id is its own, untouched.
	evs := s.history(t, "same-id")
	stepEvents = 0
	for _, ev := range evs {
		if id, ok := stepIDOf(t, ev); ok {
			stepEvents++
			require.Equal(t, "a", id)
		}
	}
	require.Positive(t, stepEvents, "the default namespace's step events are in its history")
	require.Equal(t, x.LastSeq, evs[len(evs)-1].Seq)
}

// TestWatchesOutliveFlowControl: the services watch buckets (the
// dispatchers their membership and the locks, the janitor and the api the
// read models) with ordered consumers, which answer the server's flow
// control on $JS.FC. Without the right to publish there, a watch stalls
// for good once a few megabytes went by, without an error the service
// sees: the dispatchers then stop noticing that one of them died (found by
// trying failover on a dev stack that had run for minutes). Each identity
// watches a key of a bucket it reads while the admin writes eight
// megabytes to it: every update must arrive.
func TestWatchesOutliveFlowControl(t *testing.T) {
	t.Parallel()
	s := startStack(t, nil)
	admin := s.as(t, auth.RoleAdmin)
	value := []byte(strings.Repeat("x", 2048))
	const updates = 4000
	for _, c := range []struct {
		role   auth.Role
		bucket string
		key    string
	}{
		{auth.RoleDispatcher, bus.BucketDispatchers, "flood-d"},
		{auth.RoleJanitor, bus.BucketExecutions, "flood-j"},
		{auth.RoleAPI, bus.BucketExecutions, "flood-a"},
	} {
		t.Run(string(c.role), func(t *testing.T) {
			id := s.as(t, c.role)
			kv, err := id.js.KeyValue(t.Context(), c.bucket)
			require.NoError(t, err)
			// Each update on its own key: a bucket keeps one value per key,
			// and a watch may pass over a value already replaced.
			w, err := kv.Watch(t.Context(), c.key+".*", jetstream.UpdatesOnly())
			require.NoError(t, err)
			defer func() { _ = w.Stop() }()
			got := 0
			done := make(chan struct{})
			go func() {
				defer close(done)
				for e := range w.Updates() {
					if e != nil {
						if got++; got == updates {
							return
						}
					}
				}
			}()
			// Published in a pipeline, as a busy bucket gets them: one put
			// after another took 12,000 round trips, minutes on a loaded
			// machine.
			puts := make([]jetstream.PubAckFuture, 0, updates)
			for i := range updates {
				f, err := admin.js.PublishAsync("$KV."+c.bucket+"."+c.key+"."+strconv.Itoa(i), value)
				require.NoError(t, err)
				puts = append(puts, f)
			}
			for i, f := range puts {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					t.Fatalf("put %d: %v", i, err)
				case <-time.After(2 * time.Minute):
					t.Fatalf("put %d not acknowledged", i)
				}
			}
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				select {
				case err := <-id.violations:
					t.Logf("violation: %v", err)
				default:
				}
				t.Fatalf("the %s watch stalled after %d of %d updates", c.role, got, updates)
			}
			select {
			case err := <-id.violations:
				t.Fatalf("permission violation while watching: %v", err)
			default:
			}
			stream, err := admin.js.Stream(t.Context(), "KV_"+c.bucket)
			require.NoError(t, err)
			require.NoError(t, stream.Purge(t.Context(), jetstream.WithPurgeSubject("$KV."+c.bucket+"."+c.key+".>")))
		})
	}
}

// stepIDOf returns the step an event of a step (io.jetflow.step.*, of any
// shape: scheduled, dispatched, sent, succeeded...) is about.
func stepIDOf(t *testing.T, ev events.Event) (string, bool) {
	t.Helper()
	if ev.Type == events.TypeExecutionSucceeded { // it may carry the last step's success (docs/adr/0015)
		var end struct {
			Step *struct {
				StepID string `json:"step_id"`
			} `json:"step"`
		}
		require.NoError(t, json.Unmarshal(ev.Raw, &end), "%s", ev.Type)
		if end.Step == nil {
			return "", false
		}
		return end.Step.StepID, true
	}
	if !strings.HasPrefix(string(ev.Type), "io.jetflow.step.") {
		return "", false
	}
	var d struct {
		StepID string `json:"step_id"`
	}
	require.NoError(t, json.Unmarshal(ev.Raw, &d), "%s", ev.Type)
	require.NotEmpty(t, d.StepID, "%s names its step", ev.Type)
	return d.StepID, true
}
