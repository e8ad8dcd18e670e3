package claim_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"jetflow.dev/pkg/bus"
	"jetflow.dev/pkg/claim"
	"jetflow.dev/pkg/events"
	"jetflow.dev/pkg/natstest"
)

type testBundle struct {
	nc    *nats.Conn
	store *claim.Store
	// raw is the bucket itself, to look at records as stored and to write
	// them as earlier versions did.
	raw jetstream.KeyValue
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	nc, js := natstest.Connect(t, natstest.RunJetStream(t))
	store, err := claim.Open(t.Context(), js)
	require.NoError(t, err)
	raw, err := js.KeyValue(t.Context(), bus.BucketExecutionIDs)
	require.NoError(t, err)
	return &testBundle{nc: nc, store: store, raw: raw}
}

// stored returns the members of the record of id as the bucket holds it.
func (b *testBundle) stored(t *testing.T, id string) map[string]any {
	t.Helper()
	e, err := b.raw.Get(t.Context(), id)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(e.Value(), &m))
	return m
}

var claimedAt = time.Date(2026, 3, 14, 10, 0, 0, 0, time.UTC)

func record(key, digest string) claim.Record {
	return claim.Record{CommandKey: key, Digest: digest, Workflow: "wf", ClaimedAt: claimedAt}
}

// TestClaimCreates: a free id is claimed with the record asked for,
// stored in the format every version reads.
func TestClaimCreates(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := b.store.Get(t.Context(), "x-1")
	require.ErrorIs(t, err, claim.ErrNotFound)

	at := time.Date(2026, 3, 14, 11, 0, 0, 0, time.FixedZone("CET", 3600))
	got, err := b.store.Claim(t.Context(), "x-1", claim.Record{CommandKey: "src#1", Digest: "d1", Workflow: "wf", ClaimedAt: at})
	require.NoError(t, err)
	want := claim.Record{CommandKey: "src#1", Digest: "d1", Workflow: "wf", ClaimedAt: at.UTC()}
	require.Equal(t, want, got)
	require.False(t, got.Expired())

	read, err := b.store.Get(t.Context(), "x-1")
	require.NoError(t, err)
	require.Equal(t, want, read)
	require.Equal(t, map[string]any{"command_key": "src#1", "digest": "d1", "workflow": "wf", "claimed_at": "2026-03-14T10:00:00Z"},
		b.stored(t, "x-1"), "the on-disk format")
}

// TestClaimConflict: an id held by one request is refused to any other,
// whether it names another key or the same key with other data, and the
// record that holds it is left as it is.
func TestClaimConflict(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, err := b.store.Claim(t.Context(), "x-1", record("src#1", "d1"))
	require.NoError(t, err)

	for _, c := range []struct {
		name, key, digest, reason string
	}{
		{"OtherKey", "src#2", "d1", `execution id "x-1" is already used (workflow wf); execution ids are unique forever`},
		{"OtherKeyNoDigest", "src#2", "", `execution id "x-1" is already used (workflow wf); execution ids are unique forever`},
		{"SameKeyOtherData", "src#1", "d2", `execution "x-1" was started by a request with the same key (CloudEvent source and id, or Idempotency-Key) and other data; ` +
			"a key names one request: send the same data to get that execution, or use a new key (or id) for a new one"},
	} {
		t.Run(c.name, func(t *testing.T) {
			held, err := b.store.Claim(t.Context(), "x-1", claim.Record{CommandKey: c.key, Digest: c.digest, Workflow: "other", ClaimedAt: claimedAt.Add(time.Hour)})
			require.ErrorIs(t, err, claim.ErrConflict)
			var conflict *claim.ConflictError
			require.ErrorAs(t, err, &conflict)
			require.Equal(t, "x-1", conflict.ID)
			require.Equal(t, first, conflict.Held)
			require.Equal(t, c.reason, conflict.Reason)
			require.Equal(t, c.reason, err.Error())
			require.Equal(t, first, held, "the record that holds the id")

			read, err := b.store.Get(t.Context(), "x-1")
			require.NoError(t, err)
			require.Equal(t, first, read, "the claim is untouched")
		})
	}
}

// TestClaimAgain: the same request claiming its id again (a re-delivered
// or re-published command) gets the record it made, not a new one.
func TestClaimAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, err := b.store.Claim(t.Context(), "x-1", record("src#1", "d1"))
	require.NoError(t, err)

	again, err := b.store.Claim(t.Context(), "x-1", claim.Record{CommandKey: "src#1", Digest: "d1", Workflow: "wf", ClaimedAt: claimedAt.Add(time.Hour)})
	require.NoError(t, err)
	require.Equal(t, first, again, "the stored record, with its first ClaimedAt")
	require.Equal(t, "2026-03-14T10:00:00Z", b.stored(t, "x-1")["claimed_at"])

	// A command that records no digest agrees with any.
	again, err = b.store.Claim(t.Context(), "x-1", record("src#1", ""))
	require.NoError(t, err)
	require.Equal(t, first, again)
}

