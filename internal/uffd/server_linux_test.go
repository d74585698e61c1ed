package uffd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// requiresUserfaultfd skips t unless this process may create a
// userfaultfd that handles faults of any kind (root here).
func requiresUserfaultfd(t testing.TB) {
	t.Helper()
	fd, err := newUserfaultfd()
	if err != nil {
		testutil.Unavailable(t, "requires a userfaultfd (root, or vm.unprivileged_userfaultfd=1): %v", err)
		return
	}
	unix.Close(fd)
}

// served is a server running on a socket of its own.
type served struct {
	srv    *Server
	socket string
	cancel context.CancelFunc
	done   chan error
}

func startServer(t testing.TB, c *Chain, opts Options) *served {
	t.Helper()
	dir, err := os.MkdirTemp("", "uffd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(dir, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	s := &served{srv: NewServer(c, opts), socket: socket, cancel: cancel, done: make(chan error, 1)}
	go func() { s.done <- s.srv.Serve(ctx, ln) }()
	t.Cleanup(func() { s.stop(t) })
	return s
}

// stop cancels the server and returns what Serve returned.
func (s *served) stop(t testing.TB) error {
	s.cancel()
	select {
	case err := <-s.done:
		s.done <- err
		return err
	case <-time.After(time.Minute):
		t.Fatal("the server did not return within a minute of its cancellation")
		return nil
	}
}

// runVMM runs the child VMM against s and returns its output.
func runVMM(t testing.TB, s *served, mode string, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{envChild + "=" + mode, envSocket + "=" + s.socket}, env...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("child VMM: %v\n%s", err, errb.String())
		}
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("child VMM did not finish within two minutes (a fault never served?)\n%s", errb.String())
	}
	return out.String()
}

// checksums parses the child's "P|R page crc" lines.
func checksums(t testing.TB, out string) map[string]map[int]uint32 {
	t.Helper()
	got := map[string]map[int]uint32{"P": {}, "R": {}}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var kind string
		var page int
		var sum uint32
		if _, err := fmt.Sscanf(sc.Text(), "%s %d %x", &kind, &page, &sum); err != nil {
			t.Fatalf("child output line %q: %v", sc.Text(), err)
		}
		got[kind][page] = sum
	}
	return got
}

func TestServeChainToVMM(t *testing.T) {
	requiresUserfaultfd(t)
	const pages = 256
	fx := writeChain(t, pages, 3)
	s := startServer(t, fx.open(t), Options{RecordWorkingSet: true})
	// Two regions (160 + 96 pages); pages 170-189 are removed and read again.
	out := runVMM(t, s, "check", envSplit+"=160,96", envRemove+"=170,190")
	got := checksums(t, out)
	if len(got["P"]) != pages || len(got["R"]) != 20 {
		t.Fatalf("child read %d pages and %d removed pages, want %d and 20", len(got["P"]), len(got["R"]), pages)
	}
	var zeros int
	zeroSum := crc32.ChecksumIEEE(make([]byte, fixturePage))
	for p := range pages {
		want := crc32.ChecksumIEEE(fx.flat[p*fixturePage : (p+1)*fixturePage])
		if got["P"][p] != want {
			t.Errorf("page %d: checksum %08x, want %08x", p, got["P"][p], want)
		}
		if want == zeroSum {
			zeros++
		}
		if r, ok := got["R"][p]; ok && r != zeroSum {
			t.Errorf("removed page %d reads %08x, not zeros", p, r)
		}
	}
	if err := s.stop(t); err != nil {
		t.Fatalf("Serve returned %v after cancellation, want nil", err)
	}
	st := s.srv.Stats()
	t.Logf("stats %+v (%d zero pages before the removal)", st, zeros)
	if st.Faults < pages+20 || st.Removes == 0 || st.Zeroed < uint64(zeros+20) || st.Copied == 0 {
		t.Errorf("stats %+v: want at least %d faults, a remove event, %d zero pages and some copies", st, pages+20, zeros+20)
	}
	// The child read its memory in order: the working set is that order,
	// each page once (the removed pages' second faults are not new).
	ws := s.srv.WorkingSet()
	if len(ws.Offsets) != pages {
		t.Fatalf("recorded %d pages, want %d", len(ws.Offsets), pages)
	}
	for i, off := range ws.Offsets {
		if off != uint64(i)*fixturePage {
			t.Fatalf("recorded page %d at offset %d, want %d", i, off, i*fixturePage)
		}
	}
}

