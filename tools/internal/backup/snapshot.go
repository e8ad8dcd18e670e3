package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// The JetStream snapshot and restore API, spoken directly (nats.go has no
// client for it). The layout of a stream's directory is the one `nats
// stream backup` writes (github.com/nats-io/jsm.go), so one stream of a
// jetflow backup can also be restored with `nats stream restore`.
const (
	// DataFile is the snapshot as the server sent it (an s2-compressed
	// archive of the stream's store, and its consumers' when asked).
	DataFile = "stream.arc.s2"
	// MetaFile holds the stream's configuration and state at the snapshot:
	// the body of the restore request.
	MetaFile = "backup.json"

	apiSnapshot = "$JS.API.STREAM.SNAPSHOT."
	apiRestore  = "$JS.API.STREAM.RESTORE."
	// chunkSize is what the server sends per message while snapshotting,
	// and what restore sends (below the default 1 MiB max payload).
	chunkSize = 128 * 1024
	// errRestoreFailed is the API's error code for a restore the server
	// could not finish ("restore failed: …").
	errRestoreFailed = 10062
)

// streamState is the part of a stream's state a backup records.
type streamState struct {
	Messages  uint64 `json:"messages"`
	Bytes     uint64 `json:"bytes"`
	FirstSeq  uint64 `json:"first_seq"`
	LastSeq   uint64 `json:"last_seq"`
	Consumers int    `json:"consumer_count"`
}

// apiError is the error member of a JetStream API answer.
type apiError struct {
	Code        int    `json:"code"`
	ErrCode     int    `json:"err_code"`
	Description string `json:"description"`
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%s (code %d, error %d)", e.Description, e.Code, e.ErrCode)
}

// request sends a JetStream API request and decodes its answer into out,
// returning the API's error if it answered one.
func request(ctx context.Context, nc *nats.Conn, subj string, req, out any) error {
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	m, err := nc.RequestWithContext(ctx, subj, b)
	if err != nil {
		return fmt.Errorf("%s: %w", subj, err)
	}
	var e struct {
		Error *apiError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &e); err != nil {
		return fmt.Errorf("%s: answer %q: %w", subj, m.Data, err)
	}
	if e.Error != nil {
		return fmt.Errorf("%s: %w", subj, e.Error)
	}
	return json.Unmarshal(m.Data, out)
}

// snapshotted is what snapshotStream took.
type snapshotted struct {
	Config json.RawMessage
	State  streamState
	Bytes  int64 // of the data file
}

// snapshotStream writes a snapshot of stream into dir (created; it must
// not hold one already): the data the server sends, acknowledged chunk by
// chunk (the server sends a window ahead), then the configuration and
// state the server answered, which it took when the snapshot began.
func snapshotStream(ctx context.Context, nc *nats.Conn, stream, dir string, consumers bool) (snapshotted, error) {
	var out snapshotted
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return out, err
	}
	f, err := os.OpenFile(filepath.Join(dir, DataFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return out, err
	}
	defer f.Close()

	inbox := nc.NewRespInbox()
	done := make(chan error, 1)
	finish := func(err error) {
		select {
		case done <- err:
		default:
		}
	}
	var written int64
	// One subscription, in the order the server sends: chunks (each but
	// the last with a reply to acknowledge it), then an empty message whose
	// status says how it ended.
	sub, err := nc.Subscribe(inbox, func(m *nats.Msg) {
		if len(m.Data) == 0 {
			status := m.Header.Get("Status")
			if status != "" && status != "204" {
				finish(fmt.Errorf("snapshot of %s: the server stopped it: %s %s", stream, status, m.Header.Get("Description")))
				return
			}
			finish(nil)
			return
		}
		if m.Reply != "" {
			_ = m.Respond(nil) // flow control: the server waits for these
		}
		n, err := f.Write(m.Data)
		written += int64(n)
		if err != nil {
			finish(fmt.Errorf("snapshot of %s: write: %w", stream, err))
		}
	})
	if err != nil {
		return out, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return out, err
	}
	var resp struct {
		Config json.RawMessage `json:"config"`
		State  streamState     `json:"state"`
	}
	req := map[string]any{"deliver_subject": inbox, "no_consumers": !consumers, "chunk_size": chunkSize}
	if err := request(ctx, nc, apiSnapshot+stream, req, &resp); err != nil {
		return out, fmt.Errorf("snapshot of %s: %w", stream, err)
	}
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		return out, err
	}
	if err := sub.Unsubscribe(); err != nil {
		return out, err
	}
	if err := f.Sync(); err != nil {
		return out, err
	}
	if err := f.Close(); err != nil {
		return out, err
	}
	meta, err := json.MarshalIndent(map[string]any{"config": resp.Config, "state": resp.State}, "", "  ")
	if err != nil {
		return out, err
	}
	if err := writeFileSync(filepath.Join(dir, MetaFile), meta); err != nil {
		return out, err
	}
	return snapshotted{Config: resp.Config, State: resp.State, Bytes: written}, nil
}

