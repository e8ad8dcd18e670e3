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
// a task's pace. A worker instead keeps one subscription, on which the
// answers to its pull requests come (to request n, on <inbox>.<n>), for
// as long as each request ends by its answer: a task, or the server's
// status (no task waiting, the request expired, an error).
//
// A request the worker gives up before its answer (the agent stopping, a
// pull's own time limit passed, heartbeats missed, or the server's error,
// after which another server may still deliver for it) would stay with
// the server, live, while the subscription listens: a task given to it
// would come while the worker runs another, and wait in the agent, with
// no heartbeat, while another agent could run it. So giving up ends the
// subscription, as Fetch does: the server gives no task to a request
// nobody listens to, and drops it. A task that already came is handed
// back at once; one on its way waits for its ack wait, as with Fetch. The
// worker's next pull subscribes on a new inbox.

// pulls are one worker's pull requests, and the subscription their
// answers come on.
type pulls struct {
	nc    *nats.Conn
	api   string // the JetStream API's subject prefix, "$JS.API."
	inbox string
	sub   *nats.Subscription // nil after a request given up, until the next pull
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
// a task only if one waits: the server answers at once, and a flex
// worker's look at one lane must not hold up the other long.
const noWaitLimit = time.Second

// pendingAnswers is room for the answers of a worker's request: one, but
// for the heartbeats that come while the worker is between two looks at
// the channel.
const pendingAnswers = 8

// newPulls subscribes to the answers of a worker's pull requests.
func newPulls(nc *nats.Conn, api string) (*pulls, error) {
	p := &pulls{nc: nc, api: api}
	if err := p.subscribe(); err != nil {
		return nil, err
	}
	return p, nil
}

// subscribe listens for the answers of the worker's pull requests on a
// new inbox.
func (p *pulls) subscribe() error {
	inbox, ch := p.nc.NewInbox(), make(chan *nats.Msg, pendingAnswers)
	sub, err := p.nc.ChanSubscribe(inbox+".*", ch)
	if err != nil {
		return fmt.Errorf("subscribe to the answers of pull requests: %w", err)
	}
	p.inbox, p.ch, p.sub = inbox, ch, sub
	return nil
}

// giveUp gives up the worker's request: it ends the subscription (the
// server then gives the request nothing). A task that came meanwhile is
// handed back when handBack says it came while the worker waited (it is
// a moment old); otherwise it is left to its ack wait: handed back after
// that wait passed, a task another agent took meanwhile would be run
// twice. A task the server sent before it saw the unsubscription, and
// after the last look at the channel, waits for its ack wait, as with
// Fetch.
func (p *pulls) giveUp(handBack bool) {
	if p.sub == nil {
		return
	}
	_ = p.sub.Unsubscribe() // no message comes on p.ch after it returns
	p.sub = nil
	for {
		select {
		case m := <-p.ch:
			if handBack && !isStatus(m) {
				_ = p.task(m).Nak()
			}
		default:
			return
		}
	}
}

// close ends the worker's pulls, giving up a request left.
func (p *pulls) close() { p.giveUp(false) }

// isStatus reports whether m is a status of the server about a request
// rather than a task.
func isStatus(m *nats.Msg) bool { return len(m.Data) == 0 && m.Header.Get("Status") != "" }

// take asks cons for one task and waits for it: nil when none came (none
// waited, or the request expired) or ctx ended; an error when the server
// said why it cannot answer, or (with heartbeats) stopped answering.
func (p *pulls) take(ctx context.Context, cons jetstream.Consumer, o pullOpts) (jetstream.Msg, error) {
	if ctx.Err() != nil {
		return nil, nil // asked for nothing: a stopping worker's request would only be given up
	}
	info := cons.CachedInfo()
	if info == nil {
		return nil, errors.New("pull: the consumer was not bound")
	}
	body, err := json.Marshal(pullRequest{Batch: 1, Expires: o.expires, NoWait: o.noWait, Heartbeat: o.heartbeat})
	if err != nil {
		return nil, fmt.Errorf("pull: %w", err)
	}
	if len(p.ch) > 0 {
		// An answer that came between two pulls, when none was live: none
		// should, and a task of unknown age is not taken (see giveUp).
		p.giveUp(false)
	}
	if p.sub == nil {
		if err := p.subscribe(); err != nil {
			return nil, err
		}
	}
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
				continue // not about this request (none other is live)
			}
			if m.Header.Get("Status") == statusHeartbeat {
				heard = time.Now()
				continue
			}
			err := statusErr(m)
			if err != nil && !errors.Is(err, nats.ErrNoResponders) {
				// Another server may still deliver for the request: on a
				// cluster, the old leader's last task can come after the
				// new leader's "leadership change". No server took a
				// request nobody responded to.
				p.giveUp(true)
			}
			return nil, err
		case <-ctx.Done():
			p.giveUp(true)
			return nil, nil
		case <-deadline.C:
			p.giveUp(true)
			return nil, nil
		case now := <-beat:
			// Given up after two to three missed heartbeats (nats.go's
			// Fetch: two): the consumer's leader moved, and the request
			// with it, or the connection stalled.
			if now.Sub(heard) > 2*o.heartbeat {
				p.giveUp(true)
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
	if err := t.answerable(); err != nil {
		return err
	}
	return t.nc.Publish(t.m.Reply, []byte("+WPI"))
}

// DoubleAck acknowledges the task and waits for the server to confirm
// (as long as ctx allows).
func (t *taskMsg) DoubleAck(ctx context.Context) error {
	if err := t.answerable(); err != nil {
		return err
	}
	if _, err := t.nc.RequestWithContext(ctx, t.m.Reply, []byte("+ACK")); err != nil {
		return err
	}
	t.done.Store(true)
	return nil
}

// answerable says why the server can be told nothing more of the task
// (nil if it can): it was settled, or it came with no subject to answer.
func (t *taskMsg) answerable() error {
	if t.done.Load() {
		return jetstream.ErrMsgAlreadyAckd
	}
	if t.m.Reply == "" {
		return jetstream.ErrMsgNoReply
	}
	return nil
}

// settle acknowledges, hands back or ends the task, once.
func (t *taskMsg) settle(body string) error {
	if err := t.answerable(); err != nil {
		return err
	}
	if err := t.nc.Publish(t.m.Reply, []byte(body)); err != nil {
		return err
	}
	t.done.Store(true)
	return nil
}
