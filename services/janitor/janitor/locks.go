package janitor

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/lock"
	"jetflow.dev/pkg/projections"
)

// sweepLocks finds lock entries (holders and waiters) whose execution is
// no longer running (its read model says it ended or is suspended) or
// does not exist, and asks the dispatcher to clear them: the janitor
// never writes a history or the lock bucket itself. The dispatcher removes
// them with compare-and-set, records lock.cleared in their histories and
// so wakes the next waiters; it leaves alone an execution that was
// resumed meanwhile. Normally a holder releases its locks itself before
// it ends; this repairs a dispatcher that died in between. It returns the
// number of entries it asked to clear.
func (j *Janitor) sweepLocks(ctx context.Context) (int, error) {
	tb, err := lock.Open(ctx, j.js, j.cfg.Now)
	if err != nil {
		return 0, err
	}
	all, err := tb.List(ctx)
	if err != nil || len(all) == 0 {
		return 0, err
	}
	execs, err := j.js.KeyValue(ctx, bus.BucketExecutions)
	if err != nil {
		return 0, fmt.Errorf("open executions bucket: %w", err)
	}
	ids, err := claim.Open(ctx, j.js)
	if err != nil {
		return 0, err
	}
	cleared := 0
	for name, r := range all {
		var entries []events.LockEntry
		for _, e := range append(append([]lock.Entry{}, r.Holders...), r.Waiters...) {
			gone, why, err := notRunning(ctx, execs, ids, e.ExecutionID)
			if err != nil {
				return cleared, err
			}
			if gone {
				j.log.Info().Str("lock", name).Str("execution_id", e.ExecutionID).Str("scope", e.Path).Str("why", why).Msg("clear lock of an ended execution")
				entries = append(entries, events.LockEntry{ExecutionID: e.ExecutionID, Workflow: e.Workflow, Path: e.Path, Request: e.Request})
			}
		}
		if len(entries) == 0 {
			continue
		}
		if err := j.clearLock(ctx, name, entries); err != nil {
			return cleared, err
		}
		cleared += len(entries)
	}
	return cleared, nil
}

// notRunning reports whether execution id has stopped running, and why.
// An execution claimed but not yet projected is young, not gone; one
// whose claim says it expired is gone (retention deleted its read model).
func notRunning(ctx context.Context, execs jetstream.KeyValue, ids *claim.Store, id string) (bool, string, error) {
	e, err := execs.Get(ctx, id)
	switch {
	case err == nil:
		var x projections.Execution
		if json.Unmarshal(e.Value(), &x) != nil {
			return false, "", nil
		}
		if x.Status.Terminal() || x.Status == projections.StatusSuspended {
			return true, "execution " + string(x.Status), nil
		}
		return false, "", nil
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return false, "", fmt.Errorf("read execution %s: %w", id, err)
	}
	c, err := ids.Get(ctx, id)
	if errors.Is(err, claim.ErrNotFound) {
		return true, "execution does not exist", nil
	} else if err != nil {
		return false, "", err
	}
	if c.Expired() {
		return true, "execution expired and was deleted", nil // its read model is gone, not yet written
	}
	return false, "", nil
}

func (j *Janitor) clearLock(ctx context.Context, name string, entries []events.LockEntry) error {
	ev := events.New(j.cfg.Source, "", "", j.cfg.Now(), &events.ClearLock{Lock: name, Entries: entries, OnlyEnded: true,
		Reason: "its execution is no longer running", RequestedBy: j.cfg.Source})
	h := sha256.New()
	h.Write([]byte(name))
	for _, e := range entries {
		h.Write([]byte("\x00" + e.ExecutionID + "\x00" + e.Path + "\x00" + strconv.Itoa(e.Request)))
	}
	ev.ID = "lockclear-" + hex.EncodeToString(h.Sum(nil)[:12]) // the same sweep twice is one command
	msg, err := bus.Encode(bus.SubjectClearLock, ev)
	if err != nil {
		return err
	}
	if _, err := j.js.PublishMsg(ctx, msg, jetstream.WithMsgID(ev.ID)); err != nil {
		return fmt.Errorf("publish clear of lock %s: %w", name, err)
	}
	return nil
}
