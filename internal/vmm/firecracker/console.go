package firecracker

import (
	"io"
	"os"
	"sync"

	"github.com/forkd-dev/forkd/internal/vmm"
)

// consoleCap is how much guest console a machine keeps: the latest
// consoleCap bytes at most, in the log and its ".1" predecessor.
const consoleCap = 512 << 10

// cappedLog appends to a file and, past consoleCap bytes, renames it to
// path.1 and starts a new one: a guest that prints without end fills no
// disk.
type cappedLog struct {
	path string
	mu   sync.Mutex
	f    *os.File
	size int64
}

func openConsole(path string) (*cappedLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &cappedLog{path: path, f: f, size: st.Size()}, nil
}

func (l *cappedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.size+int64(len(p)) > consoleCap && l.size > 0 {
		l.f.Close()
		os.Rename(l.path, l.path+".1")
		f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return 0, err
		}
		l.f, l.size = f, 0
	}
	n, err := l.f.Write(p)
	l.size += int64(n)
	return n, err
}

func (l *cappedLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}

// tailFile returns up to n bytes from the end of path.1 and path
// together, escaped for a terminal.
func tailFile(path string, n int) string {
	var b []byte
	for _, p := range []string{path + ".1", path} {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		if st, err := f.Stat(); err == nil && st.Size() > int64(n) {
			f.Seek(st.Size()-int64(n), io.SeekStart)
		}
		chunk, _ := io.ReadAll(io.LimitReader(f, int64(n)))
		f.Close()
		b = append(b, chunk...)
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return vmm.EscapeConsole(string(b))
}
