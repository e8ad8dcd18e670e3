package devstack

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
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
func ReadConn(dir string) (Conn, error) {
	var c Conn
	b, err := os.ReadFile(filepath.Join(dir, ConnFile))
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%s: %w", filepath.Join(dir, ConnFile), err)
	}
	return c, nil
}
