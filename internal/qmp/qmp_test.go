package qmp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// fakeQEMU is a QMP server speaking just enough of the protocol.
type fakeQEMU struct {
	t    *testing.T
	ln   *net.UnixListener
	path string

	mu      sync.Mutex
	conn    *net.UnixConn
	held    []map[string]any // replies held back until the next command
	gotCaps atomic.Bool
	// received yields the name of every command read (as long as nobody
	// lets it fill up), for a test to wait until one has arrived.
	received chan string
	// resume lets a fake that got "stall" read on.
	resume chan struct{}
	// flood is what "flood" writes floodN times, with no newline: a line
	// without end, from a buffer the test allocates before it measures.
	flood  []byte
	floodN int
}

func newFake(t *testing.T, path string) *fakeQEMU {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeQEMU{t: t, ln: ln, path: path, received: make(chan string, 128), resume: make(chan struct{})}
	t.Cleanup(func() { ln.Close() })
	go f.serve()
	return f
}

func (f *fakeQEMU) send(m any) {
	b, _ := json.Marshal(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.conn != nil {
		f.conn.Write(append(b, '\n'))
	}
}

func (f *fakeQEMU) event(name string, data any) {
	f.send(map[string]any{
		"event":     name,
		"data":      data,
		"timestamp": map[string]any{"seconds": 1700000000, "microseconds": 5},
	})
}

func (f *fakeQEMU) dropConn() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conn.Close()
}

func (f *fakeQEMU) serve() {
	conn, err := f.ln.AcceptUnix()
	if err != nil {
		return
	}
	f.mu.Lock()
	f.conn = conn
	f.mu.Unlock()
	f.send(map[string]any{"QMP": map[string]any{
		"version":      map[string]any{"qemu": map[string]any{"major": 7, "minor": 2, "micro": 22}, "package": "test"},
		"capabilities": []string{"oob"},
	}})
	buf := make([]byte, 4096)
	oob := make([]byte, syscall.CmsgSpace(4*8))
	var pending []byte
	var fds []int
	for {
		n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
		if err != nil {
			return
		}
		if oobn > 0 {
			msgs, _ := syscall.ParseSocketControlMessage(oob[:oobn])
			for _, m := range msgs {
				got, _ := syscall.ParseUnixRights(&m)
				fds = append(fds, got...)
			}
		}
		pending = append(pending, buf[:n]...)
		for {
			i := bytes.IndexByte(pending, '\n')
			if i < 0 {
				break
			}
			line := pending[:i]
			pending = pending[i+1:]
			f.handle(line, &fds)
		}
	}
}

func (f *fakeQEMU) handle(line []byte, fds *[]int) {
	var cmd struct {
		Execute   string          `json:"execute"`
		Arguments json.RawMessage `json:"arguments"`
		ID        any             `json:"id"`
	}
	if err := json.Unmarshal(line, &cmd); err != nil {
		f.send(map[string]any{"error": map[string]any{"class": "GenericError", "desc": "JSON parse error"}})
		return
	}
	select {
	case f.received <- cmd.Execute:
	default:
	}
	ret := func(v any) map[string]any { return map[string]any{"return": v, "id": cmd.ID} }
	var out map[string]any
	switch cmd.Execute {
	case "qmp_capabilities":
		f.gotCaps.Store(true)
		out = ret(map[string]any{})
	case "echo":
		// An event between command and reply must not be taken as a reply.
		f.event("NOISE", map[string]any{"n": 1})
		var a any
		json.Unmarshal(cmd.Arguments, &a)
		out = ret(a)
	case "hold":
		// Replied to only after the next command's reply: out of order.
		f.held = append(f.held, ret("held"))
		return
	case "getfd":
		if len(*fds) == 0 {
			out = map[string]any{"error": map[string]any{"class": "GenericError", "desc": "No file descriptor supplied via SCM_RIGHTS"}, "id": cmd.ID}
			break
		}
		fd := (*fds)[0]
		*fds = (*fds)[1:]
		file := os.NewFile(uintptr(fd), "passed")
		b := make([]byte, 64)
		n, _ := file.ReadAt(b, 0)
		file.Close()
		out = ret(map[string]any{"content": string(b[:n])})
	case "fail":
		out = map[string]any{"error": map[string]any{"class": "DeviceNotFound", "desc": "no such thing"}, "id": cmd.ID}
	case "never":
		return
	case "flood":
		f.mu.Lock()
		defer f.mu.Unlock()
		for range f.floodN {
			if _, err := f.conn.Write(f.flood); err != nil {
				return // the client hung up
			}
		}
		return
	case "stall":
		// Stops reading, as a QEMU that hangs, until resume is closed.
		<-f.resume
		return
	default:
		out = map[string]any{"error": map[string]any{"class": "CommandNotFound", "desc": "The command " + cmd.Execute + " has not been found"}, "id": cmd.ID}
	}
	f.send(out)
	for _, h := range f.held {
		f.send(h)
	}
	f.held = nil
}