// TestClaimRace: of many requests claiming one id at once, exactly one
// gets it, and every other is told which holds it.
func TestClaimRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 8
	var wg sync.WaitGroup
	held := make([]claim.Record, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			held[i], errs[i] = b.store.Claim(t.Context(), "x-race", record(fmt.Sprintf("src#%d", i), "d"))
		})
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		if err == nil {
			require.Equal(t, -1, winner, "two winners: %d and %d", winner, i)
			winner = i
			continue
		}
		require.ErrorIs(t, err, claim.ErrConflict, "claim %d", i)
	}
	require.NotEqual(t, -1, winner, "nobody got the id")
	want := record(fmt.Sprintf("src#%d", winner), "d")
	for i := range n {
		require.Equal(t, want, held[i], "what claim %d was told holds the id", i)
	}
	read, err := b.store.Get(t.Context(), "x-race")
	require.NoError(t, err)
	require.Equal(t, want, read)
}

// TestMarkExpired: retention releases an execution, never its id: the
// claim is kept, marked with the first expiry time, and still refuses
// another request; the request that made it is told it expired.
func TestMarkExpired(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first, err := b.store.Claim(t.Context(), "x-1", record("src#1", "d1"))
	require.NoError(t, err)

	expiredAt := time.Date(2026, 3, 15, 9, 30, 0, 0, time.FixedZone("EST", -5*3600))
	require.NoError(t, b.store.MarkExpired(t.Context(), "x-1", expiredAt))
	require.NoError(t, b.store.MarkExpired(t.Context(), "x-1", expiredAt.Add(time.Hour)), "marking again")
	read, err := b.store.Get(t.Context(), "x-1")
	require.NoError(t, err)
	require.True(t, read.Expired())
	require.True(t, read.ExpiredAt.Equal(expiredAt), "the first mark is kept: %s", read.ExpiredAt)
	read.ExpiredAt = time.Time{}
	require.Equal(t, first, read, "the rest of the claim is kept")
	require.Equal(t, "2026-03-15T14:30:00Z", b.stored(t, "x-1")["expired_at"])

	again, err := b.store.Claim(t.Context(), "x-1", record("src#1", "d1"))
	require.NoError(t, err)
	require.True(t, again.Expired(), "the same request learns that its execution expired")
	_, err = b.store.Claim(t.Context(), "x-1", record("src#2", "d1"))
	require.ErrorIs(t, err, claim.ErrConflict, "an expired execution's id is never used again")

	// An id nobody claimed is left alone: marking does not claim it.
	require.NoError(t, b.store.MarkExpired(t.Context(), "x-none", expiredAt))
	_, err = b.store.Get(t.Context(), "x-none")
	require.ErrorIs(t, err, claim.ErrNotFound)
}

// TestEarlierFormats: records as earlier versions wrote them (no digest,
// no claimed_at, members this version does not know) still read, agree
// with any digest of their request, and keep what they hold when marked
// expired.
func TestEarlierFormats(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.raw.Create(t.Context(), "x-old", []byte(`{"command_key":"src#1","workflow":"wf","claimed_at":"2025-01-02T03:04:05Z","future":{"a":1}}`))
	require.NoError(t, err)
	_, err = b.raw.Create(t.Context(), "x-bare", []byte(`{"workflow":"wf"}`))
	require.NoError(t, err)

	old, err := b.store.Get(t.Context(), "x-old")
	require.NoError(t, err)
	require.Equal(t, claim.Record{CommandKey: "src#1", Workflow: "wf", ClaimedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}, old)
	require.NoError(t, old.Check("x-old", "src#1", "any digest"))
	again, err := b.store.Claim(t.Context(), "x-old", record("src#1", "d1"))
	require.NoError(t, err, "the request that made a record without a digest")
	require.Equal(t, old, again)

	bare, err := b.store.Get(t.Context(), "x-bare")
	require.NoError(t, err)
	require.Equal(t, claim.Record{Workflow: "wf"}, bare)
	require.False(t, bare.Expired())

	require.NoError(t, b.store.MarkExpired(t.Context(), "x-old", claimedAt))
	stored := b.stored(t, "x-old")
	require.Equal(t, map[string]any{"a": float64(1)}, stored["future"], "a member this version does not know is kept")
	require.Equal(t, "2026-03-14T10:00:00Z", stored["expired_at"])
	require.Equal(t, "src#1", stored["command_key"])
}

