package pysession

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// collector reads one output pipe of the runner (fd 1 or fd 2), splits it at
// request markers and keeps what belongs to the request in flight.
type collector struct {
	prefix []byte // "\x1eFORKD:<token>:"
	max    int    // bytes kept per request; the rest is counted, not kept

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced on every marker and at EOF
	pending  []byte        // not yet scanned (may hold the start of a marker)
	out      []byte        // attributed to the current (or next) request
	dropped  int           // bytes beyond max
	lastMark int64         // id of the last marker seen
	eof      bool
	tail     []byte // last tailSize bytes seen, for diagnostics
	// hold > 0 (while a streamed request runs): the reader stops reading
	// while out holds that much, until a consumer takes it, so a slow
	// consumer slows the code down (a full pipe) instead of losing output.
	hold int
}

const tailSize = 4 << 10

func newCollector(token string, max int) *collector {
	return &collector{
		prefix:   []byte("\x1eFORKD:" + token + ":"),
		max:      max,
		changed:  make(chan struct{}),
		lastMark: -1,
	}
}

// run reads r until EOF.
func (c *collector) run(r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			c.mu.Lock()
			c.pending = append(c.pending, buf[:n]...)
			c.scan()
			c.notify() // a streamed request's consumer waits for output
			for c.hold > 0 && len(c.out) >= c.hold {
				ch := c.changed
				c.mu.Unlock()
				<-ch // take or setHold
				c.mu.Lock()
			}
			c.mu.Unlock()
		}
		if err != nil {
			c.mu.Lock()
			c.emit(c.pending)
			c.pending = nil
			c.eof = true
			c.notify()
			c.mu.Unlock()
			return
		}
	}
}

// maxMarkerID bounds the digits after the prefix, so a stray prefix in user
// output is released instead of held back forever.
const maxMarkerID = 20

// scan moves pending bytes to out, consuming markers. Called with mu held.
func (c *collector) scan() {
	for {
		i := bytes.Index(c.pending, c.prefix)
		if i < 0 {
			keep := partialSuffix(c.pending, c.prefix)
			c.emit(c.pending[:len(c.pending)-keep])
			c.pending = append(c.pending[:0], c.pending[len(c.pending)-keep:]...)
			return
		}
		c.emit(c.pending[:i])
		rest := c.pending[i+len(c.prefix):]
		j := bytes.IndexByte(rest, '\x1e')
		if j < 0 && len(rest) <= maxMarkerID {
			c.pending = append(c.pending[:0], c.pending[i:]...)
			return // the rest of the marker is still to come
		}
		id, err := strconv.ParseInt(string(rest[:max(j, 0)]), 10, 64)
		if j < 0 || err != nil {
			// Not a marker after all: pass the prefix's first byte on.
			c.emit(c.pending[i : i+1])
			c.pending = c.pending[i+1:]
			continue
		}
		c.lastMark = id
		c.notify()
		c.pending = rest[j+1:]
	}
}

func (c *collector) emit(b []byte) {
	if len(b) == 0 {
		return
	}
	c.tail = append(c.tail, b...)
	if len(c.tail) > tailSize {
		c.tail = append(c.tail[:0], c.tail[len(c.tail)-tailSize:]...)
	}
	room := c.max - len(c.out)
	if room < len(b) {
		c.dropped += len(b) - max(room, 0)
		b = b[:max(room, 0)]
	}
	c.out = append(c.out, b...)
}

func (c *collector) notify() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// waitMark waits until the marker of request id (or EOF) has been read, or
// until the deadline. It reports whether it got there.
func (c *collector) waitMark(id int64, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for {
		c.mu.Lock()
		done := c.lastMark >= id || c.eof
		ch := c.changed
		c.mu.Unlock()
		if done {
			return true
		}
		select {
		case <-ch:
		case <-t.C:
			return false
		}
	}
}

// take returns and clears the output collected so far. With whole false
// it keeps back an incomplete UTF-8 character at the end (its other bytes
// are still to come), so that a streamed chunk never splits one.
func (c *collector) take(whole bool) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.out)
	if !whole && c.dropped == 0 {
		n -= partialRune(c.out)
	}
	s := string(c.out[:n])
	if c.dropped > 0 {
		s += fmt.Sprintf("\n[forkd: %d more bytes of output dropped]\n", c.dropped)
	}
	c.out, c.dropped = append(c.out[:0:0], c.out[n:]...), 0
	c.notify() // wakes a reader waiting for room (hold)
	return s
}

// avail returns how many bytes take(false) would return now, and a channel
// closed when that may have changed.
func (c *collector) avail() (int, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := len(c.out)
	if c.dropped == 0 {
		n -= partialRune(c.out)
	} else {
		n++ // the note is due
	}
	return n, c.changed
}

// setHold sets the read-ahead bound of a streamed request (0: none).
func (c *collector) setHold(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hold = n
	c.notify()
}

// partialRune returns the length of the incomplete (but so far valid)
// UTF-8 encoding at the end of b; 0 if b ends with a whole character or
// with bytes that can never become one.
func partialRune(b []byte) int {
	for k := 1; k <= utf8.UTFMax-1 && k <= len(b); k++ {
		if utf8.RuneStart(b[len(b)-k]) {
			if utf8.FullRune(b[len(b)-k:]) {
				return 0
			}
			return k
		}
	}
	return 0
}

// lastBytes returns the tail of everything seen, for error messages.
func (c *collector) lastBytes() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return string(c.tail)
}

// partialSuffix returns the length of the longest suffix of buf that is a
// proper prefix of prefix.
func partialSuffix(buf, prefix []byte) int {
	for k := min(len(buf), len(prefix)-1); k > 0; k-- {
		if bytes.HasSuffix(buf, prefix[:k]) {
			return k
		}
	}
	return 0
}
