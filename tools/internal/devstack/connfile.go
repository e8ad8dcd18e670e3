package devstack

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ConnFile is the name of the file, in the data directory, where a running
// jetflow dev says where it can be reached. The jetflow CLI reads it when
// neither --api nor JETFLOW_API says where the api is, so that the CLI run
// beside `jetflow dev` finds it whatever its ports; `jetflow env` prints it
// as environment variables (NATS_URL serves the nats CLI too).
const ConnFile = "client.json"

// Conn says where a running stack is.
type Conn struct {
	// API is the api's base URL.
	API string `json:"api"`
	// NATS is the NATS URL clients connect to.
	NATS string `json:"nats"`
	// PID is the jetflow dev process.
	PID int `json:"pid"`
	// ClientCreds is the client role's creds file and ClientInbox the
	// inbox prefix its permissions require ("" on an insecure stack).
	ClientCreds string `json:"client_creds,omitempty"`
	ClientInbox string `json:"client_inbox,omitempty"`
	// AdminCreds is the admin role's creds file ("" on an insecure
	// stack): jetflow admin backup and restore use it.
	AdminCreds string `json:"admin_creds,omitempty"`
	// TokenFile is the api's admin token file ("" when the api runs
	// without authentication): the CLI run beside jetflow dev uses it.
	TokenFile string `json:"token_file,omitempty"`
}

// writeConn writes c into dir atomically (a reader never sees half of it).
func writeConn(dir string, c Conn) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ConnFile+".*")
	if err != nil {
		return fmt.Errorf("write %s: %w", ConnFile, err)
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", ConnFile, err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", ConnFile, err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, ConnFile)); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", ConnFile, err)
	}
	return nil
}

// ReadConn reads the connection file of the jetflow dev running on dir.
// The error wraps os.ErrNotExist when there is none.
//
// The files it names (the token, the creds) are kept only when they are
// inside dir, symbolic links resolved, as jetflow dev writes them: a
// connection file of another's making (a .jetflow that came with a
// cloned repository) could otherwise name any file of the user's, whose
// first line the CLI would send to the api it names.
func ReadConn(dir string) (Conn, error) {
	var c Conn
	b, err := os.ReadFile(filepath.Join(dir, ConnFile))
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%s: %w", filepath.Join(dir, ConnFile), err)
	}
	for _, p := range []*string{&c.TokenFile, &c.ClientCreds, &c.AdminCreds} {
		if *p != "" && !within(dir, *p) {
			*p = ""
		}
	}
	return c, nil
}

// within reports whether path is inside dir once both are absolute and
// their symbolic links resolved (false if either cannot be).
func within(dir, path string) bool {
	resolve := func(p string) (string, error) {
		r, err := filepath.EvalSymlinks(p)
		if err != nil {
			return "", err
		}
		return filepath.Abs(r)
	}
	d, err := resolve(dir)
	if err != nil {
		return false
	}
	p, err := resolve(path)
	if err != nil {
		return false
	}
	rel, err := filepath.Rel(d, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}
