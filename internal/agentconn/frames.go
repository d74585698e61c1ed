package agentconn

import "encoding/binary"

// yamux v0 frame header layout (github.com/hashicorp/yamux spec.md):
//
//	version(1) type(1) flags(2) stream id(4) length(4), big endian.
//
// For data frames the length is the payload that follows; for window
// updates, pings and go-aways it is a value and no payload follows.
const (
	yamuxHeaderLen = 12

	yamuxTypeData         = 0
	yamuxTypeWindowUpdate = 1
	yamuxTypePing         = 2
	yamuxTypeGoAway       = 3

	yamuxFlagsMask = 0x000f // SYN | ACK | FIN | RST
)

// frameTracker follows the frame boundaries of the host -> agent yamux
// stream, so the agent knows exactly where a frame ends and can tell a frame
// header from anything else (a HELLO from a new host, stale bytes).
type frameTracker struct {
	// maxData is the largest data payload the peer may send in one frame:
	// the agent's stream window, which bounds every data frame.
	maxData uint32
	// payloadLeft is how many payload bytes of the current data frame are
	// still to come; 0 at a frame boundary.
	payloadLeft uint32
}

// advance looks at buf, the bytes not yet forwarded to yamux, and returns how
// many leading bytes are well-formed yamux (whole headers and payload bytes)
// and can be forwarded now. bad is true when buf[n:] starts with bytes that
// cannot be a yamux header; the caller then stops feeding the session. A
// header that is incomplete but valid so far is left in buf[n:] (bad=false)
// until more bytes arrive.
func (t *frameTracker) advance(buf []byte) (n int, bad bool) {
	for n < len(buf) {
		if t.payloadLeft > 0 {
			k := min(uint64(t.payloadLeft), uint64(len(buf)-n))
			n += int(k)
			t.payloadLeft -= uint32(k)
			continue
		}
		h := buf[n:]
		if !t.headerPrefixValid(h) {
			return n, true
		}
		if len(h) < yamuxHeaderLen {
			return n, false
		}
		if h[1] == yamuxTypeData {
			t.payloadLeft = binary.BigEndian.Uint32(h[8:12])
		}
		n += yamuxHeaderLen
	}
	return n, false
}

// headerPrefixValid reports whether h (possibly shorter than a header) can
// be the start of a header the host's yamux client sends. It checks as much
// as len(h) allows, so garbage is recognised from its first byte when
// possible.
func (t *frameTracker) headerPrefixValid(h []byte) bool {
	if len(h) >= 1 && h[0] != 0 { // protocol version
		return false
	}
	if len(h) < 2 {
		return true
	}
	typ := h[1]
	if typ > yamuxTypeGoAway {
		return false
	}
	if len(h) < 4 {
		return true
	}
	if binary.BigEndian.Uint16(h[2:4])&^yamuxFlagsMask != 0 {
		return false
	}
	if len(h) < 8 {
		return true
	}
	id := binary.BigEndian.Uint32(h[4:8])
	switch typ {
	case yamuxTypeData, yamuxTypeWindowUpdate:
		if id == 0 {
			return false
		}
	default: // ping and go-away are session-level
		if id != 0 {
			return false
		}
	}
	if len(h) < yamuxHeaderLen {
		return true
	}
	length := binary.BigEndian.Uint32(h[8:12])
	switch typ {
	case yamuxTypeData:
		return length <= t.maxData
	case yamuxTypeGoAway:
		return length <= 2 // normal, protocol error, internal error
	}
	return true
}
