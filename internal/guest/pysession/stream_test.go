package pysession

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// chunk is one call of an Output.
type chunk struct {
	at     time.Time
	stream string
	data   string
}

// recorder is an Output that records its calls.
type recorder struct {
	mu     sync.Mutex
	chunks []chunk
	delay  time.Duration       // each call takes this long (a slow consumer)
	after  func(stream string) // if set, called after each call is recorded
}

func (r *recorder) out(stream, data string) {
	if data == "" {
		panic("empty chunk")
	}
	r.mu.Lock()
	r.chunks = append(r.chunks, chunk{time.Now(), stream, data})
	r.mu.Unlock()
	time.Sleep(r.delay)
	if r.after != nil {
		r.after(stream)
	}
}

// seenPy is Python that defines seen(name), which waits until a file
// name exists in dir: the test's Output creates it once the output it
// stands for has arrived. Code that waits for it before it goes on shows
// that its output was streamed while it ran, however slow the machine.
func seenPy(dir string) string {
	return fmt.Sprintf(`import os as _os, time as _time
def seen(name):
    end = _time.time() + 60
    while not _os.path.exists(_os.path.join(%q, name)):
        if _time.time() > end:
            raise TimeoutError(name + ": the output before it was not delivered while the code ran")
        _time.sleep(0.01)
`, dir)
}

func touch(dir, name string) { os.WriteFile(filepath.Join(dir, name), nil, 0o644) }

func (r *recorder) text(stream string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, c := range r.chunks {
		if c.stream == stream {
			b.WriteString(c.data)
		}
	}
	return b.String()
}

func (r *recorder) of(stream string) []chunk {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []chunk
	for _, c := range r.chunks {
		if c.stream == stream {
			out = append(out, c)
		}
	}
	return out
}

func runStream(t *testing.T, m *Manager, code string, timeout time.Duration, rec *recorder) (agentapi.RunCodeResult, time.Time) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var startedAt time.Time
	res, err := m.RunStream(ctx, agentapi.RunCodeRequest{Code: code, TimeoutMillis: timeout.Milliseconds()},
		func() { startedAt = time.Now() }, rec.out)
	if err != nil {
		t.Fatalf("RunStream %q: %v", code, err)
	}
	if startedAt.IsZero() {
		t.Fatalf("RunStream %q: started was not called", code)
	}
	return res, startedAt
}

func TestStreamDeliversOutputWhileCodeRuns(t *testing.T) {
	m := newManager(t)
	// Each line is printed once the one before it has arrived.
	dir := t.TempDir()
	rec := &recorder{}
	rec.after = func(stream string) {
		if stream == agentapi.EventStdout {
			for _, l := range strings.Fields(rec.text(stream)) {
				touch(dir, "line-"+l)
			}
		}
	}
	res, _ := runStream(t, m, seenPy(dir)+"import time, sys\nfor i in range(3):\n    print(i)\n    print('e%d' % i, file=sys.stderr)\n    seen('line-%d' % i)\n'done'", 0, rec)
	if text(res) != "'done'" || res.Error != nil || res.TimedOut {
		t.Fatalf("result: %+v (error %+v)", res, res.Error)
	}
	if res.Stdout != "" || res.Stderr != "" {
		t.Fatalf("streamed result carries output: %+v", res)
	}
	if got := rec.text(agentapi.EventStdout); got != "0\n1\n2\n" {
		t.Fatalf("stdout %q", got)
	}
	if got := rec.text(agentapi.EventStderr); got != "e0\ne1\ne2\n" {
		t.Fatalf("stderr %q", got)
	}
	if out := rec.of(agentapi.EventStdout); len(out) < 3 {
		t.Fatalf("stdout came in %d chunk(s), want one per print: %+v", len(out), out)
	}

	// The buffered path is unchanged, and nothing leaked between them.
	if res := run(t, m, "print('x')\n1", 0); res.Stdout != "x\n" || res.Stderr != "" || text(res) != "1" {
		t.Fatalf("buffered run after a streamed one: %+v", res)
	}
}

func TestStreamCoalescesSmallWrites(t *testing.T) {
	m := newManager(t)
	rec := &recorder{}
	// 200 writes within a few milliseconds: a handful of chunks, not 200.
	res, _ := runStream(t, m, "for i in range(200): print(i, end=' ')", 0, rec)
	if res.Error != nil {
		t.Fatalf("%+v", res)
	}
	var want strings.Builder
	for i := range 200 {
		want.WriteString(strconv.Itoa(i) + " ")
	}
	if got := rec.text(agentapi.EventStdout); got != want.String() {
		t.Fatalf("stdout %q", got)
	}
	// A loaded machine may spread the writes out, and so the chunks, but
	// each chunk the pump delivers waits streamDelay after its first byte,
	// read after the chunk before was delivered: chunks come at least
	// streamDelay apart, except the last (the rest, at the end of the run).
	chunks := rec.of(agentapi.EventStdout)
	for i := 1; i < len(chunks)-1; i++ {
		if d := chunks[i].at.Sub(chunks[i-1].at); d < streamDelay {
			t.Fatalf("chunks %d and %d of %d came %v apart, want at least %v: not coalesced", i-1, i, len(chunks), d, streamDelay)
		}
	}
}

