package agent

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
)

// beatCounter is a task's message that counts its heartbeats (nothing
// else of it is used).
type beatCounter struct {
	jetstream.Msg
	beats atomic.Int32
}

func (m *beatCounter) InProgress() error { m.beats.Add(1); return nil }

// TestKeepAliveBeatsUntilStopped: a task kept alive beats every quarter of
// the ack wait, again and again, and not once stop has returned; a task
// settled before its first beat sends none.
func TestKeepAliveBeatsUntilStopped(t *testing.T) {
	t.Parallel()
	a := &Agent{cfg: Config{AckWait: 400 * time.Millisecond}}
	every := a.heartbeatEvery()
	require.Equal(t, 100*time.Millisecond, every)

	m := &beatCounter{}
	stop := a.keepAlive(m, zerolog.Nop())
	require.Eventually(t, func() bool { return m.beats.Load() >= 3 }, time.Minute, 10*time.Millisecond,
		"the beat is armed again after each")
	stop()
	n := m.beats.Load()
	time.Sleep(5 * every)
	require.Equal(t, n, m.beats.Load(), "no beat once stop has returned")
	stop() // a second stop does nothing

	quick := &beatCounter{}
	a.keepAlive(quick, zerolog.Nop())()
	time.Sleep(3 * every)
	require.Zero(t, quick.beats.Load(), "a task settled before its first beat sends none")
}

// TestKeepAliveStopRacingABeat: a stop that comes as a beat's timer fires
// (the beat not yet sent) ends the beats all the same. A beat every
// millisecond, stopped again and again at any moment.
func TestKeepAliveStopRacingABeat(t *testing.T) {
	t.Parallel()
	a := &Agent{cfg: Config{AckWait: 4 * time.Millisecond}} // below Config's floor: only here
	every := a.heartbeatEvery()
	require.Equal(t, time.Millisecond, every)
	for i := range 300 {
		m := &beatCounter{}
		stop := a.keepAlive(m, zerolog.Nop())
		time.Sleep(time.Duration(i%4) * every)
		stop()
		n := m.beats.Load()
		time.Sleep(5 * every)
		require.Equal(t, n, m.beats.Load(), "round %d: a beat after stop returned", i)
	}
}
