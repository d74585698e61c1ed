package mcp

import (
	"bytes"
	"errors"
	"strings"
)

// capBuffer keeps the first and the last max/2 bytes written to it and
// notes that the middle was cut: for command output, the start says what
// ran and the end usually says how it failed.
type capBuffer struct {
	head, tail []byte
	half       int
	truncated  bool
}

func newCapBuffer(max int) *capBuffer { return &capBuffer{half: max / 2} }

func (b *capBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if room := b.half - len(b.head); room > 0 {
		k := min(room, len(p))
		b.head = append(b.head, p[:k]...)
		p = p[k:]
	}
	if len(p) == 0 {
		return n, nil
	}
	b.tail = append(b.tail, p...)
	if over := len(b.tail) - b.half; over > 0 {
		b.truncated = true
		b.tail = append(b.tail[:0], b.tail[over:]...)
	}
	return n, nil
}

// String is the kept output as valid UTF-8 (invalid bytes, including a
// character split at a cut, become U+FFFD), with a marker where the middle
// was cut.
func (b *capBuffer) String() string {
	if !b.truncated {
		return strings.ToValidUTF8(string(b.head)+string(b.tail), "\uFFFD")
	}
	return strings.ToValidUTF8(string(b.head), "\uFFFD") + "\n[… output cut …]\n" + strings.ToValidUTF8(string(b.tail), "\uFFFD")
}

// errLimit stops a copy into a full limitBuffer.
var errLimit = errors.New("read limit reached")

// limitBuffer keeps the first max bytes written and then fails the write,
// which stops the transfer (the file is not read to its end).
type limitBuffer struct {
	bytes.Buffer
	max       int
	truncated bool
}

func (b *limitBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.Len(); len(p) > room {
		b.Buffer.Write(p[:max(room, 0)])
		b.truncated = true
		return max(room, 0), errLimit
	}
	return b.Buffer.Write(p)
}
