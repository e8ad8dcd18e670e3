package projections

import "jetflow.dev/pkg/events"

// FoldQuarantinedCopying is FoldQuarantined with every event applied onto
// a copy (Apply): what the fold that changes its state in place must
// agree with.
func FoldQuarantinedCopying(id string, evs []events.Event) Execution {
	return foldQuarantinedWith(id, evs, Repaired(evs), Apply)
}