// awaitCommand waits until the fake has read the command name.
func (f *fakeQEMU) awaitCommand(t *testing.T, name string) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case got := <-f.received:
			if got == name {
				return
			}
		case <-timeout:
			t.Fatalf("the fake QEMU never got %q", name)
		}
	}
}

func sockPath(t *testing.T) string {
	// unix socket paths are limited to 108 bytes; t.TempDir can be long.
	dir, err := os.MkdirTemp("", "qmp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "qmp.sock")
}

func dial(t *testing.T) (*Client, *fakeQEMU) {
	t.Helper()
	path := sockPath(t)
	f := newFake(t, path)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Dial(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, f
}

func TestDialRetriesUntilSocketExists(t *testing.T) {
	path := sockPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		c   *Client
		err error
	}
	dialed := make(chan result, 1)
	go func() {
		c, err := Dial(ctx, path)
		dialed <- result{c, err}
	}()
	// Give Dial time to find no socket (if it does not, the test proves
	// less but still passes).
	time.Sleep(100 * time.Millisecond)
	newFake(t, path)
	r := <-dialed
	if r.err != nil {
		t.Fatal(r.err)
	}
	c := r.c
	defer c.Close()
	if got := c.Version(); got.String() != "7.2.22" || got.Package != "test" {
		t.Errorf("version = %+v", got)
	}
}

func TestDialGivesUpAtDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Dial(ctx, sockPath(t))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	// Only bounds a hang: on a loaded machine the return comes well after
	// the deadline.
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("took %v", d)
	}
}

