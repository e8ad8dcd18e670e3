package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MsgQuery says which stored message LeaderGet returns: the one at Seq,
// the first on NextBySubject from Seq, or the last on LastBySubject.
// Subjects may hold wildcards.
type MsgQuery struct {
	Seq           uint64 `json:"seq,omitempty"`
	NextBySubject string `json:"next_by_subj,omitempty"`
	LastBySubject string `json:"last_by_subj,omitempty"`
	// StartTime, with NextBySubject: the first message stored at or after it.
	StartTime *time.Time `json:"start_time,omitempty"`
}

// LeaderGet gets one stored message from the stream's leader.
//
// Streams whose histories are read in batches allow direct gets
// (docs/adr/0006), and nats.go's Stream.GetMsg and GetLastMsgForSubject
// then ask any replica, which may not have stored the latest messages
// yet. A decision that must see every message stored so far (is this
// execution's last event the one I expect, before purging it; was my
// append stored) asks the leader with this instead: the leader has
// stored everything acknowledged. A missing message is
// jetstream.ErrMsgNotFound; a stream without a leader answers a
// *jetstream.APIError with code 503, or no one answers: both are
// Transient.
func LeaderGet(ctx context.Context, js jetstream.JetStream, stream string, q MsgQuery) (*jetstream.RawStreamMsg, error) {
	body, err := json.Marshal(q)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, ServiceRequestTimeout)
		defer cancel()
	}
	reply, err := js.Conn().RequestWithContext(ctx, APISubject(js, "STREAM.MSG.GET."+stream), body)
	if err != nil {
		return nil, fmt.Errorf("get message of %s: %w", stream, err)
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Subject string    `json:"subject"`
			Seq     uint64    `json:"seq"`
			Header  []byte    `json:"hdrs"`
			Data    []byte    `json:"data"`
			Time    time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, fmt.Errorf("get message of %s: malformed answer: %w", stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return nil, fmt.Errorf("get message of %s: %w", stream, resp.Error)
	case resp.Message == nil:
		return nil, fmt.Errorf("get message of %s: %w", stream, &jetstream.APIError{Code: http.StatusServiceUnavailable, Description: "empty answer"})
	}
	m := &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Seq, Data: resp.Message.Data, Time: resp.Message.Time}
	if len(resp.Message.Header) > 0 {
		if m.Header, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return nil, fmt.Errorf("get message of %s: headers of seq %d: %w", stream, m.Sequence, err)
		}
	}
	return m, nil
}

// APISubject is the JetStream API subject of op ("STREAM.MSG.GET.JF_EVENTS")
// for js, with its API prefix or domain.
func APISubject(js jetstream.JetStream, op string) string {
	o := js.Options()
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "." + op
	case o.Domain != "":
		return "$JS." + o.Domain + ".API." + op
	}
	return jetstream.DefaultAPIPrefix + op
}

// LeaderKVGet reads key of bucket from the leader of the bucket's stream:
// the value a put acknowledged before it, and its revision (for an
// update), where kv.Get may ask a replica that has not stored it yet
// (buckets allow direct gets). A key never put, or deleted or purged
// last, is jetstream.ErrKeyNotFound.
func LeaderKVGet(ctx context.Context, js jetstream.JetStream, bucket, key string) ([]byte, uint64, error) {
	m, err := LeaderGet(ctx, js, BucketStream(bucket), MsgQuery{LastBySubject: "$KV." + bucket + "." + key})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, 0, jetstream.ErrKeyNotFound
	}
	if err != nil {
		return nil, 0, err
	}
	if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return nil, 0, jetstream.ErrKeyNotFound
	}
	return m.Data, m.Sequence, nil
}
