package pysession

import (
	"context"
	"errors"
	"os/exec"
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
	delay  time.Duration // each call takes this long (a slow consumer)
}

func (r *recorder) out(stream, data string) {
	if data == "" {
		panic("empty chunk")
	}
	r.mu.Lock()
	r.chunks = append(r.chunks, chunk{time.Now(), stream, data})
	r.mu.Unlock()
	time.Sleep(r.delay)
}

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
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
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
	rec := &recorder{}
	res, startedAt := runStream(t, m, "import time, sys\nfor i in range(3):\n    print(i)\n    print('e%d' % i, file=sys.stderr)\n    time.sleep(0.3)\n'done'", 0, rec)
	end := time.Now()
	if text(res) != "'done'" || res.Error != nil || res.TimedOut {
		t.Fatalf("result: %+v", res)
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
	out := rec.of(agentapi.EventStdout)
	if len(out) < 2 {
		t.Fatalf("stdout came in %d chunk(s), want one per print: %+v", len(out), out)
	}
	// The first line arrives while the code still sleeps (it runs ~0.9 s):
	// right after the start, long before the end.
	if d := out[0].at.Sub(startedAt); d > 250*time.Millisecond {
		t.Errorf("first chunk %v after the start", d)
	}
	if d := end.Sub(out[0].at); d < 500*time.Millisecond {
		t.Errorf("first chunk only %v before the end: not streamed", d)
	}
	if d := out[len(out)-1].at.Sub(out[0].at); d < 400*time.Millisecond {
		t.Errorf("chunks spread over %v only", d)
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
	if n := len(rec.of(agentapi.EventStdout)); n > 20 {
		t.Fatalf("%d chunks for 200 tiny writes: not coalesced", n)
	}
}

func TestStreamTimeoutKeepsSession(t *testing.T) {
	m := newManager(t)
	run(t, m, "x = 5", 0)
	rec := &recorder{}
	start := time.Now()
	res, _ := runStream(t, m, "import time\nfor i in range(100):\n    print(i)\n    time.sleep(0.1)", 450*time.Millisecond, rec)
	if !res.TimedOut || res.Error == nil || res.Error.Name != "TimeoutError" {
		t.Fatalf("result: %+v", res)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v to time out", d)
	}
	got := rec.text(agentapi.EventStdout)
	if !strings.HasPrefix(got, "0\n1\n2\n") || strings.Contains(got, "20\n") {
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
		_, err := m.RunStream(ctx, agentapi.RunCodeRequest{Code: "import time\nfor i in range(1000):\n    print(i)\n    time.sleep(0.05)\nfinished = True"}, nil, out)
		errc <- err
	}()
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("no output")
	}
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, errdefs.ErrCanceled) {
			t.Fatalf("canceled stream: %v", err)
		}
	case <-time.After(5 * time.Second):
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
	rec := &recorder{}
	res, _ := runStream(t, m, "import os, time\nfor b in 'é€😀'.encode():\n    os.write(1, bytes([b]))\n    time.sleep(0.03)\nos.write(1, b'\\xff!')", 0, rec)
	if res.Error != nil {
		t.Fatalf("%+v", res)
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
		t.Fatalf("%d chunks: the writes 30 ms apart were not streamed", len(chunks))
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
