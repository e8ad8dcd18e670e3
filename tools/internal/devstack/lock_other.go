//go:build !unix

package devstack

import "os"

// lockFile does nothing where flock(2) does not exist: two jetflow dev on
// one data directory are not detected there.
func lockFile(*os.File) error { return nil }
