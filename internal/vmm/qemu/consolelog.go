package qemu

// The guest console and QEMU's own output are kept in the run dir, which
// is usually on /run: host RAM. Neither may grow without bound: a guest
// runs untrusted code as root and can write its serial port forever, and a
// QEMU that a guest took over can write its stderr forever. So QEMU writes
// neither file itself, and this process keeps both as capped logs:
//
//   - The serial port is a socket chardev. Its listening socket
//     (console.sock) is bound here and handed to QEMU (consoleFD), and this
//     process connects to it before QEMU starts. QEMU accepts that waiting
//     connection when its main loop first runs, right as the vCPUs start
//     (a restored clone's only after migrate-incoming), so it never waits
//     for a reader (wait=on would also print a notice to qemu.log, and
//     make every start wait for this process to dial) and a guest kernel,
//     milliseconds from its first line, loses none. A later daemon that
//     adopts the QEMU connects again (QEMU's chardev takes a new client
//     once the old one is gone); while none is connected, QEMU drops the
//     output rather than stall the guest.
//   - QEMU's stdout and stderr are a pipe copied into qemu.log. Once the
//     daemon that started it has gone, QEMU's writes to the broken pipe
//     fail (it ignores SIGPIPE) and its output is lost: an adopting
//     daemon keeps the qemu.log of before.

import (
	"bytes"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

const (
	// consoleLogBytes caps a guest console on disk. Errors and `forkd
	// sandbox info` quote its last 2 KiB, and a boot under "quiet" prints
	// a few KiB: 1 MiB keeps plenty of history while a host with a
	// thousand sandboxes spends at most 1 GiB of /run on them.
	consoleLogBytes = 1 << 20
	// stderrLogBytes caps qemu.log: QEMU prints a few warnings at most,
	// and an exit error quotes the last 2 KiB.
	stderrLogBytes = 256 << 10

	// stderrDrainTimeout bounds how long the reaper waits, after QEMU
	// has exited, for the rest of its output (and of the console): both
	// arrive at once unless something else holds the pipe or socket.
	stderrDrainTimeout = 2 * time.Second

	// consoleFD is the descriptor QEMU inherits the console's listening
	// socket as (the first of exec.Cmd.ExtraFiles).
	consoleFD = 3
)

// cappedLog is an append-only log that keeps at most max bytes on disk, in
// two generations: path, the current one, and path.1, the one before. When
// the current one reaches max/2 bytes it replaces the previous one, so the
// last max/2 to max bytes written are always there. Write never fails:
// what cannot be written (a full file system) is lost rather than stall or
// break the writer, which is the guest's serial port or QEMU's stderr.
type cappedLog struct {
	path string
	half int64

	// mu guards the fields below, and keeps Tail from reading while a
	// Write moves the generations.
	mu   sync.Mutex
	f    *os.File // the current generation; nil until the first Write
	size int64    // of the current generation
}

func newCappedLog(path string, max int64) *cappedLog {
	return &cappedLog{path: path, half: max / 2}
}

func (l *cappedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for rest := p; len(rest) > 0; {
		if l.open() != nil {
			break
		}
		chunk := rest[:min(int64(len(rest)), l.half-l.size)]
		n, err := l.f.Write(chunk)
		l.size += int64(n)
		if err != nil {
			break
		}
		rest = rest[n:]
	}
	return len(p), nil
}

// open makes l.f a current generation with room left, moving a full one
// to path.1.
func (l *cappedLog) open() error {
	for {
		if l.f == nil {
			f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
			if err != nil {
				return err
			}
			st, err := f.Stat()
			if err != nil {
				f.Close()
				return err
			}
			l.f, l.size = f, st.Size()
			if l.size > l.half {
				// Not written by a cappedLog, whose generations stop
				// at half: keeping it would break the cap.
				if err := f.Truncate(0); err != nil {
					return err
				}
				l.size = 0
			}
		}
		if l.size < l.half {
			return nil
		}
		l.f.Close()
		l.f = nil
		if err := os.Rename(l.path, l.path+".1"); err != nil {
			return err
		}
	}
}

// Close closes the current generation; a later Write opens it again.
func (l *cappedLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// Tail returns up to n bytes from the end of the log, invalid UTF-8
// replaced: unescaped, see vmm.EscapeConsole.
func (l *cappedLog) Tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n <= 0 {
		return ""
	}
	b := tailBytes(l.path, n)
	if len(b) < n {
		b = append(tailBytes(l.path+".1", n-len(b)), b...)
	}
	return string(bytes.ToValidUTF8(b, []byte("?")))
}

// tailBytes returns up to n bytes from the end of a file (none if it
// cannot be read).
func tailBytes(path string, n int) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil
	}
	off := max(st.Size()-int64(n), 0)
	buf := make([]byte, st.Size()-off)
	k, _ := f.ReadAt(buf, off)
	return buf[:k]
}

// listenConsole binds the console's listening socket at path, for QEMU to
// inherit, and connects to it: QEMU accepts the connection when it starts.
// The caller closes ln once QEMU has started (or failed to).
func listenConsole(path string) (ln *os.File, conn net.Conn, err error) {
	os.Remove(path) // a dead machine's
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, nil, err
	}
	// QEMU serves it after this process has closed its copy: a later
	// daemon connects by its path.
	l.SetUnlinkOnClose(false)
	defer l.Close()
	if ln, err = l.File(); err != nil {
		os.Remove(path)
		return nil, nil, err
	}
	// Waits in the listen backlog until QEMU accepts it.
	if conn, err = net.Dial("unix", path); err != nil {
		ln.Close()
		os.Remove(path)
		return nil, nil, err
	}
	return ln, conn, nil
}

// followConsole copies the guest console from conn into the machine's
// console log until QEMU closes the connection (it exits); nil means there
// is no console to follow. consoleDone is closed when it has ended.
func (m *Machine) followConsole(conn net.Conn) {
	if conn == nil {
		close(m.consoleDone)
		return
	}
	go func() {
		defer close(m.consoleDone)
		io.Copy(m.console, conn)
		conn.Close()
		m.console.Close()
	}()
}
