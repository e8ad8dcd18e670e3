package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A worker asks JetStream for one task only when it is free: a pull
// request for one message (lanes.go). nats.go's Fetch makes a
// subscription of its own for each pull (a SUB and an UNSUB to the
// server, a goroutine, a channel and timers): a tenth of a step's CPU at
// a task's pace. A worker instead keeps one subscription for as long as
// it serves, on which the answers to all its pull requests come: to
// request n, on <inbox>.<n>.
//
// A worker has one request at a time that it waits on. A request it gave
// up (its wait ended first: the agent stopping, or heartbeats missed) may
// still be answered: its status names it and is dropped; a task that
// comes for it is handed back when the worker next asks (it cannot be
// told from the task that the current request brings, and a task the
// worker did not wait for may have waited in the agent).

// pulls are one worker's pull requests, and the subscription their
// answers come on.
type pulls struct {
	nc    *nats.Conn
	api   string // the JetStream API's subject prefix, "$JS.API."
	inbox string
	sub   *nats.Subscription
	ch    chan *nats.Msg
	n     uint64 // the last request's number
}

// pullOpts is what one pull asks the server for.
type pullOpts struct {
	expires   time.Duration // how long the server holds the request (0 with noWait)
	heartbeat time.Duration // how often it says it still holds it (0: never)
	noWait    bool          // a task only if one is waiting now
}

// noWaitLimit bounds the wait for the answer to a request that asks for
// a task only if one waits: the server answers at once.
const noWaitLimit = 5 * time.Second

// pendingAnswers is room for the answers of a worker's requests: one at a
// time, but for the heartbeats and end of one it gave up.
const pendingAnswers = 64

// newPulls subscribes to the answers of a worker's pull requests.
func newPulls(nc *nats.Conn, api string) (*pulls, error) {
	p := &pulls{nc: nc, api: api, inbox: nc.NewInbox(), ch: make(chan *nats.Msg, pendingAnswers)}
	sub, err := nc.ChanSubscribe(p.inbox+".*", p.ch)
	if err != nil {
		return nil, fmt.Errorf("subscribe to the answers of pull requests: %w", err)
	}
	p.sub = sub
	return p, nil
}

// close ends the subscription and hands back the tasks that came for
// requests given up. A task the server sends afterwards waits for its
// ack wait, as one sent to a pull whose worker stopped did with nats.go's
// Fetch.
func (p *pulls) close() {
	_ = p.sub.Unsubscribe()
	p.drop()
}

// drop hands back the tasks that came for requests given up, and drops
// their statuses.
func (p *pulls) drop() {
	for {
		select {
		case m := <-p.ch:
			if !isStatus(m) {
				_ = p.task(m).Nak()
			}
		default:
			return
		}
	}
}

// isStatus reports whether m is a status of the server about a request
// rather than a task.
func isStatus(m *nats.Msg) bool { return len(m.Data) == 0 && m.Header.Get("Status") != "" }

// take asks cons for one task and waits for it: nil when none came (none
// waited, or the request expired) or ctx ended; an error when the server
// said why it cannot answer, or (with heartbeats) stopped answering.
func (p *pulls) take(ctx context.Context, cons jetstream.Consumer, o pullOpts) (jetstream.Msg, error) {
	info := cons.CachedInfo()
	if info == nil {
		return nil, errors.New("pull: the consumer was not bound")
	}
	body, err := json.Marshal(pullRequest{Batch: 1, Expires: o.expires, NoWait: o.noWait, Heartbeat: o.heartbeat})
	if err != nil {
		return nil, fmt.Errorf("pull: %w", err)
	}
	p.drop()
	p.n++
	token := strconv.FormatUint(p.n, 10)
	if err := p.nc.PublishRequest(p.api+"CONSUMER.MSG.NEXT."+info.Stream+"."+info.Name, p.inbox+"."+token, body); err != nil {
		return nil, fmt.Errorf("pull: %w", err)
	}
	limit := o.expires + time.Second // the server ends the request first
	if o.noWait {
		limit = noWaitLimit
	}
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	var beat <-chan time.Time
	heard := time.Now()
	if o.heartbeat > 0 {
		t := time.NewTicker(o.heartbeat)
		defer t.Stop()
		beat = t.C
	}
	for {
		select {
		case m := <-p.ch:
			if !isStatus(m) {
				return p.task(m), nil
			}
			if m.Subject[strings.LastIndexByte(m.Subject, '.')+1:] != token {
				continue // about a request given up
			}
			if m.Header.Get("Status") == statusHeartbeat {
				heard = time.Now()
				continue
			}
			return nil, statusErr(m)
		case <-ctx.Done():
			return nil, nil
		case <-deadline.C:
			return nil, nil
		case now := <-beat:
			// Given up within two missed heartbeats, as nats.go's Fetch
			// does: the consumer's leader moved, and the request with it.
			if now.Sub(heard) > 2*o.heartbeat {
				return nil, jetstream.ErrNoHeartbeat
			}
		}
	}
}

