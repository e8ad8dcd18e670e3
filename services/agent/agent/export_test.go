package agent

import "time"

// FollowKillNotice makes the agent follow the kill notice of execID at
// stream sequence seq, as its watcher does when it reads one: a test can
// so hold the agent's view of the notices behind the stream.
func (a *Agent) FollowKillNotice(execID string, seq uint64) {
	a.kills.kill(execID, seq, time.Now())
}

// SetLongPoll sets how long idle workers wait on the normal lane (the
// scout excepted), and returns a func that restores it: a test can so
// tell a task taken by the scout, or on the bulk lane's short polls,
// from one taken when a long pull ended.
func SetLongPoll(d time.Duration) func() {
	old := longPoll
	longPoll = d
	return func() { longPoll = old }
}

// SetBulkRecheck sets how long a look that found the bulk lane empty
// stands for a worker that ended a task alone on the normal lane, and
// returns a func that restores it.
func SetBulkRecheck(d time.Duration) func() {
	old := bulkRecheck
	bulkRecheck = d
	return func() { bulkRecheck = old }
}
