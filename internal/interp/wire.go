package interp

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// The Jupyter messaging protocol, wire format version 5.3
// (https://jupyter-client.readthedocs.io/en/stable/messaging.html#the-wire-protocol):
// a multipart ZeroMQ message of routing identities, the delimiter, an
// HMAC-SHA256 signature (hex) over the four JSON parts that follow, header,
// parent header, metadata, content, and optional binary buffers.

const protocolVersion = "5.3"

var delimiter = []byte("<IDS|MSG>")

// header is a message header (and the parent header of replies).
type header struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

// message is one decoded Jupyter message. Content stays raw: each consumer
// decodes the fields of the message types it handles.
type message struct {
	Header       header
	ParentHeader header
	Metadata     json.RawMessage
	Content      json.RawMessage
}

// signer signs and verifies messages with a kernel's connection key. An
// empty key disables signing, as the protocol allows.
type signer struct{ key []byte }

func (s signer) sign(parts ...[]byte) []byte {
	if len(s.key) == 0 {
		return nil
	}
	mac := hmac.New(sha256.New, s.key)
	for _, p := range parts {
		mac.Write(p)
	}
	sum := mac.Sum(nil)
	out := make([]byte, hex.EncodedLen(len(sum)))
	hex.Encode(out, sum)
	return out
}

// encode returns the frames of a new message of msgType with content,
// from session.
func (s signer) encode(session, msgType, msgID string, content any) ([][]byte, error) {
	h, err := json.Marshal(header{
		MsgID: msgID, Session: session, Username: "cube", MsgType: msgType, Version: protocolVersion,
		Date: time.Now().UTC().Format(time.RFC3339Nano),
	})
	if err != nil {
		return nil, err
	}
	c, err := json.Marshal(content)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", msgType, err)
	}
	parent, meta := []byte("{}"), []byte("{}")
	return [][]byte{delimiter, s.sign(h, parent, meta, c), h, parent, meta, c}, nil
}

var errBadSignature = errors.New("jupyter message: bad signature")

// decode parses the frames of a received message (routing identities or a
// pub/sub topic before the delimiter are skipped) and checks its signature.
func (s signer) decode(frames [][]byte) (message, error) {
	i := 0
	for i < len(frames) && !bytes.Equal(frames[i], delimiter) {
		i++
	}
	if len(frames)-i < 6 {
		return message{}, fmt.Errorf("jupyter message: %d frames, no delimiter or parts missing", len(frames))
	}
	sig, parts := frames[i+1], frames[i+2:i+6]
	if len(s.key) > 0 && !hmac.Equal(sig, s.sign(parts...)) {
		return message{}, errBadSignature
	}
	var m message
	if err := json.Unmarshal(parts[0], &m.Header); err != nil {
		return message{}, fmt.Errorf("jupyter message header: %w", err)
	}
	if err := json.Unmarshal(parts[1], &m.ParentHeader); err != nil {
		return message{}, fmt.Errorf("jupyter message parent header: %w", err)
	}
	m.Metadata, m.Content = parts[2], parts[3]
	return m, nil
}

// newID returns a random 128-bit id in UUID form (Jupyter msg ids, context
// and session ids).
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