// task is m, a task delivered by a consumer, as jetstream's Msg.
func (p *pulls) task(m *nats.Msg) *taskMsg {
	t := &taskMsg{m: m, nc: p.nc}
	if md, err := m.Metadata(); err == nil {
		t.md = &jetstream.MsgMetadata{
			Sequence:     jetstream.SequencePair{Consumer: md.Sequence.Consumer, Stream: md.Sequence.Stream},
			NumDelivered: md.NumDelivered, NumPending: md.NumPending, Timestamp: md.Timestamp,
			Stream: md.Stream, Consumer: md.Consumer, Domain: md.Domain,
		}
	}
	return t
}

// apiPrefix is the subject prefix of the JetStream API that o reaches.
func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	}
	return jetstream.DefaultAPIPrefix
}

// The statuses a pull request's answers carry (ADR-9 of NATS).
const (
	statusHeartbeat = "100"
	statusNoTask    = "404"
	statusExpired   = "408"
	statusConflict  = "409"
	statusNoServer  = "503"
)

// statusErr is what the status that ended a request means to its
// worker: nil for no task (none waited, or the request expired).
func statusErr(m *nats.Msg) error {
	desc := m.Header.Get("Description")
	switch code := m.Header.Get("Status"); code {
	case statusNoTask, statusExpired:
		return nil
	case statusNoServer:
		return nats.ErrNoResponders
	case statusConflict:
		switch d := strings.ToLower(desc); {
		case strings.Contains(d, "consumer deleted"):
			return jetstream.ErrConsumerDeleted
		case strings.Contains(d, "leadership change"):
			return jetstream.ErrConsumerLeadershipChanged
		}
		fallthrough
	default:
		return fmt.Errorf("pull: %s %s", code, desc)
	}
}

// pullRequest is JetStream's request for a consumer's next messages.
type pullRequest struct {
	Batch     int           `json:"batch"`
	Expires   time.Duration `json:"expires,omitempty"`
	NoWait    bool          `json:"no_wait,omitempty"`
	Heartbeat time.Duration `json:"idle_heartbeat,omitempty"`
}

// taskMsg is a task delivered by a consumer, as jetstream's Msg: its
// metadata read once, when it came.
type taskMsg struct {
	m    *nats.Msg
	nc   *nats.Conn
	md   *jetstream.MsgMetadata // nil: its ack subject is not a consumer's
	done atomic.Bool            // acknowledged, handed back or ended
}

func (t *taskMsg) Metadata() (*jetstream.MsgMetadata, error) {
	if t.md == nil {
		return nil, jetstream.ErrNotJSMessage
	}
	md := *t.md
	return &md, nil
}
func (t *taskMsg) Data() []byte         { return t.m.Data }
func (t *taskMsg) Headers() nats.Header { return t.m.Header }
func (t *taskMsg) Subject() string      { return t.m.Subject }
func (t *taskMsg) Reply() string        { return t.m.Reply }

func (t *taskMsg) Ack() error                    { return t.settle("+ACK") }
func (t *taskMsg) Nak() error                    { return t.settle("-NAK") }
func (t *taskMsg) Term() error                   { return t.settle("+TERM") }
func (t *taskMsg) TermWithReason(r string) error { return t.settle("+TERM " + r) }
func (t *taskMsg) NakWithDelay(d time.Duration) error {
	return t.settle(fmt.Sprintf(`-NAK {"delay": %d}`, d.Nanoseconds()))
}

// InProgress tells the server the task is still in hand (as often as
// needed).
func (t *taskMsg) InProgress() error {
	if t.done.Load() {
		return jetstream.ErrMsgAlreadyAckd
	}
	return t.nc.Publish(t.m.Reply, []byte("+WPI"))
}

// DoubleAck acknowledges the task and waits for the server to confirm.
func (t *taskMsg) DoubleAck(ctx context.Context) error {
	if t.done.Load() {
		return jetstream.ErrMsgAlreadyAckd
	}
	if _, err := t.nc.RequestWithContext(ctx, t.m.Reply, []byte("+ACK")); err != nil {
		return err
	}
	t.done.Store(true)
	return nil
}

// settle acknowledges, hands back or ends the task, once.
func (t *taskMsg) settle(body string) error {
	if t.done.Load() {
		return jetstream.ErrMsgAlreadyAckd
	}
	if err := t.nc.Publish(t.m.Reply, []byte(body)); err != nil {
		return err
	}
	t.done.Store(true)
	return nil
}
