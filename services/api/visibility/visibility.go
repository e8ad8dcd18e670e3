// Package visibility keeps the api's visibility index: one row per
// execution (its workflow, status, times, step counts, error, damage and
// search attributes) in a store indexed for listing, so that
// GET /v1/executions filters, sorts by time and pages with a cursor
// without reading every read model (docs/adr/0011-visibility-store.md).
//
// The index is a projection of the read models: [Feed] watches the
// executions bucket and writes each read model's row, with the bucket
// revision it has reached, in one transaction. It can always be dropped
// and fed again from the bucket. [Store] is what a store must do (package
// storetest is the suite that checks it); the embedded SQLite store is
// package sqlitestore, the external PostgreSQL one package pgstore.
package visibility

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"jetflow.dev/pkg/projections"
)

// Store keeps the rows and the position of the feed that wrote them. A
// store serves one namespace. Implementations must apply a batch and its
// position atomically (a crash between them would apply updates twice or
// lose them), and answer every query of [Query] with index range scans
// and keyset paging (never an offset), examining at most [ScanBudget]
// rows per query.
//
// The position never goes backwards (but for Reset), and an update at or
// below it is known to be applied: a batch's updates at or below the
// stored position are left out. So two feeds may write one store (api
// replicas sharing an external database), each from where it stands: a
// feed behind the other cannot bring back a row the other deleted.
type Store interface {
	// Apply writes a batch of rows and deletions and the position they
	// bring the index to, in one transaction. A row replaces the stored
	// one only if its Rev is higher; a deletion removes a row whose Rev
	// is lower; updates whose Rev is at or below the stored position are
	// left out, and a position below the stored one is not recorded:
	// applying a batch again changes nothing. The counts by status
	// (Counts) change with the rows, in the same transaction.
	Apply(ctx context.Context, b Batch) error
	// Position is where the feed stands (the zero Position for an empty
	// store).
	Position(ctx context.Context) (Position, error)
	// Query answers a page of rows.
	Query(ctx context.Context, q Query) (Page, error)
	// Counts is the number of rows by status, of one workflow's
	// executions, or of all with workflow "". A status without rows is
	// absent. It reads counts Apply keeps (a row per workflow and status),
	// never the rows themselves.
	Counts(ctx context.Context, workflow string) (map[projections.Status]int, error)
	// Reset drops every row, the counts and the position: the feed then
	// starts over from the bucket's start.
	Reset(ctx context.Context) error
	// Count is the number of rows.
	Count(ctx context.Context) (int, error)
	Close() error
}

// ErrReset is wrapped by Apply's error when another writer reset the
// store since this one last read its position (an api replica's rebuild,
// with a store two replicas share): the feed starts over from the
// position as it is now.
var ErrReset = errors.New("visibility: the index was reset by another writer")

// ScanBudget bounds the index entries one query examines. A query whose
// filters are not all part of the range it scans (see [Query]) may answer
// a partial page with a cursor to go on from once it has looked at that
// many.
const ScanBudget = 5000

// Row is one execution as the index keeps it.
type Row struct {
	ID       string
	Workflow string
	Version  int
	Status   projections.Status
	// StartedAt, EndedAt and UpdatedAt are the read model's (zero when it
	// has none: EndedAt until the execution ends).
	StartedAt, EndedAt, UpdatedAt time.Time
	// Steps counts step instances, Done those that succeeded, those a
	// truncated read model left out included.
	Steps, Done int
	Error       string
	Damaged     *projections.Damage
	// Attrs are the search attributes' values, by name.
	Attrs map[string]string
	// Rev is the bucket revision of the read model the row was made from.
	Rev uint64
}

// Delete removes the row of an execution whose read model was deleted or
// purged at bucket revision Rev.
type Delete struct {
	ID  string
	Rev uint64
}

// Batch is what [Store.Apply] writes at once.
type Batch struct {
	Puts     []Row
	Deletes  []Delete
	Position Position
}

// Position is how far the index has applied the executions bucket.
type Position struct {
	// Revision is the last bucket revision applied (the sequence of its
	// stream).
	Revision uint64
	// Stream is when the bucket's stream was created: a bucket made again
	// (or restored from a backup) numbers its revisions anew, and the
	// index is then fed again from its start.
	Stream time.Time
	// LiveAt is when the feed last knew the index had applied every
	// update there was. The janitor removes the markers of deleted read
	// models after a while: an index that was not live for longer may
	// have missed deletions, and is fed again from the start.
	LiveAt time.Time
}

// Sort is the order of a list.
type Sort string

// The orders of a list. Ascending and descending orders use the same
// index; ties (the same time) are ordered by id, in the same direction.
const (
	// SortID: by execution id, ascending (the list's order before the
	// index existed, and still its default).
	SortID          Sort = "id"
	SortStartedDesc Sort = "started_desc"
	SortStartedAsc  Sort = "started_asc"
	// SortEndedDesc and SortEndedAsc list ended executions only.
	SortEndedDesc Sort = "ended_desc"
	SortEndedAsc  Sort = "ended_asc"
)

