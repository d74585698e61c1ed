// Package agentconntest provides a fake agent port for tests of the
// transport and of everything above it.
package agentconntest

import (
	"io"
	"net"
	"sync"
	"time"
)

// Port emulates the guest end of a virtio-serial port wired to a QEMU
// chardev socket: reads return EOF (0 bytes) while no host is connected,
// a host connects with Connect, and Swap replaces the host without the agent
// seeing EOF, as after a VM restore where a new host sends its HELLO onto
// the stream the agent still believes is its old session.
type Port struct {
	mu       sync.Mutex
	cur      net.Conn // agent's end of the current host connection
	gen      int
	closed   bool
	stale    []byte
	staleEOF bool
}

// StaleEOF makes the agent's next read return EOF once, although a host is
// connected: virtio-serial can deliver the "host closed" notice of an
// earlier host after the new host's first bytes, when a guest is slow to
// run (TCG, many guests on few cores).
func (p *Port) StaleEOF() {
	p.mu.Lock()
	p.staleEOF = true
	cur := p.cur
	p.mu.Unlock()
	if cur != nil {
		_ = cur.SetReadDeadline(time.Unix(1, 0)) // wake a blocked read
	}
}

// takeStaleEOF reports (once) a pending StaleEOF, clearing the deadline
// that woke the reader.
func (p *Port) takeStaleEOF(cur net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.staleEOF {
		return false
	}
	p.staleEOF = false
	if cur != nil {
		_ = cur.SetReadDeadline(time.Time{})
	}
	return true
}

// SetStale makes the agent's next write to the host be preceded by b, in
// the same write, as leftover bytes in the agent -> host direction.
func (p *Port) SetStale(b []byte) {
	p.mu.Lock()
	p.stale = b
	p.mu.Unlock()
}

// Read reads what the current host sent; with no host connected it returns
// 0, io.EOF at once, as virtio-serial does.
func (p *Port) Read(b []byte) (int, error) {
	for {
		p.mu.Lock()
		cur, gen, closed := p.cur, p.gen, p.closed
		p.mu.Unlock()
		if closed {
			return 0, io.ErrClosedPipe
		}
		if cur == nil {
			return 0, io.EOF
		}
		if p.takeStaleEOF(cur) {
			return 0, io.EOF
		}
		n, err := cur.Read(b)
		if n > 0 {
			return n, nil
		}
		if p.takeStaleEOF(cur) {
			return 0, io.EOF
		}
		p.mu.Lock()
		if p.gen != gen || p.closed {
			p.mu.Unlock()
			continue // swapped (or closed): not an EOF the agent may see
		}
		if p.cur == cur {
			p.cur = nil
		}
		p.mu.Unlock()
		_ = err
		return 0, io.EOF
	}
}

// Write sends to the current host; with none connected the bytes are lost.
func (p *Port) Write(b []byte) (int, error) {
	p.mu.Lock()
	cur := p.cur
	stale := p.stale
	p.stale = nil
	p.mu.Unlock()
	if cur == nil {
		return len(b), nil // nobody listening: bytes are lost
	}
	if stale != nil {
		b = append(stale, b...)
		n, err := cur.Write(b)
		return max(0, n-len(stale)), err
	}
	return cur.Write(b)
}

// Connect attaches a new host and returns its end of the connection. An
// earlier host is disconnected (the agent sees EOF).
func (p *Port) Connect() net.Conn {
	agent, host := net.Pipe()
	p.mu.Lock()
	old := p.cur
	p.cur = agent
	p.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return host
}

// Swap attaches a new host without the agent seeing EOF.
func (p *Port) Swap() net.Conn {
	agent, host := net.Pipe()
	p.mu.Lock()
	old := p.cur
	p.cur = agent
	p.gen++
	p.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return host
}

// Close closes the port: the agent's reads fail with io.ErrClosedPipe.
func (p *Port) Close() error {
	p.mu.Lock()
	p.closed = true
	cur := p.cur
	p.gen++
	p.mu.Unlock()
	if cur != nil {
		cur.Close()
	}
	return nil
}
