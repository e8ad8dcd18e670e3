package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/apiv1"
	"jetflow.dev/services/api/projector"
)

// DefaultReadyMaxLag is Config.ReadyMaxLag's default.
const DefaultReadyMaxLag = time.Minute

// backlogFresh is how long GET /readyz trusts a backlog it read: probes of
// several replicas, or a probe every second, ask NATS once a second.
const backlogFresh = time.Second

// ready answers whether the api serves (docs/api.md#get-readyz):
//   - it is connected to NATS, and none of its streams and buckets is
//     missing;
//   - in each namespace, its projector's consumer is bound;
//   - until each namespace has once been caught up since the api started:
//     the read models are at most ReadyMaxLag behind the events (the age
//     of the oldest event not yet projected), and its visibility index is
//     live. These two hold for every api of a namespace alike (the
//     projector's consumer, a shared index), so once met they are only
//     reported: a backlog or a rebuild later must not take every replica
//     out of service at once, when only some lists need them.
//
// The answer is public: it names no namespace and holds no error text
// (the log does); the figures are over every namespace.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	if s.def.nc.Status() != nats.CONNECTED {
		writeError(w, http.StatusServiceUnavailable, apiError{Code: "unavailable", Message: "not connected to NATS"})
		return
	}
	if s.cfg.Missing != nil {
		if missing := s.cfg.Missing(); len(missing) > 0 {
			writeError(w, http.StatusServiceUnavailable, apiError{Code: "unavailable",
				Message: "missing: " + strings.Join(missing, ", ") + " (jetflow bootstrap creates them again)"})
			return
		}
	}
	out := apiv1.Ready{Status: "ok"}
	if len(s.projectors) > 0 {
		out.IndexLive = true
	}
	var why []string
	for name, p := range s.projectors {
		out.Parked += len(p.Parked())
		st := s.namespaceReady(r.Context(), name, p)
		out.ProjectorLagSeconds = max(out.ProjectorLagSeconds, st.lag.Seconds())
		out.ProjectorPending += st.pending
		out.IndexLive = out.IndexLive && st.indexLive
		for _, reason := range st.why {
			if !slices.Contains(why, reason) {
				why = append(why, reason)
			}
		}
	}
	if len(why) > 0 {
		slices.Sort(why)
		w.Header().Set("Retry-After", RetryAfter)
		writeError(w, http.StatusServiceUnavailable, apiError{Code: "unavailable", Message: strings.Join(why, "; ")})
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// nsReadiness is one namespace's part of GET /readyz.
type nsReadiness struct {
	lag       time.Duration
	pending   uint64
	indexLive bool
	// why are the reasons it is not ready (none when it is).
	why []string
}

// namespaceReady is namespace name's readiness.
func (s *Server) namespaceReady(ctx context.Context, name string, p *projector.Projector) nsReadiness {
	feed := s.feeds[name]
	st := nsReadiness{indexLive: feed == nil || feed.Live()}
	if !p.Bound() {
		st.why = append(st.why, "the projector is binding its consumer")
	}
	caughtUp := st.indexLive
	b, err := s.backlogs.read(ctx, name, s.tenants[name])
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		st.why, caughtUp = append(st.why, "the projector's consumer does not exist (the api makes it as it starts, or jetflow bootstrap)"), false
	case err != nil:
		s.log.Warn().Err(err).Str("namespace", name).Msg("readiness: read the projector's backlog")
		st.why, caughtUp = append(st.why, "the projector's backlog cannot be read (the api's log says why)"), false
	default:
		now := time.Now()
		if s.cfg.clock != nil {
			now = s.cfg.clock()
		}
		st.lag, st.pending = b.Lag(now), b.Pending+b.Unacked
		if st.lag > s.cfg.ReadyMaxLag {
			caughtUp = false
			st.why = append(st.why, fmt.Sprintf("the read models are %s behind the events (%d events to project; the bound is %s: -ready-max-lag)",
				st.lag.Round(time.Second), st.pending, s.cfg.ReadyMaxLag))
		}
	}
	if !st.indexLive {
		st.why = append(st.why, "the visibility index is being fed from the read models")
	}
	if s.caughtUp.once(name, caughtUp && p.Bound()) {
		// Caught up once since the api started: the lag and the index are
		// reported, no longer waited for.
		st.why = slices.DeleteFunc(st.why, func(w string) bool { return w != "the projector is binding its consumer" })
	}
	return st
}

// onceSet remembers the namespaces that have been caught up once.
type onceSet struct {
	mu  sync.Mutex
	set map[string]bool
}

// once records name as caught up when now is true, and reports whether
// it has been caught up, now or before.
func (o *onceSet) once(name string, now bool) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if now {
		if o.set == nil {
			o.set = map[string]bool{}
		}
		o.set[name] = true
	}
	return o.set[name]
}

// backlogCache keeps the projector backlog last read in each namespace,
// or the error reading it, for backlogFresh: probes ask NATS at most once
// a second, however many come, and whether NATS answers or not.
type backlogCache struct {
	mu   sync.Mutex
	last map[string]cachedBacklog
}

type cachedBacklog struct {
	at  time.Time
	b   projector.Backlog
	err error
}

// backlogWait bounds a read of the backlog: under a probe's usual 3 s
// timeout, so that a slow leader is answered as not ready, not a timeout.
const backlogWait = 2 * time.Second

// read is namespace name's projector backlog, read from NATS at most once
// every backlogFresh.
func (c *backlogCache) read(ctx context.Context, name string, t *tenant) (projector.Backlog, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.last[name]; ok && time.Since(e.at) < backlogFresh {
		return e.b, e.err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), backlogWait)
	defer cancel()
	b, err := projector.ReadBacklog(ctx, t.js)
	if c.last == nil {
		c.last = map[string]cachedBacklog{}
	}
	c.last[name] = cachedBacklog{at: time.Now(), b: b, err: err}
	return b, err
}
