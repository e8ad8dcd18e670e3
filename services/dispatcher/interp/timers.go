package interp

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// timerID is the id of an execution's timer for a purpose, step and
// attempt. It is deterministic, so arming the same timer again (after a
// crash) replaces the same JetStream schedule instead of adding one.
func timerID(execID, purpose, stepID string, attempt int) string {
	h := sha256.Sum256([]byte(execID + "\x00" + purpose + "\x00" + stepID + "\x00" + strconv.Itoa(attempt)))
	return "t" + hex.EncodeToString(h[:12])
}
