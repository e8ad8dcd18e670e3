package backup

import (
	"errors"
	"fmt"
	"testing"
)

// TestStorageDirGone: the answer CI saw when a restore with replace
// deleted the account's last streams and then restored its first one
// while the server removed the emptied directories, and answers that
// must not be retried.
func TestStorageDirGone(t *testing.T) {
	raced := &apiError{Code: 500, ErrCode: errRestoreFailed, Description: "restore failed: error adding stream: could not create storage directory - " +
		"mkdir /tmp/x/003/jetstream/$G/streams: no such file or directory (10077)"}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("restore of JF_COMMANDS: %w", raced), true},
		{raced, true},
		{&apiError{Code: 500, ErrCode: errRestoreFailed, Description: "restore failed: error adding stream: could not create storage directory - mkdir /d: permission denied"}, false},
		{&apiError{Code: 500, ErrCode: errRestoreFailed, Description: "restore failed: unexpected EOF"}, false},
		{&apiError{Code: 400, ErrCode: 10058, Description: "stream name already in use"}, false},
		{errors.New("could not create storage directory: no such file or directory"), false},
		{nil, false},
	} {
		if got := storageDirGone(c.err); got != c.want {
			t.Errorf("storageDirGone(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