// TestServeFaultAround serves a chain with fault-around and busy-polling,
// alongside prefetch (so that runs stop at pages already present): every
// page must read as the chain's, pages removed before they were ever read
// (40-49, not to be filled by a fault on the page before them) or after
// (170-189) as zeros.
func TestServeFaultAround(t *testing.T) {
	requiresUserfaultfd(t)
	const pages = 256
	fx := writeChain(t, pages, 3)
	ws := &WorkingSet{PageSize: fixturePage}
	for p := pages - 1; p >= 0; p -= 7 {
		ws.Offsets = append(ws.Offsets, uint64(p)*fixturePage)
	}
	s := startServer(t, fx.open(t), Options{FaultAround: 8, BusyPoll: 100 * time.Microsecond, Prefetch: ws})
	out := runVMM(t, s, "check", envSplit+"=160,96", envRemove0+"=40,50", envRemove+"=170,190")
	got := checksums(t, out)
	if len(got["P"]) != pages || len(got["R"]) != 20 {
		t.Fatalf("child read %d pages and %d removed pages, want %d and 20", len(got["P"]), len(got["R"]), pages)
	}
	zeroSum := crc32.ChecksumIEEE(make([]byte, fixturePage))
	for p := range pages {
		want := crc32.ChecksumIEEE(fx.flat[p*fixturePage : (p+1)*fixturePage])
		if p >= 40 && p < 50 {
			want = zeroSum
		}
		if got["P"][p] != want {
			t.Errorf("page %d: checksum %08x, want %08x", p, got["P"][p], want)
		}
		if r, ok := got["R"][p]; ok && r != zeroSum {
			t.Errorf("removed page %d reads %08x, not zeros", p, r)
		}
	}
	if err := s.stop(t); err != nil {
		t.Fatalf("Serve returned %v after cancellation, want nil", err)
	}
	st := s.srv.Stats()
	t.Logf("stats %+v", st)
	if st.FaultAround == 0 || st.Faults >= pages || st.Removes < 2 {
		t.Errorf("stats %+v: want pages installed around faults, fewer than %d faults, two remove events", st, pages)
	}
}

func TestPrefetchWorkingSet(t *testing.T) {
	requiresUserfaultfd(t)
	const pages = 128
	fx := writeChain(t, pages, 2)
	ws := &WorkingSet{PageSize: fixturePage}
	for p := pages - 1; p >= 0; p -= 2 { // half the pages, backwards
		ws.Offsets = append(ws.Offsets, uint64(p)*fixturePage)
	}
	ws.Offsets = append(ws.Offsets, 1<<40) // outside the memory: skipped
	s := startServer(t, fx.open(t), Options{Prefetch: ws})
	got := checksums(t, runVMM(t, s, "check", envSplit+"=128"))
	for p := range pages {
		if want := crc32.ChecksumIEEE(fx.flat[p*fixturePage : (p+1)*fixturePage]); got["P"][p] != want {
			t.Errorf("page %d: checksum %08x, want %08x", p, got["P"][p], want)
		}
	}
	testutil.WaitFor(t, "prefetch to finish", func() bool {
		st := s.srv.Stats()
		return st.Prefetched+st.Exists >= pages/2
	})
	st := s.srv.Stats()
	t.Logf("stats %+v", st)
	if st.Prefetched == 0 || st.Faults+st.Prefetched < pages {
		t.Errorf("stats %+v: want prefetched pages, and faults plus prefetched covering %d pages", st, pages)
	}
}

// sendRaw creates a userfaultfd in this process and sends it with body to
// a fresh server, returning what Serve returned.
func sendRaw(t *testing.T, body string, fds int) error {
	t.Helper()
	fx := writeChain(t, 16, 1)
	s := startServer(t, fx.open(t), Options{HandshakeTimeout: time.Minute})
	fd, err := newUserfaultfd()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: s.socket, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var oob []byte
	if fds > 0 {
		send := make([]int, fds)
		for i := range send {
			send[i] = fd
		}
		oob = unix.UnixRights(send...)
	}
	if _, _, err := c.WriteMsgUnix([]byte(body), oob, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.done:
		s.done <- err
		// The server closed the connection: the VMM reads EOF.
		c.SetReadDeadline(time.Now().Add(time.Minute))
		if _, rerr := c.Read(make([]byte, 1)); rerr != io.EOF {
			t.Errorf("reading the connection after a refused handshake: %v, want EOF (closed)", rerr)
		}
		return err
	case <-time.After(time.Minute):
		t.Fatal("the server did not refuse the handshake within a minute")
		return nil
	}
}

func TestHandshakeRefusesBadInput(t *testing.T) {
	requiresUserfaultfd(t)
	good := `[{"base_host_virt_addr":1048576,"size":65536,"offset":0,"page_size":4096}]`
	for _, tc := range []struct {
		name, body string
		fds        int
		want       string
	}{
		{"overlapping regions", `[{"base_host_virt_addr":1048576,"size":65536,"offset":0,"page_size":4096},{"base_host_virt_addr":1052672,"size":4096,"offset":0,"page_size":4096}]`, 1, "overlap"},
		{"beyond the memory", `[{"base_host_virt_addr":1048576,"size":131072,"offset":0,"page_size":4096}]`, 1, "beyond"},
		{"garbage", `not json`, 1, "does not decode"},
		{"no descriptor", good, 0, "0 descriptors"},
		{"two descriptors", good, 2, "2 descriptors"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := sendRaw(t, tc.body, tc.fds)
			if err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Serve returned %v, want an invalid-argument error containing %q", err, tc.want)
			}
		})
	}
}

func TestHandshakeRefusesOtherDescriptor(t *testing.T) {
	requiresUserfaultfd(t)
	fx := writeChain(t, 16, 1)
	s := startServer(t, fx.open(t), Options{})
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := sendHandshake(s.socket, int(r.Fd()), []Mapping{{BaseHostVirtAddr: 1 << 20, Size: 4096, PageSize: 4096}}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.done:
		s.done <- err
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "not a userfaultfd") {
			t.Fatalf("Serve returned %v, want a refusal of a pipe", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("the server did not refuse a pipe within a minute")
	}
}

func TestServeReturnsOnCancelBeforeConnect(t *testing.T) {
	fx := writeChain(t, 16, 1)
	s := startServer(t, fx.open(t), Options{})
	if err := s.stop(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve returned %v, want context.Canceled", err)
	}
}