// restoreStream creates stream from the snapshot in dir: the server
// takes the configuration and state, then the data chunk by chunk, and
// answers the stream's state once it has rebuilt it. The stream must not
// exist.
func restoreStream(ctx context.Context, nc *nats.Conn, stream, dir string) (streamState, error) {
	var st streamState
	meta, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if err != nil {
		return st, err
	}
	var req struct {
		Config json.RawMessage `json:"config"`
		State  json.RawMessage `json:"state"`
	}
	if err := json.Unmarshal(meta, &req); err != nil {
		return st, fmt.Errorf("%s: %w", filepath.Join(dir, MetaFile), err)
	}
	var name struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(req.Config, &name); err != nil || name.Name != stream {
		return st, fmt.Errorf("%s: the snapshot is of stream %q, not %s", filepath.Join(dir, MetaFile), name.Name, stream)
	}
	f, err := os.Open(filepath.Join(dir, DataFile))
	if err != nil {
		return st, err
	}
	defer f.Close()
	var resp struct {
		DeliverSubject string `json:"deliver_subject"`
	}
	if err := request(ctx, nc, apiRestore+stream, req, &resp); err != nil {
		return st, fmt.Errorf("restore of %s: %w", stream, err)
	}
	chunk := make([]byte, min(chunkSize, int(nc.MaxPayload())))
	for {
		n, err := io.ReadFull(f, chunk)
		if n > 0 {
			if err := sendChunk(ctx, nc, resp.DeliverSubject, chunk[:n]); err != nil {
				return st, fmt.Errorf("restore of %s: %w", stream, err)
			}
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return st, fmt.Errorf("restore of %s: read %s: %w", stream, f.Name(), err)
		}
	}
	// The end: an empty message. The server rebuilds the stream (which
	// can take a while for a big one) and answers as to a stream create.
	endCtx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	m, err := nc.RequestWithContext(endCtx, resp.DeliverSubject, nil)
	if err != nil {
		return st, fmt.Errorf("restore of %s: %w", stream, err)
	}
	var created struct {
		Error *apiError   `json:"error"`
		State streamState `json:"state"`
	}
	if err := json.Unmarshal(m.Data, &created); err != nil {
		return st, fmt.Errorf("restore of %s: answer %q: %w", stream, m.Data, err)
	}
	if created.Error != nil {
		return st, fmt.Errorf("restore of %s: %w", stream, created.Error)
	}
	return created.State, nil
}

// sendChunk sends one chunk of a restore and waits for the server to take it.
func sendChunk(ctx context.Context, nc *nats.Conn, subj string, b []byte) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, subj, b)
	if err != nil {
		return err
	}
	if len(m.Data) > 0 { // an error answer; taken chunks are answered empty
		var e struct {
			Error *apiError `json:"error"`
		}
		if json.Unmarshal(m.Data, &e) == nil && e.Error != nil {
			return e.Error
		}
		if s := strings.TrimSpace(string(m.Data)); s != "" {
			return errors.New(s)
		}
	}
	return nil
}

// writeFileSync writes b to path and syncs it (a backup must be on disk
// when the command says it is done).
func writeFileSync(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