// TestInvalid: an id that cannot be an execution id is never claimed nor
// found, and a record must name its command and workflow.
func TestInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, id := range []string{"", "a b", "a.b", "a*", "-x", "x>", strings.Repeat("x", 129)} {
		_, err := b.store.Claim(t.Context(), id, record("src#1", "d"))
		require.ErrorIs(t, err, claim.ErrInvalid, "claim %q", id)
		_, err = b.store.Get(t.Context(), id)
		require.ErrorIs(t, err, claim.ErrNotFound, "get %q", id)
		require.ErrorIs(t, b.store.MarkExpired(t.Context(), id, claimedAt), claim.ErrInvalid, "mark %q", id)
	}
	_, err := b.store.Claim(t.Context(), "x-1", claim.Record{Workflow: "wf"})
	require.ErrorIs(t, err, claim.ErrInvalid, "no command key")
	_, err = b.store.Claim(t.Context(), "x-1", claim.Record{CommandKey: "src#1"})
	require.ErrorIs(t, err, claim.ErrInvalid, "no workflow")
	_, err = b.store.Get(t.Context(), "x-1")
	require.ErrorIs(t, err, claim.ErrNotFound, "nothing was claimed")
}

// TestEach: every claim is listed once with its record; an error from the
// callback stops the listing and is returned.
func TestEach(t *testing.T) {
	t.Parallel()
	b := setup(t)
	seen := 0
	require.NoError(t, b.store.Each(t.Context(), func(string, claim.Record) error { seen++; return nil }))
	require.Zero(t, seen, "an empty registry")

	want := map[string]claim.Record{}
	for i := range 300 { // more than the watcher's channel holds
		id := fmt.Sprintf("x-%03d", i)
		r := record("src#"+id, "d")
		_, err := b.store.Claim(t.Context(), id, r)
		require.NoError(t, err)
		want[id] = r
	}
	require.NoError(t, b.store.MarkExpired(t.Context(), "x-007", claimedAt))
	exp := want["x-007"]
	exp.ExpiredAt = claimedAt
	want["x-007"] = exp

	got := map[string]claim.Record{}
	require.NoError(t, b.store.Each(t.Context(), func(id string, r claim.Record) error {
		_, dup := got[id]
		require.False(t, dup, "%s listed twice", id)
		got[id] = r
		return nil
	}))
	require.Equal(t, want, got)

	stop := errors.New("enough")
	calls := 0
	err := b.store.Each(t.Context(), func(string, claim.Record) error {
		calls++
		if calls == 3 {
			return stop
		}
		return nil
	})
	require.ErrorIs(t, err, stop)
	require.Equal(t, 3, calls)
}

// TestSubject: a write on Subject(id) is a write of the claim of id (what
// NATS permissions must allow or deny).
func TestSubject(t *testing.T) {
	t.Parallel()
	b := setup(t)
	msg, err := b.nc.Request(claim.Subject("x-1"), []byte(`{"command_key":"src#1","workflow":"wf"}`), 10*time.Second)
	require.NoError(t, err)
	var ack struct {
		Error *jetstream.APIError `json:"error"`
		Seq   uint64              `json:"seq"`
	}
	require.NoError(t, json.Unmarshal(msg.Data, &ack))
	require.Nil(t, ack.Error, "the bucket stored it: %s", msg.Data)
	require.NotZero(t, ack.Seq, "the bucket stored it: %s", msg.Data)
	got, err := b.store.Get(t.Context(), "x-1")
	require.NoError(t, err)
	require.Equal(t, claim.Record{CommandKey: "src#1", Workflow: "wf"}, got)
}

// TestRecordCheck: the same request is the same key with the same data;
// records and commands without a digest agree with any.
func TestRecordCheck(t *testing.T) {
	t.Parallel()
	r := record("src#1", "d1")
	for _, c := range []struct {
		name, key, digest string
		conflict          bool
	}{
		{"Same", "src#1", "d1", false},
		{"NoDigestAsked", "src#1", "", false},
		{"OtherDigest", "src#1", "d2", true},
		{"OtherKey", "src#2", "d1", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := r.Check("x-1", c.key, c.digest)
			if !c.conflict {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, claim.ErrConflict)
		})
	}
	require.NoError(t, claim.Record{CommandKey: "src#1", Workflow: "wf"}.Check("x-1", "src#1", "d2"), "a record without a digest")

	started := &events.ExecutionStarted{Workflow: "wf", CommandKey: "src#1", CommandDigest: "d1", Token: "t"}
	require.Equal(t, claim.Record{CommandKey: "src#1", Digest: "d1", Workflow: "wf"}, claim.Started(started))
	require.NoError(t, claim.Started(started).Check("x-1", "src#1", "d1"))
	require.ErrorIs(t, claim.Started(started).Check("x-1", "src#1", "d2"), claim.ErrConflict)
}