func TestStreamTimeoutKeepsSession(t *testing.T) {
	m := newManager(t)
	run(t, m, "x = 5", 0)
	rec := &recorder{}
	start := time.Now()
	// A timeout of seconds: the first lines are printed before it on a
	// loaded machine too. The loop would run for hours.
	res, _ := runStream(t, m, "import time\nfor i in range(100000):\n    print(i)\n    time.sleep(0.1)", 3*time.Second, rec)
	if !res.TimedOut || res.Error == nil || res.Error.Name != "TimeoutError" {
		t.Fatalf("result: %+v", res)
	}
	if d := time.Since(start); d > time.Minute {
		t.Fatalf("took %v to time out", d)
	}
	got := rec.text(agentapi.EventStdout)
	if !strings.HasPrefix(got, "0\n1\n2\n") {
		t.Fatalf("stdout before the timeout: %q", got)
	}
	if len(rec.of(agentapi.EventStdout)) < 2 {
		t.Fatalf("output not streamed before the timeout: %+v", rec.chunks)
	}
	if res.Stdout != "" || res.Stderr != "" {
		t.Fatalf("streamed result carries output: %+v", res)
	}
	if res := run(t, m, "x", 0); text(res) != "5" {
		t.Fatalf("after a streamed timeout: %+v", res)
	}
}

func TestStreamException(t *testing.T) {
	m := newManager(t)
	rec := &recorder{}
	res, _ := runStream(t, m, "print('before')\nraise ValueError('boom')", 0, rec)
	if res.Error == nil || res.Error.Name != "ValueError" || res.Error.Value != "boom" || !strings.Contains(res.Error.Traceback, "raise ValueError") {
		t.Fatalf("result: %+v", res)
	}
	if got := rec.text(agentapi.EventStdout); got != "before\n" {
		t.Fatalf("stdout %q", got)
	}
}

func TestStreamCancelInterrupts(t *testing.T) {
	m := newManager(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &recorder{}
	first := make(chan struct{})
	var once sync.Once
	out := func(stream, data string) {
		rec.out(stream, data)
		once.Do(func() { close(first) })
	}
	errc := make(chan error, 1)
	go func() {
		_, err := m.RunStream(ctx, agentapi.RunCodeRequest{Code: "import time\nfor i in range(1000000):\n    print(i)\n    time.sleep(0.05)\nfinished = True"}, nil, out)
		errc <- err
	}()
	select {
	case <-first:
	case <-time.After(time.Minute):
		t.Fatal("no output")
	}
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, errdefs.ErrCanceled) {
			t.Fatalf("canceled stream: %v", err)
		}
	case <-time.After(time.Minute): // the loop would run for hours
		t.Fatal("cancel did not interrupt the code")
	}
	if res := run(t, m, "'finished' in globals()", 0); text(res) != "False" {
		t.Fatalf("after cancel: %+v", res)
	}
}

// A chunk never splits a UTF-8 character, even when Python writes one
// byte at a time.
func TestStreamKeepsCharactersWhole(t *testing.T) {
	m := newManager(t)
	// Each character's bytes are written 30 ms apart (the pump may see a
	// part of one), the next character once the one before has arrived.
	dir := t.TempDir()
	rec := &recorder{}
	rec.after = func(stream string) {
		for i := range utf8.RuneCountInString(rec.text(stream)) {
			touch(dir, fmt.Sprintf("char-%d", i))
		}
	}
	res, _ := runStream(t, m, seenPy(dir)+"import os, time\nfor i, c in enumerate('é€😀'):\n    for b in c.encode():\n        os.write(1, bytes([b]))\n        time.sleep(0.03)\n    seen('char-%d' % i)\nos.write(1, b'\\xff!')", 0, rec)
	if res.Error != nil {
		t.Fatalf("%+v (error %+v)", res, res.Error)
	}
	chunks := rec.of(agentapi.EventStdout)
	var all string
	for _, c := range chunks {
		all += c.data
		if c.data != "\xff!" && !utf8.ValidString(c.data) {
			t.Errorf("chunk %q splits a character", c.data)
		}
	}
	if all != "é€😀\xff!" {
		t.Fatalf("stdout %q", all)
	}
	if len(chunks) < 3 {
		t.Fatalf("%d chunks: the characters were not streamed one by one", len(chunks))
	}
}

// A consumer slower than the code slows the code down; nothing is dropped.
func TestStreamSlowConsumerLosesNothing(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	m := NewManager(Config{Dir: t.TempDir(), MaxOutput: 256 << 10})
	if _, err := m.Start(context.Background(), agentapi.PythonStartRequest{}); err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	rec := &recorder{delay: 2 * time.Millisecond}
	// 2 MiB, 8 times MaxOutput, in 1 KiB lines.
	res, _ := runStream(t, m, "line = 'x' * 1023\nfor i in range(2048): print(line)", 0, rec)
	if res.Error != nil {
		t.Fatalf("%+v", res)
	}
	got := rec.text(agentapi.EventStdout)
	if len(got) != 2048*1024 || strings.Contains(got, "dropped") {
		t.Fatalf("got %d bytes (tail %q), want %d", len(got), got[max(0, len(got)-80):], 2048*1024)
	}
}

func TestPartialRune(t *testing.T) {
	for in, want := range map[string]int{
		"": 0, "a": 0, "é": 0, "a\xc3": 1, "\xe2\x82": 2, "\xf0\x9f\x98": 3, "😀": 0,
		"\xff": 0, "\x80\x80\x80": 0, "a\xe2": 1, "\xc3\xa9\xf0": 1,
	} {
		if got := partialRune([]byte(in)); got != want {
			t.Errorf("partialRune(%q) = %d, want %d", in, got, want)
		}
	}
}

func TestStreamWithoutSession(t *testing.T) {
	m := NewManager(Config{Dir: t.TempDir()})
	called := false
	_, err := m.RunStream(context.Background(), agentapi.RunCodeRequest{Code: "1"}, func() { called = true }, func(string, string) {})
	if !errdefs.IsFailedPrecondition(err) || called {
		t.Fatalf("err %v, started called %v", err, called)
	}
}
