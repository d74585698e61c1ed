package progress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"
)

// fakeClock is a Reporter's clock that moves only when told.
type fakeClock struct{ t time.Time }

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) now() time.Time { return c.t }

// at sets the time to d after the start.
func (c *fakeClock) at(d time.Duration) {
	c.t = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC).Add(d)
}

// recorder is a renderer that keeps what it was given.
type recorder struct {
	interval time.Duration
	steps    []string
	updates  []State
	ended    []error
}

func (r *recorder) every() time.Duration   { return r.interval }
func (r *recorder) step(s State)           { r.steps = append(r.steps, s.Step) }
func (r *recorder) bytes(s State)          { r.updates = append(r.updates, s) }
func (r *recorder) end(_ State, err error) { r.ended = append(r.ended, err) }

func TestPlainLines(t *testing.T) {
	c := newFakeClock()
	var out bytes.Buffer
	rep := New(Options{Op: "unpack", Mode: Plain, Out: &out, Now: c.now})
	rep.Step("uploading a.tar.zst")
	for _, u := range []struct {
		at   time.Duration
		done int64
	}{
		{1 * time.Second, 100},         // the first count: under a quarter, nothing to say
		{1100 * time.Millisecond, 300}, // within 250ms of the last: not even passed on
		{2 * time.Second, 300},         // past 25%
		{3 * time.Second, 400},         // same quarter, 1s after the last line
		{8 * time.Second, 450},         // 6s after the last line
		{9 * time.Second, 1000},        // 100%: the final line says it
	} {
		c.at(u.at)
		rep.Bytes(u.done, 1000)
	}
	c.at(10 * time.Second)
	rep.Step("verifying on\x1b[2J the daemon\n")
	c.at(12 * time.Second)
	rep.Done(nil)
	rep.Done(errors.New("a second Done does nothing"))

	want := "" +
		"[   0.0s] uploading a.tar.zst\n" +
		"[   2.0s]   300 B of 1000 B (30%), 200 B/s, 3.5s left\n" +
		"[   8.0s]   450 B of 1000 B (45%), 50 B/s, 11.0s left\n" +
		"[  10.0s]   1000 B in 10.0s, 100 B/s\n" +
		"[  10.0s] verifying on [2J the daemon \n" // no control characters
	if got := out.String(); got != want {
		t.Errorf("plain output:\n%s\nwant:\n%s", got, want)
	}
}

func TestPlainUnknownTotal(t *testing.T) {
	c := newFakeClock()
	var out bytes.Buffer
	rep := New(Options{Op: "pack", Mode: Plain, Out: &out, Now: c.now})
	rep.Step("packing base")
	for i := int64(1); i <= 60; i++ { // a MiB a second for a minute
		c.at(time.Duration(i) * time.Second)
		rep.Bytes(i<<20, -1)
	}
	rep.Done(nil)
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	// The step, a line every 5s after it, the final.
	if len(lines) != 1+12+1 {
		t.Fatalf("%d lines, want 14:\n%s", len(lines), out.String())
	}
	if want := "[   5.0s]   5.0 MiB, 1.0 MiB/s"; lines[1] != want {
		t.Errorf("first count line %q, want %q", lines[1], want)
	}
	if want := "[  60.0s]   60.0 MiB in 1m0s, 1.0 MiB/s"; lines[len(lines)-1] != want {
		t.Errorf("final line %q, want %q", lines[len(lines)-1], want)
	}
	if strings.Contains(out.String(), "left") || strings.Contains(out.String(), "%") {
		t.Errorf("no total, yet a share or a time left:\n%s", out.String())
	}
}

