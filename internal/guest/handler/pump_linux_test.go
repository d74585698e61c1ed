package handler

import (
	"bytes"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
)

// runPump runs pump on r (the agent a's) until it returns, and collects
// what it sent. It fails the test if pump does not return within limit.
func runPump(t *testing.T, a *Agent, r *os.File, st *drainState, limit time.Duration, before func()) []byte {
	t.Helper()
	events := make(chan agentapi.ExecEvent, execEvents)
	var wg sync.WaitGroup
	wg.Add(1)
	go a.pump(&wg, r, agentapi.EventStdout, events, st)
	go func() { wg.Wait(); close(events) }()
	if before != nil {
		before()
	}
	var got bytes.Buffer
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return got.Bytes()
			}
			if ev.Type != agentapi.EventStdout {
				t.Fatalf("event type %q", ev.Type)
			}
			got.Write(ev.Data)
		case <-timer.C:
			t.Fatalf("pump still running after %v (got %d bytes)", limit, got.Len())
		}
	}
}

func pipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}

// TestPumpReadsOutputPastAnExpiredDeadline: on a loaded machine the pump
// can be starved for longer than ExecQuiet between setting its read
// deadline and reading. Go then fails the read on the expired deadline
// without reading, and the process's last output, already in the pipe,
// was lost. A negative ExecQuiet plays that starvation on every read.
// The pipe is still open for writing (a background child holds it) or
// not: either way all the output comes, and the pump then returns.
func TestPumpReadsOutputPastAnExpiredDeadline(t *testing.T) {
	a := &Agent{cfg: Config{ExecQuiet: -time.Second}}
	for _, size := range []int{len("last line\n"), execChunk + execChunk/4} {
		for _, holdOpen := range []bool{true, false} {
			r, w := pipe(t)
			want := bytes.Repeat([]byte("x"), size)
			copy(want, "last line\n")
			if _, err := w.Write(want); err != nil { // fits in the pipe
				t.Fatal(err)
			}
			if !holdOpen {
				w.Close()
			}
			var st drainState
			st.exited.Store(true)
			got := runPump(t, a, r, &st, 10*time.Second, nil)
			if !bytes.Equal(got, want) {
				t.Errorf("%d bytes, writer open %v: got %d bytes %.20q, want all", size, holdOpen, len(got), got)
			}
		}
	}
}

// TestPumpReadsOutputWhenTheExitDeadlineWinsTheRace: the pump is parked in
// a read when the process writes its last line and exits; the watcher's
// deadline wakes the read (a timer, or here at once: the deadline is
// already past) before the poller reports the data. The read fails on the
// deadline, and the line was lost.
func TestPumpReadsOutputWhenTheExitDeadlineWinsTheRace(t *testing.T) {
	a := &Agent{cfg: Config{ExecQuiet: 20 * time.Millisecond}}
	for i := 0; i < 20; i++ {
		r, w := pipe(t)
		var st drainState
		got := runPump(t, a, r, &st, 10*time.Second, func() {
			time.Sleep(5 * time.Millisecond) // let the pump park in Read
			w.Write([]byte("last line\n"))
			st.exited.Store(true)
			r.SetReadDeadline(time.Unix(1, 0))
		})
		if string(got) != "last line\n" {
			t.Fatalf("try %d: got %q, want the last line", i, got)
		}
	}
}

// TestPumpStopsWithoutOutput: the deadlines still do their job. A
// background child that holds the pipe open and quiet ends the drain after
// ExecQuiet; once ExecDrain is over, what is left is not read.
func TestPumpStopsWithoutOutput(t *testing.T) {
	a := &Agent{cfg: Config{ExecQuiet: 20 * time.Millisecond}}
	r, _ := pipe(t)
	var st drainState
	st.exited.Store(true)
	start := time.Now()
	if got := runPump(t, a, r, &st, 10*time.Second, nil); len(got) != 0 {
		t.Fatalf("got %q from an empty pipe", got)
	}
	t.Logf("quiet pipe: pump returned after %v", time.Since(start))

	r, w := pipe(t)
	w.Write([]byte("after the drain"))
	st.over.Store(true)
	r.SetReadDeadline(time.Unix(1, 0))
	if got := runPump(t, a, r, &st, 10*time.Second, nil); len(got) != 0 {
		t.Fatalf("read %q after the drain was over", got)
	}
}
