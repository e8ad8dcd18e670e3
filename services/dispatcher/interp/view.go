package interp

import (
	"encoding/json"
	"strings"

	"jetflow.dev/pkg/projections"
)

// view is what decisions derive from an execution's state, kept with the
// state between decisions and brought up to date with what changed since
// (instances only ever get added, and a step's status, attempt, output
// and error change by events): where each instance is, which frame it
// belongs to, and which leading items of each foreach are done, with
// their outputs. With it a decision costs what changed, not what the
// execution has done so far: without it, every decision of a foreach of
// n items walked all n items' instances (quadratic in the items).
//
// It is an optimisation only: decide gives the same action with or
// without it (the packages' tests check every decision both ways, see SetVerifyView). A resume or a replay, which can
// reset any instance, starts it afresh.
type view struct {
	resumes int // s.Resumes when built
	// ids[i] is s.Steps[i].ID for the instances seen so far.
	ids      []string
	pos      map[string]int
	children map[string][]int // frame prefix -> positions of its instances
	// latest is, by frame prefix, the position of each step's latest
	// instance by its local id (a later round's wins): what expressions
	// in the frame see as steps.<id>, without walking every round's.
	latest  map[string]map[string]int
	rounds  bool // some path has a round (~r)
	foreach map[string]*foreachMemo
	lists   map[string]*listMemo
}

// SmallExecution is the number of instances up to which decisions walk
// the state instead of keeping a view (building and syncing one costs
// more than walking a few instances).
const SmallExecution = 32

// verifyView makes every decision with a view be taken again without it,
// and panic if they differ (the package's tests set it).
var verifyView bool

// viewOver is the number of instances over which decisions keep a view:
// SmallExecution, or none while views are verified (every execution has
// one then, so that every decision is taken both ways).
var viewOver = SmallExecution

// foreachMemo is what a foreach instance's earlier decisions learned.
type foreachMemo struct {
	items []any
	// done items [0, done) have ended, with these outputs: items end for
	// good until a resume or a replay (which starts the view afresh).
	done    int
	outputs []any
}

// listMemo is what the decisions learned of a list of steps run in order
// (a frame: the workflow's steps, a block's, a foreach item's, a
// branch's, a switch case's, a called workflow's; not on-error steps):
// in its round-th round (0 before any goto), its leading steps [0, done)
// succeeded or were skipped, every earlier round ended in a goto that
// succeeded, and last is the last output among them. Those end for good
// until a resume or a replay (which starts the view afresh), or a move to
// another version (which starts the memo afresh): a decision goes on from
// there rather than walking them again, which made each decision of an
// execution of n steps, or of a loop's n-th round, cost n.
type listMemo struct {
	round int
	done  int
	last  json.RawMessage
}

// list returns the memo of the list of steps with this prefix.
func (v *view) list(prefix string) *listMemo {
	m := v.lists[prefix]
	if m == nil {
		m = &listMemo{}
		v.lists[prefix] = m
	}
	return m
}

// sync brings v up to date with s and returns it; a nil view stays nil.
func (v *view) sync(s projections.Execution) *view {
	if v == nil {
		return nil
	}
	if v.pos == nil || v.resumes != s.Resumes || len(s.Steps) < len(v.ids) ||
		(len(v.ids) > 0 && s.Steps[len(v.ids)-1].ID != v.ids[len(v.ids)-1]) {
		*v = view{resumes: s.Resumes, pos: map[string]int{}, children: map[string][]int{}, latest: map[string]map[string]int{},
			foreach: map[string]*foreachMemo{}, lists: map[string]*listMemo{}}
	}
	for i := len(v.ids); i < len(s.Steps); i++ {
		id := s.Steps[i].ID
		v.ids = append(v.ids, id)
		v.pos[id] = i
		parent := ""
		if j := strings.LastIndexByte(id, '/'); j >= 0 {
			parent = id[:j+1]
		}
		v.children[parent] = append(v.children[parent], i)
		byID := v.latest[parent]
		if byID == nil {
			byID = map[string]int{}
			v.latest[parent] = byID
		}
		byID[localID(id[len(parent):])] = i
		if strings.Contains(id, "~") {
			v.rounds = true
		}
	}
	return v
}

// memo returns the foreach memo of the instance with this prefix, parsing
// its items from input the first time.
func (v *view) memo(prefix string, input json.RawMessage) *foreachMemo {
	m := v.foreach[prefix]
	if m == nil {
		var rec struct {
			Items []any `json:"items"`
		}
		_ = json.Unmarshal(input, &rec)
		m = &foreachMemo{items: rec.Items, outputs: make([]any, len(rec.Items))}
		v.foreach[prefix] = m
	}
	return m
}

// SetVerifyView turns on (for tests of the packages that call Next) the
// check that every decision taken with a view is the one taken without,
// and a view of every execution, however small.
func SetVerifyView(on bool) {
	verifyView, viewOver = on, SmallExecution
	if on {
		viewOver = 0
	}
}
