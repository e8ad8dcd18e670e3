package devstack

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// PIDFile is the name of the file, in the data directory, that holds the
// process id of the jetflow dev that uses the directory. It is locked while
// that process runs, so that a second one on the same directory refuses to
// start instead of sharing the JetStream store.
const PIDFile = "jetflow.pid"

// ErrDataDirInUse is returned when another process runs on the data directory.
var ErrDataDirInUse = errors.New("devstack: data directory in use")

// claimDataDir takes the data directory for this process: it locks the
// PID file and writes this process's id into it. release unlocks and
// removes it. A process killed without release leaves the file, but the
// lock goes with the process: the next start takes the directory over.
func claimDataDir(dir string) (release func(), err error) {
	path := filepath.Join(dir, PIDFile)
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("data directory %s: %w", dir, err)
		}
		if err := lockFile(f); err != nil {
			other, _ := os.ReadFile(path)
			f.Close()
			pid := string(bytes.TrimSpace(other))
			if _, perr := strconv.Atoi(pid); perr != nil {
				pid = "unknown"
			}
			return nil, &inUseError{dir: dir, pid: pid, path: path}
		}
		// The process that held the lock may have removed the file
		// between our open and our lock: then the lock is on a file
		// nobody sees, and we start over with the one at path.
		if held, err := f.Stat(); err == nil {
			if now, err := os.Stat(path); err != nil || !os.SameFile(held, now) {
				f.Close()
				continue
			}
		}
		err = f.Truncate(0)
		if err == nil {
			_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("write %s: %w", path, err)
		}
		return func() {
			_ = os.Remove(path) // before unlocking: a successor's new file is never removed
			f.Close()
		}, nil
	}
}

type inUseError struct{ dir, pid, path string }

func (e *inUseError) Error() string {
	return fmt.Sprintf("data directory %s is used by another jetflow dev (process %s, see %s): stop it, or give this one another --data",
		e.dir, e.pid, e.path)
}

func (e *inUseError) Is(target error) bool { return target == ErrDataDirInUse }