func TestExecuteConcurrentWithEvents(t *testing.T) {
	c, f := dial(t)
	if !f.gotCaps.Load() {
		t.Error("qmp_capabilities not sent")
	}
	sub := c.SubscribeNames("NOISE")
	defer sub.Cancel()
	ctx := context.Background()

	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got map[string]int
			if err := c.Execute(ctx, "echo", map[string]int{"i": i}, &got); err != nil {
				errs <- err
				return
			}
			if got["i"] != i {
				errs <- fmt.Errorf("call %d got reply %v", i, got)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for range 50 {
		select {
		case ev := <-sub.C():
			if ev.Name != "NOISE" || ev.Time.Unix() != 1700000000 || string(ev.Data) != `{"n":1}` {
				t.Fatalf("event = %+v", ev)
			}
		case <-time.After(time.Minute):
			t.Fatal("missing events")
		}
	}
}

func TestOutOfOrderReplies(t *testing.T) {
	c, f := dial(t)
	ctx := context.Background()
	held := make(chan error, 1)
	var heldResult string
	go func() { held <- c.Execute(ctx, "hold", nil, &heldResult) }()
	// "hold" goes out first; its reply is sent after echo's.
	f.awaitCommand(t, "hold")
	var echo string
	if err := c.Execute(ctx, "echo", "x", &echo); err != nil || echo != "x" {
		t.Fatalf("echo = %q, %v", echo, err)
	}
	if err := <-held; err != nil || heldResult != "held" {
		t.Fatalf("hold = %q, %v", heldResult, err)
	}
}

func TestErrorReply(t *testing.T) {
	c, _ := dial(t)
	err := c.Execute(context.Background(), "fail", nil, nil)
	var qe *Error
	if !errors.As(err, &qe) {
		t.Fatalf("err = %v (%T), want *Error", err, err)
	}
	if qe.Class != "DeviceNotFound" || qe.Desc != "no such thing" || qe.Command != "fail" {
		t.Errorf("error = %+v", qe)
	}
	if err.Error() != "qmp fail: DeviceNotFound: no such thing" {
		t.Errorf("message = %q", err.Error())
	}
}

func TestPassFile(t *testing.T) {
	c, _ := dial(t)
	p := filepath.Join(t.TempDir(), "state")
	if err := os.WriteFile(p, []byte("hello fd"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got struct{ Content string }
	if err := c.ExecuteWithFiles(context.Background(), "getfd", map[string]string{"fdname": "x"}, &got, f); err != nil {
		t.Fatal(err)
	}
	if got.Content != "hello fd" {
		t.Errorf("content through fd = %q", got.Content)
	}
	// Without a file the (fake) QEMU complains, as the real one does.
	if err := c.Execute(context.Background(), "getfd", map[string]string{"fdname": "y"}, nil); err == nil {
		t.Error("getfd without fd succeeded")
	}
}

func TestContextCancel(t *testing.T) {
	c, f := dial(t)
	// The context ends while the call waits for its reply (cancelled once
	// the command has arrived: a deadline could pass before the write).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res := make(chan error, 1)
	go func() { res <- c.Execute(ctx, "never", nil, nil) }()
	f.awaitCommand(t, "never")
	cancel()
	if err := <-res; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	// The client still works afterwards.
	var s string
	if err := c.Execute(context.Background(), "echo", "after", &s); err != nil || s != "after" {
		t.Fatalf("echo after cancel = %q, %v", s, err)
	}
}

func TestConnectionLoss(t *testing.T) {
	c, f := dial(t)
	sub := c.Subscribe(nil)
	res := make(chan error, 1)
	go func() { res <- c.Execute(context.Background(), "never", nil, nil) }()
	f.awaitCommand(t, "never") // the call is pending
	f.dropConn()
	select {
	case err := <-res:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("err = %v, want ErrClosed", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("pending call not failed")
	}
	requireClosed(t, c, sub, "")
	sub.Cancel() // after close: no panic
}

// requireClosed checks a client that lost its connection: Done closed,
// subscriptions ended, later calls ErrClosed (saying why, if why is set).
func requireClosed(t *testing.T, c *Client, sub *Subscription, why string) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(time.Minute):
		t.Fatal("Done not closed")
	}
	if _, ok := <-sub.C(); ok {
		t.Error("subscription channel still open")
	}
	if err := c.Execute(context.Background(), "echo", 1, nil); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), why) {
		t.Errorf("call after close: %v, want ErrClosed saying %q", err, why)
	}
}

func TestDeadlinePassedBeforeWrite(t *testing.T) {
	c, _ := dial(t)
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if err := c.Execute(ctx, "echo", 1, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want deadline exceeded", err)
	}
	// Nothing went out: the client still works.
	var n int
	if err := c.Execute(context.Background(), "echo", 2, &n); err != nil || n != 2 {
		t.Fatalf("echo after = %d, %v", n, err)
	}
}

func TestDeadlineDuringWrite(t *testing.T) {
	c, f := dial(t)
	defer close(f.resume)
	stalled := make(chan error, 1)
	go func() { stalled <- c.Execute(context.Background(), "stall", nil, nil) }()
	f.awaitCommand(t, "stall")
	// The fake reads no more: a command larger than the socket buffers
	// blocks part-way until the deadline. A deadline that passes before the
	// write starts (a slow machine) leaves the client as it was: try again
	// with a longer one.
	big := strings.Repeat("x", 2<<20)
	cut := false
	for _, d := range []time.Duration{time.Second, 5 * time.Second, 20 * time.Second} {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		err := c.Execute(ctx, "echo", big, nil)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want deadline exceeded", err)
		}
		// A call with an ended context fails at once: ErrClosed if the
		// session is over, else ctx's error.
		done, cancel := context.WithCancel(context.Background())
		cancel()
		err = c.Execute(done, "echo", 1, nil)
		if errors.Is(err, ErrClosed) {
			cut = true
			break
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("after a write cut off: %v", err)
		}
	}
	if !cut {
		t.Fatal("the deadline never cut the write off part-way")
	}
	// Half a command is on the stream: the session is over, and says why.
	err := c.Execute(context.Background(), "echo", 1, nil)
	if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "cut off") {
		t.Errorf("call after a write cut off: %v", err)
	}
	select {
	case err := <-stalled:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("pending call: %v, want ErrClosed", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("pending call not failed")
	}
	select {
	case <-c.Done():
	case <-time.After(time.Minute):
		t.Fatal("Done not closed")
	}
}
