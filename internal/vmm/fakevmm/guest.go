package fakevmm

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// The fake guest: testguest's line protocol (internal/testutil/testguest)
// on the agent channel, with the value "set" stores kept in guest memory:
// a little-endian uint32 length at valueOff, the bytes after it.
const (
	valueOff = pageSize // page 1: page 0 stays untouched
	valueMax = 1024
	// maxLine bounds one line from the host; a longer one is answered
	// with an error and skipped.
	maxLine = 4096
	// lineQueue is how many lines wait while the guest does not run, as
	// in a serial port's buffer; beyond it the host's writes block.
	lineQueue = 16
)

// hostLine is one line from the host, or a line that was too long.
type hostLine struct {
	text    string
	tooLong bool
}

// dialAgent opens the agent channel. A new connection supersedes the
// previous one (closed), as a VMM's agent socket serves one client.
func (v *vm) dialAgent() (net.Conn, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.state == stateExited {
		return nil, fmt.Errorf("fakevmm %s: dial agent: the machine has exited: %w", v.cfg.ID, errdefs.ErrUnavailable)
	}
	if v.agent != nil {
		v.agent.Close()
	}
	host, guest := net.Pipe()
	v.agent = guest
	go v.serve(guest)
	return host, nil
}

// serve answers the host's lines on conn, one at a time while the guest
// runs, until conn or the machine ends.
func (v *vm) serve(conn net.Conn) {
	lines := make(chan hostLine, lineQueue)
	quit := make(chan struct{})
	defer close(quit)
	defer conn.Close()
	go readLines(conn, lines, quit)
	for l := range lines {
		if !v.enter() {
			return
		}
		reply := fmt.Sprintf("error: line longer than %d bytes", maxLine)
		if !l.tooLong {
			reply = v.handle(l.text)
		}
		v.leave()
		if _, err := io.WriteString(conn, reply+"\n"); err != nil {
			return
		}
	}
}

// readLines queues conn's lines on lines until conn ends or quit closes.
func readLines(conn net.Conn, lines chan<- hostLine, quit <-chan struct{}) {
	defer close(lines)
	br := bufio.NewReaderSize(conn, maxLine)
	for {
		b, err := br.ReadSlice('\n')
		l := hostLine{text: strings.TrimSuffix(string(b), "\n")}
		for err == bufio.ErrBufferFull {
			l = hostLine{tooLong: true}
			_, err = br.ReadSlice('\n')
		}
		if err != nil {
			return // a last line without its newline is dropped
		}
		select {
		case lines <- l:
		case <-quit:
			return
		}
	}
}

// handle answers one line; the caller holds the vCPU (enter).
func (v *vm) handle(line string) string {
	cmd, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	arg = strings.TrimSpace(arg)
	switch cmd {
	case "ping":
		return "pong"
	case "set":
		if len(arg) > valueMax {
			return fmt.Sprintf("error: value longer than %d bytes", valueMax)
		}
		v.store(arg)
		return "ok"
	case "get":
		return "state=" + v.load()
	case "run":
		return "error: the fake guest runs no commands"
	default:
		return "echo: " + cmd + " " + arg
	}
}

// store writes the value into guest memory.
func (v *vm) store(val string) {
	binary.LittleEndian.PutUint32(v.mem[valueOff:], uint32(len(val)))
	copy(v.mem[valueOff+4:], val)
	v.markDirty(valueOff, 4+len(val))
}

// load reads the value from guest memory ("" if none was stored).
func (v *vm) load() string {
	n := binary.LittleEndian.Uint32(v.mem[valueOff:])
	if n > valueMax {
		return ""
	}
	return string(v.mem[valueOff+4 : valueOff+4+int(n)])
}
