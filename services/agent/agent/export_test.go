package agent

import "time"

// FollowKillNotice makes the agent follow the kill notice of execID at
// stream sequence seq, as its watcher does when it reads one: a test can
// so hold the agent's view of the notices behind the stream.
func (a *Agent) FollowKillNotice(execID string, seq uint64) { a.kills.kill(execID, seq, time.Now()) }
