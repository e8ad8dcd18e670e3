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

// ready answers whether the api serves (docs/operations.md#health):
//   - it is connected to NATS, and none of its streams and buckets is
//     missing;
//   - in each namespace, its projector's consumer is bound, the read
//     models are at most ReadyMaxLag behind the events (the age of the
//     oldest event not yet projected), and its visibility index has
//     caught up with the read models since the api started.
//
// It counts the executions whose read models the projectors have parked
// (a parked one does not make the api unready: every other execution is
// served).
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
	var why []string
	names := make([]string, 0, len(s.projectors))
	for name := range s.projectors {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		p := s.projectors[name]
		out.Parked += len(p.Parked())
		st, reason := s.namespaceReady(r.Context(), name, p)
		if out.Namespaces == nil {
			out.Namespaces = map[string]apiv1.ReadyNamespace{}
		}
		out.Namespaces[name] = st
		if reason != "" {
			why = append(why, "namespace "+name+": "+reason)
		}
	}
	if len(why) > 0 {
		w.Header().Set("Retry-After", RetryAfter)
		writeError(w, http.StatusServiceUnavailable, apiError{Code: "unavailable", Message: strings.Join(why, "; ")})
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// namespaceReady is namespace name's readiness, with the reason it is not
// ready ("" when it is).
func (s *Server) namespaceReady(ctx context.Context, name string, p *projector.Projector) (apiv1.ReadyNamespace, string) {
	var st apiv1.ReadyNamespace
	feed := s.feeds[name]
	st.IndexLive = feed != nil && feed.Live()
	var why []string
	if !p.Bound() {
		why = append(why, "the projector is binding its consumer")
	}
	b, err := s.backlogs.read(ctx, name, s.tenants[name])
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		why = append(why, "the projector's consumer does not exist (the api makes it as it starts, or jetflow bootstrap)")
	case err != nil:
		why = append(why, fmt.Sprintf("the projector's backlog cannot be read: %v", err))
	default:
		now := time.Now()
		if s.cfg.clock != nil {
			now = s.cfg.clock()
		}
		lag := b.Lag(now)
		st.ProjectorLagSeconds, st.ProjectorPending = lag.Seconds(), b.Pending+b.Unacked
		if lag > s.cfg.ReadyMaxLag {
			why = append(why, fmt.Sprintf("the read models are %s behind the events (%d events to project; the bound is %s: -ready-max-lag)",
				lag.Round(time.Second), st.ProjectorPending, s.cfg.ReadyMaxLag))
		}
	}
	if feed != nil && !st.IndexLive {
		why = append(why, "the visibility index is being fed from the read models")
	}
	return st, strings.Join(why, ", ")
}

// backlogCache keeps the projector backlog last read in each namespace for
// backlogFresh.
type backlogCache struct {
	mu   sync.Mutex
	last map[string]cachedBacklog
}

type cachedBacklog struct {
	at time.Time
	b  projector.Backlog
}

// read is namespace name's projector backlog, read from NATS at most once
// every backlogFresh.
func (c *backlogCache) read(ctx context.Context, name string, t *tenant) (projector.Backlog, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.last[name]; ok && time.Since(e.at) < backlogFresh {
		return e.b, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	b, err := projector.ReadBacklog(ctx, t.js)
	if err != nil {
		return b, err
	}
	if c.last == nil {
		c.last = map[string]cachedBacklog{}
	}
	c.last[name] = cachedBacklog{at: time.Now(), b: b}
	return b, nil
}
