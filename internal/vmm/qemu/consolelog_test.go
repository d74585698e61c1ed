package qemu

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/vmm"
)

// onDisk is the size of a capped log's two generations.
func onDisk(path string) int64 {
	var n int64
	for _, p := range []string{path, path + ".1"} {
		if st, err := os.Stat(p); err == nil {
			n += st.Size()
		}
	}
	return n
}

// A guest that floods its serial port: 100 MiB through the console
// socket, as QEMU would send it, leave at most consoleLogBytes on disk at
// any time, and the tail is the latest output, escaped.
func TestConsoleFloodIsCapped(t *testing.T) {
	dir := t.TempDir()
	cfg := vmm.MachineConfig{ID: "flood", RunDir: dir, ConsoleLog: filepath.Join(dir, consoleFile)}
	m := newMachine(nil, cfg, nil, false)

	ln, conn, err := listenConsole(filepath.Join(dir, consoleSocket))
	if err != nil {
		t.Fatal(err)
	}
	// QEMU's side: accept the waiting connection on the inherited socket.
	qln, err := net.FileListener(ln)
	ln.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer qln.Close()
	m.followConsole(conn)
	qemu, err := qln.Accept()
	if err != nil {
		t.Fatal(err)
	}

	const total = 100 << 20
	line := []byte(strings.Repeat("spam ", 200) + "\x1b[31m\n")
	var sent, worst int64
	for sent < total {
		if _, err := qemu.Write(line); err != nil {
			t.Fatal(err)
		}
		sent += int64(len(line))
		if sent%(1<<20) < int64(len(line)) {
			worst = max(worst, onDisk(cfg.ConsoleLog))
		}
	}
	fmt.Fprintf(qemu, "last words\x1b]0;title\x07\r\n")
	qemu.Close()
	select {
	case <-m.consoleDone:
	case <-time.After(time.Minute):
		t.Fatal("the console copy did not end when QEMU closed the socket")
	}

	if n := onDisk(cfg.ConsoleLog); n > consoleLogBytes || worst > consoleLogBytes {
		t.Errorf("%d bytes on disk at the end, %d at worst, for a cap of %d", n, worst, consoleLogBytes)
	}
	if n := onDisk(cfg.ConsoleLog); n < consoleLogBytes/2 {
		t.Errorf("only %d bytes kept", n)
	}
	tail := m.ConsoleTail(200)
	if !strings.HasSuffix(tail, `last words\x1b]0;title\x07`+"\n") || strings.ContainsRune(tail, 0x1b) {
		t.Errorf("tail %q: want the last line, escaped", tail)
	}
}

// The two generations always hold exactly the latest bytes written, half
// to all of the cap.
func TestCappedLogKeepsTheLatest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	const max = 64 << 10
	l := newCappedLog(path, max)
	rng := rand.New(rand.NewPCG(1, 2))
	var all []byte
	for len(all) < 10*max {
		p := make([]byte, rng.IntN(3*max/4)+1)
		for i := range p {
			p[i] = 'a' + byte(rng.IntN(26))
		}
		if n, err := l.Write(p); n != len(p) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
		all = append(all, p...)
		prev, _ := os.ReadFile(path + ".1")
		cur, _ := os.ReadFile(path)
		kept := append(prev, cur...)
		if len(kept) > max || len(kept) < max/2 && len(all) >= max {
			t.Fatalf("%d bytes kept after %d written", len(kept), len(all))
		}
		if !bytes.HasSuffix(all, kept) {
			t.Fatalf("after %d bytes, the log is not the last %d written", len(all), len(kept))
		}
		if got := l.Tail(100); !strings.HasSuffix(string(all), got) || len(got) != 100 {
			t.Fatalf("Tail(100) = %q", got)
		}
	}
	l.Close()

	// A file the cap does not allow (not written by a cappedLog) starts
	// afresh rather than stay.
	if err := os.WriteFile(path, bytes.Repeat([]byte("x"), max), 0o600); err != nil {
		t.Fatal(err)
	}
	l = newCappedLog(path, max)
	l.Write([]byte("new"))
	l.Close()
	if n := onDisk(path); n > max {
		t.Errorf("%d bytes on disk after reopening an oversized file", n)
	}
	if got := l.Tail(10); !strings.HasSuffix(got, "new") {
		t.Errorf("Tail = %q", got)
	}
}