func TestJSONEvents(t *testing.T) {
	c := newFakeClock()
	var out bytes.Buffer
	rep := New(Options{Op: "cp", Mode: JSON, Out: &out, Now: c.now})
	rep.Step("copying f to sb-1:/f")
	for ms := int64(100); ms <= 2000; ms += 100 { // 100 bytes every 100ms
		c.at(time.Duration(ms) * time.Millisecond)
		rep.Bytes(ms, 2000)
	}
	c.at(2500 * time.Millisecond)
	rep.Done(errors.New("sandbox sb-1 died"))

	var got []string
	dec := json.NewDecoder(&out)
	for {
		var ev Event
		if err := dec.Decode(&ev); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if ev.Op != "cp" || ev.Time.IsZero() {
			t.Errorf("event %+v: want op cp and a time", ev)
		}
		s := fmt.Sprintf("%s %q %dms", ev.Event, ev.Step, ev.ElapsedMillis)
		if ev.Bytes != nil {
			s += fmt.Sprintf(" %d/%d %.0fB/s", *ev.Bytes, *ev.Total, ev.BytesPerSecond)
		}
		if ev.ETAMillis != nil {
			s += fmt.Sprintf(" eta=%dms", *ev.ETAMillis)
		}
		if ev.Final {
			s += " final"
		}
		if ev.Error != "" {
			s += " error=" + ev.Error
		}
		got = append(got, s)
	}
	// The first count at once (no rate yet: one report), then one every
	// 500ms, the final one at the end, then done.
	want := []string{
		`step "copying f to sb-1:/f" 0ms`,
		`bytes "copying f to sb-1:/f" 100ms 100/2000 0B/s`,
		`bytes "copying f to sb-1:/f" 600ms 600/2000 1000B/s eta=1400ms`,
		`bytes "copying f to sb-1:/f" 1100ms 1100/2000 1000B/s eta=900ms`,
		`bytes "copying f to sb-1:/f" 1600ms 1600/2000 1000B/s eta=400ms`,
		`bytes "copying f to sb-1:/f" 2500ms 2000/2000 792B/s final`,
		`done "" 2500ms error=sandbox sb-1 died`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestThrottle: however often bytes are reported, the renderer gets one
// update per its interval, and always the step's final count.
func TestThrottle(t *testing.T) {
	c := newFakeClock()
	rec := &recorder{interval: 100 * time.Millisecond}
	rep := newReporter(Options{Op: "pack", Now: c.now}, rec)
	for ms := 0; ms < 1000; ms++ {
		c.at(time.Duration(ms) * time.Millisecond)
		rep.Bytes(int64(ms+1)*1024, -1)
	}
	c.at(time.Second)
	rep.Done(nil)
	if len(rec.steps) != 1 || rec.steps[0] != "pack" {
		t.Errorf("steps %q: bytes before a step open one named after the operation", rec.steps)
	}
	if len(rec.updates) != 11 {
		t.Fatalf("%d updates for 1000 reports in 1s at most every 100ms, want 10 and the final", len(rec.updates))
	}
	for i, u := range rec.updates[:10] {
		if want := time.Duration(i) * 100 * time.Millisecond; u.Elapsed != want || u.Final {
			t.Errorf("update %d at %v (final %v), want at %v", i, u.Elapsed, u.Final, want)
		}
	}
	if last := rec.updates[10]; !last.Final || last.Bytes != 1000*1024 || last.Total != -1 {
		t.Errorf("last update %+v, want the final count 1000 KiB of an unknown total", last)
	}
	if len(rec.ended) != 1 || rec.ended[0] != nil {
		t.Errorf("end calls %v", rec.ended)
	}
	rep.Bytes(1, 1) // after Done: ignored
	rep.Step("late")
	if len(rec.updates) != 11 || len(rec.steps) != 1 {
		t.Errorf("events after Done reached the renderer")
	}
}

func TestCountingReaderWriter(t *testing.T) {
	data := bytes.Repeat([]byte("forkd"), 10000)
	n := int64(len(data))
	for _, tc := range []struct {
		name  string
		total int64
		move  func(rep *Reporter, dst *bytes.Buffer) (int64, error)
	}{
		{"reader", n, func(rep *Reporter, dst *bytes.Buffer) (int64, error) {
			return io.Copy(dst, rep.Reader(iotest.HalfReader(bytes.NewReader(data)), n))
		}},
		{"writer, unknown total", -1, func(rep *Reporter, dst *bytes.Buffer) (int64, error) {
			return io.Copy(rep.Writer(dst, -1), iotest.OneByteReader(bytes.NewReader(data)))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeClock()
			rec := &recorder{interval: time.Second}
			rep := newReporter(Options{Op: "cp", Now: c.now}, rec)
			rep.Step("copy")
			var dst bytes.Buffer
			moved, err := tc.move(rep, &dst)
			if err != nil || moved != n || !bytes.Equal(dst.Bytes(), data) {
				t.Fatalf("moved %d, %v", moved, err)
			}
			rep.Done(nil)
			// The clock stood still: the first count, then the final.
			if len(rec.updates) != 2 {
				t.Fatalf("%d updates, want the first and the final", len(rec.updates))
			}
			last := rec.updates[1]
			if !last.Final || last.Bytes != n || last.Total != tc.total {
				t.Errorf("final update %d of %d (final %v), want %d of %d", last.Bytes, last.Total, last.Final, n, tc.total)
			}
			if _, ok := last.ETA(); ok {
				t.Errorf("a final count has no time left")
			}
		})
	}
}

func TestBytesText(t *testing.T) {
	for _, tc := range []struct {
		s    State
		want string
	}{
		{State{Bytes: 120 << 20, Total: 512 << 20, Rate: 24 << 20}, "120.0 MiB of 512.0 MiB (23%), 24.0 MiB/s, 16.3s left"},
		{State{Bytes: 120 << 20, Total: -1, Rate: 24 << 20}, "120.0 MiB, 24.0 MiB/s"},
		{State{Bytes: 10, Total: -1}, "10 B"},
		{State{Bytes: 0, Total: 0, Final: true, StepElapsed: 90 * time.Second}, "0 B in 1m30s"},
		// Cut short: the final count says how far it got.
		{State{Bytes: 1 << 30, Total: 4 << 30, Final: true, StepElapsed: time.Second, Rate: 1 << 30}, "1.0 GiB of 4.0 GiB (25%) in 1.0s, 1.0 GiB/s"},
	} {
		if got := bytesText(tc.s); got != tc.want {
			t.Errorf("bytesText(%+v) = %q, want %q", tc.s, got, tc.want)
		}
	}
}

func TestParseAndResolve(t *testing.T) {
	for _, s := range []string{"auto", "tty", "plain", "json", "none"} {
		if m, err := ParseMode(s); err != nil || string(m) != s {
			t.Errorf("ParseMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := ParseMode("bars"); err == nil || !strings.Contains(err.Error(), Modes) {
		t.Errorf("ParseMode(bars): %v, want an error naming the modes", err)
	}
	if m := Resolve(Auto, true, nil); m != JSON {
		t.Errorf("auto with --json: %q", m)
	}
	if m := Resolve(Auto, false, nil); m != Plain {
		t.Errorf("auto, no terminal: %q", m)
	}
	if m := Resolve(None, true, nil); m != None {
		t.Errorf("none with --json: %q", m)
	}
	if New(Options{Mode: None}).Shown() || !New(Options{Mode: Plain, Out: io.Discard}).Shown() {
		t.Errorf("Shown: none shows nothing, plain shows")
	}
}

// syncBuffer is written by mpb's goroutine.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestBarRenderer runs bars to the end on a forced terminal: a step
// without bytes, one with a total fed from another goroutine (as an HTTP
// transport reads a body), one without, and a failed one.
func TestBarRenderer(t *testing.T) {
	for _, fail := range []bool{false, true} {
		var out syncBuffer
		rep := newReporter(Options{Op: "unpack"}, newBarRenderer(&out, barConfig{forceTTY: true, width: 120}))
		rep.Step("booting")
		rep.Step("uploading")
		data := bytes.Repeat([]byte{1}, 1<<20)
		done := make(chan error)
		go func() {
			_, err := io.Copy(io.Discard, rep.Reader(iotest.HalfReader(bytes.NewReader(data)), int64(len(data))))
			done <- err
		}()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		rep.Step("streaming")
		rep.Writer(io.Discard, -1).Write(data[:4096])
		var err error
		if fail {
			err = errors.New("cut")
		}
		rep.Done(err) // returns once mpb wrote its last frame
		got := out.String()
		for _, want := range []string{"✓ booting", "✓ uploading  1.0 MiB in", "4.0 KiB in"} {
			if !strings.Contains(got, want) {
				t.Errorf("fail=%v: no %q in the bars:\n%q", fail, want, got)
			}
		}
		if mark := map[bool]string{false: "✓ streaming", true: "✗ streaming"}[fail]; !strings.Contains(got, mark) {
			t.Errorf("fail=%v: no %q in the bars:\n%q", fail, mark, got)
		}
	}
}
