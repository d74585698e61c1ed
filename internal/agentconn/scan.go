package agentconn

import "bytes"

// maxHandshakeLine bounds a HELLO or READY line. Both are small JSON
// objects; the bound only stops a runaway line from growing the buffer.
const maxHandshakeLine = 64 << 10

// scanLine looks in buf for a line that starts with prefix. A match does
// not have to be at the start of a line: stale yamux frames carry no
// newlines, so a HELLO may directly follow binary bytes.
//
// When a whole line is present it returns the text after the prefix
// (without the newline or a trailing CR), ok=true, and consumed = the bytes
// up to and including the newline. Otherwise ok=false and consumed is how
// many leading bytes are garbage and may be dropped; the rest (a line that
// has begun, or a partial prefix at the end) must be kept for the next read.
func scanLine(buf []byte, prefix string) (line []byte, consumed int, ok bool) {
	start := 0
	for {
		i := bytes.Index(buf[start:], []byte(prefix))
		if i < 0 {
			return nil, len(buf) - partialSuffix(buf[start:], prefix), false
		}
		i += start
		body := buf[i+len(prefix):]
		j := bytes.IndexByte(body, '\n')
		if j < 0 {
			if len(buf)-i > maxHandshakeLine {
				// Not a real handshake line: skip this prefix occurrence.
				start = i + 1
				continue
			}
			return nil, i, false
		}
		return bytes.TrimSuffix(body[:j], []byte("\r")), i + len(prefix) + j + 1, true
	}
}

// partialSuffix returns the length of the longest suffix of buf that is a
// proper prefix of prefix (the start of a prefix split across two reads).
func partialSuffix(buf []byte, prefix string) int {
	for k := min(len(buf), len(prefix)-1); k > 0; k-- {
		if bytes.HasSuffix(buf, []byte(prefix[:k])) {
			return k
		}
	}
	return 0
}
