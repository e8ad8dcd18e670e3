package svcrun_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/auth"
	"jetflow.dev/pkg/natstest"
	"jetflow.dev/pkg/svc"
	"jetflow.dev/services/internal/svcrun"
)

// TestServeDrainsBeforeReturning: a message taken just before shutdown,
// whose handling is still under way when the service's function returns,
// is handled and acknowledged before Serve returns, and the connection is
// closed by then. (Serve used to start nc.Drain and return at once: the
// process could exit before the handler finished and its ack was sent.)
//
// Not parallel: Parse sets zerolog's global time format.
func TestServeDrainsBeforeReturning(t *testing.T) {
	srv := natstest.RunJetStream(t)
	_, admin := natstest.Connect(t, srv)
	stream, err := admin.CreateStream(t.Context(), jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}})
	require.NoError(t, err)
	cons, err := stream.CreateOrUpdateConsumer(t.Context(), jetstream.ConsumerConfig{Durable: "w",
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	require.NoError(t, err)

	env := map[string]string{"JETFLOW_NATS_URL": srv.ClientURL()}
	p := svcrun.New(auth.RoleAgent, func(k string) string { return env[k] }, &bytes.Buffer{})
	require.NoError(t, p.Parse(nil))
	var conn atomic.Pointer[nats.Conn]
	started, returned, finished := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var early atomic.Bool
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	served := make(chan error, 1)
	go func() {
		served <- p.Serve(ctx, func(ctx context.Context, ns svcrun.Namespace) error {
			conn.Store(ns.NC)
			c, err := ns.JS.Consumer(ctx, "WORK", "w")
			if err != nil {
				return err
			}
			// A service that returns at shutdown and leaves the message
			// under way to the connection's drain.
			_, err = c.Consume(func(m jetstream.Msg) {
				defer close(finished)
				close(started)
				select {
				case <-returned: // Serve returned while this handler still ran
					early.Store(true)
				case <-time.After(500 * time.Millisecond):
				}
				_ = m.Ack() // not waited for: the drain must send it
			}, jetstream.PullMaxMessages(1))
			if err != nil {
				return err
			}
			<-ctx.Done()
			return nil
		})
	}()
	_, err = admin.Publish(t.Context(), "work.1", []byte("job"))
	require.NoError(t, err)
	select {
	case <-started:
	case err := <-served:
		t.Fatalf("Serve returned before any message was handled: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the handler never got the message")
	}

	cancel()
	select {
	case err := <-served:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Serve did not return")
	}
	closed := conn.Load().IsClosed()
	close(returned)
	select { // at once, unless Serve returned too early
	case <-finished:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never finished")
	}
	require.False(t, early.Load(), "Serve returned while a handler still held its message")
	require.True(t, closed, "Serve returned before its connection was closed")
	natstest.Eventually(t, 10*time.Second, func() bool {
		info, err := cons.Info(t.Context())
		return err == nil && info.NumAckPending == 0 && info.AckFloor.Stream == 1
	}, "the message acknowledged")
}

// TestParse: -h is flag.ErrHelp (Main exits 0), a stray argument or a
// bad common setting is an error naming it, before any connection.
//
// Not parallel: Parse sets zerolog's global time format.
func TestParse(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		env  map[string]string
		want string
	}{
		"StrayArgument": {args: []string{"-log-level", "debug", "extra"}, want: `unexpected argument "extra": every setting is a flag`},
		"BoolWithSpace": {args: []string{"-log-json", "false"}, want: `unexpected argument "false": -log-json is a boolean flag, which takes its value after =: -log-json=false`},
		"BadLogLevel":   {env: map[string]string{"JETFLOW_LOG_LEVEL": "loud"}, want: `-log-level "loud"`},
		"Replicas":      {args: []string{"-replicas", "0"}, want: "-replicas (JETFLOW_REPLICAS) 0: out of range, use 1 to 5"},
		"UnknownFlag":   {args: []string{"-nope"}, want: "flag provided but not defined: -nope (-h lists the flags)"},
		"BadNumber":     {args: []string{"-replicas", "banana"}, want: `invalid value "banana" for flag -replicas`},
	} {
		var out bytes.Buffer
		p := svcrun.New(auth.RoleJanitor, func(k string) string { return tc.env[k] }, &out)
		require.ErrorContains(t, p.Parse(tc.args), tc.want, name)
		require.NotContains(t, out.String(), "Usage of", "%s: a bad setting is its error, not the whole usage", name)
	}
	var out bytes.Buffer
	p := svcrun.New(auth.RoleJanitor, func(string) string { return "" }, &out)
	err := p.Parse([]string{"-h"})
	require.True(t, errors.Is(err, flag.ErrHelp), "%v", err)
	require.Contains(t, out.String(), "Usage of jetflow-janitor", "usage goes to the program's stderr")
	require.Contains(t, out.String(), "(1 to 5) (env JETFLOW_REPLICAS)")

	out.Reset()
	p = svcrun.New(auth.RoleJanitor, func(string) string { return "" }, &out)
	err = p.Parse([]string{"-version"})
	require.True(t, errors.Is(err, flag.ErrHelp), "-version runs nothing (exit 0): %v", err)
	require.Equal(t, "jetflow-janitor "+svc.Version()+"\n", out.String())
}