// Sorts are the orders, as the api's sort parameter takes them.
var Sorts = []Sort{SortID, SortStartedDesc, SortStartedAsc, SortEndedDesc, SortEndedAsc}

// Valid reports whether s is one of Sorts.
func (s Sort) Valid() bool { return slices.Contains(Sorts, s) }

// Desc reports whether s lists the latest first.
func (s Sort) Desc() bool { return s == SortStartedDesc || s == SortEndedDesc }

// Key is what s sorts by: "id", "started" or "ended".
func (s Sort) Key() string {
	k, _, _ := strings.Cut(string(s), "_")
	return k
}

// Statuses are the statuses a read model can have: a list that filters
// none merges the rows of each (a store may keep its indexes by status).
var Statuses = []projections.Status{projections.StatusNone, projections.StatusPending, projections.StatusStarted, projections.StatusCancelling,
	projections.StatusSuspended, projections.StatusSucceeded, projections.StatusFailed, projections.StatusCancelled}

// MaxAttrs bounds the search attributes one query filters by.
const MaxAttrs = 8

// Attr is a search attribute's value, as a query asks for it.
type Attr struct{ Name, Value string }

// Query selects and orders rows. Times are inclusive after and exclusive
// before (zero: unbounded), so that adjacent windows do not overlap.
//
// The filters that make the range an index scans are: Workflow, Status,
// the time range of the sort's key, and, instead of workflow and status,
// Damaged or the first of Attrs. The others (the other time's range,
// Workflow and Status beside Damaged or an attribute, further Attrs) are
// checked row by row within that range, at most [ScanBudget] rows per
// query: a page may then be partial.
type Query struct {
	Workflow string
	// Status, if set, is one of projections.ListedStatuses.
	Status        projections.Status
	Damaged       bool
	StartedAfter  time.Time
	StartedBefore time.Time
	EndedAfter    time.Time
	EndedBefore   time.Time
	Attrs         []Attr
	Sort          Sort
	// After, if set, is the cursor of the previous page (its Sort must be
	// the query's).
	After *Cursor
	// Limit is the page size (at least 1).
	Limit int
}

// Page is a query's answer.
type Page struct {
	Rows []Row
	// Next is the cursor of the next page; nil when no row is left.
	Next *Cursor
	// Partial says the query stopped at ScanBudget rows examined before
	// the page was full: go on with Next.
	Partial bool
}

// Cursor is where a page ended: the sort key of its last row (or of the
// last row examined, for a partial page).
type Cursor struct {
	Sort Sort
	// Time is the row's time of the sort's key, in Unix nanoseconds (0
	// for SortID).
	Time int64
	ID   string
}

// String encodes c for the api's next and after: opaque to clients. A
// cursor in id order is the id itself, as it always was, so that a
// client that passes an id as after keeps working.
func (c Cursor) String() string {
	if c.Sort == SortID {
		return c.ID
	}
	return base64.RawURLEncoding.EncodeToString([]byte(string(c.Sort) + "/" + strconv.FormatInt(c.Time, 10) + "/" + c.ID))
}

// ErrCursor is wrapped by ParseCursor's errors.
var ErrCursor = errors.New("not a cursor of this list")

// ParseCursor decodes a cursor of a list in order sort.
func ParseCursor(sort Sort, s string) (Cursor, error) {
	if sort == SortID {
		// An id order's cursor is the last id, as before the index; a time
		// order's cursor is refused rather than read as an id (a page of
		// something else). No execution id is a time cursor's encoding.
		if b, err := base64.RawURLEncoding.DecodeString(s); err == nil {
			if parts := strings.SplitN(string(b), "/", 3); len(parts) == 3 && Sort(parts[0]).Valid() && Sort(parts[0]) != SortID {
				if _, err := strconv.ParseInt(parts[1], 10, 64); err == nil {
					return Cursor{}, fmt.Errorf("%w: it is a cursor of a list in %s order, and this one is in %s order", ErrCursor, parts[0], sort)
				}
			}
		}
		return Cursor{Sort: SortID, ID: s}, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Cursor{}, fmt.Errorf("%w: pass the previous page's next as it is", ErrCursor)
	}
	parts := strings.SplitN(string(b), "/", 3)
	if len(parts) != 3 {
		return Cursor{}, fmt.Errorf("%w: pass the previous page's next as it is", ErrCursor)
	}
	if Sort(parts[0]) != sort {
		return Cursor{}, fmt.Errorf("%w: it is a cursor of a list in %s order, and this one is in %s order", ErrCursor, parts[0], sort)
	}
	t, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil {
		return Cursor{}, fmt.Errorf("%w: pass the previous page's next as it is", ErrCursor)
	}
	return Cursor{Sort: sort, Time: t, ID: parts[2]}, nil
}

// UnixNano is t in Unix nanoseconds, 0 for the zero time: how stores keep
// times and cursors hold them.
func UnixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// FromUnixNano is the inverse of UnixNano, in UTC.
func FromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}
