// Package progress shows how a long client-side operation is going: its
// named steps (the phases of an image build or a snapshot create) and the
// bytes it moves (pack, unpack, cp), with their rate and, when the total is
// known, the time left.
//
// A command makes one Reporter and feeds it events: Step when a phase
// starts (it ends the one before), Bytes (or a Reader or Writer that
// counts) while data flows, Done once at the end. How they are shown is
// chosen once, by Mode: a bar per step on a terminal (mpb), plain lines
// for logs and pipes, NDJSON events for scripts, or nothing. The Reporter
// holds the state and throttles byte updates for its renderer, so a
// renderer never redraws more often than it should whatever the caller
// feeds it; every renderer sees a step's final byte count.
//
// A Reporter is safe for concurrent use: an HTTP transport reads a
// request body (a counting Reader) on its own goroutine while the command
// waits for the answer.
package progress

import (
	"io"
	"sync"
	"time"
)

// Options configure a Reporter.
type Options struct {
	// Op names the operation in events ("pack", "cp", "image.build").
	Op string
	// Mode picks the renderer; Auto must be resolved first (Resolve).
	Mode Mode
	// Out receives the output (the CLI passes stderr).
	Out io.Writer
	// Now is the clock; nil means time.Now. Tests inject one.
	Now func() time.Time
}

// renderer draws a Reporter's events. The Reporter serializes the calls,
// and calls bytes at most once per its every() unless the count is final.
type renderer interface {
	// every is the least time between two byte updates it wants.
	every() time.Duration
	// step: a step began; the one before, if any, ended.
	step(s State)
	// bytes: the current step's byte count changed (s.Final: for good).
	bytes(s State)
	// end: the operation ended, with err or not. Nothing follows.
	end(s State, err error)
}

// Reporter takes a command's progress events and has them rendered.
type Reporter struct {
	op  string
	now func() time.Time
	r   renderer

	// mu guards the fields below.
	mu        sync.Mutex
	start     time.Time
	step      string
	stepStart time.Time
	stepOpen  bool
	done      int64
	total     int64
	// bytesSeen: the step reported bytes; first* are its first report
	// (rate is measured from there, not from the step's start, which may
	// be long before the first byte: a pack hashes before it writes).
	bytesSeen bool
	firstAt   time.Time
	firstDone int64
	lastSent  time.Time
	sentBytes bool // a byte update of this step went out
	sentFinal bool
	ended     bool
}

// New returns a Reporter rendering to opts.Out in opts.Mode (Auto and
// unknown modes render nothing; resolve Auto first).
func New(opts Options) *Reporter {
	var r renderer = nopRenderer{}
	switch opts.Mode {
	case Bar:
		r = newBarRenderer(opts.Out, barConfig{})
	case Plain:
		r = newPlainRenderer(opts.Out)
	case JSON:
		r = newJSONRenderer(opts.Out)
	}
	return newReporter(opts, r)
}

func newReporter(opts Options, r renderer) *Reporter {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	return &Reporter{op: opts.Op, now: now, r: r, start: now(), total: -1}
}

// Shown reports whether anything is rendered: a command may skip work
// done only for progress (a stat for a total) when it is not.
func (rep *Reporter) Shown() bool {
	_, nop := rep.r.(nopRenderer)
	return !nop
}

// Step starts a named step, ending the one before.
func (rep *Reporter) Step(name string) {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	if rep.ended {
		return
	}
	now := rep.now()
	rep.finishLocked(now)
	rep.step, rep.stepStart, rep.stepOpen = name, now, true
	rep.done, rep.total, rep.bytesSeen, rep.sentFinal, rep.sentBytes = 0, -1, false, false, false
	rep.r.step(rep.stateLocked(now, false))
}

// Bytes reports the current step's progress: done bytes of total (total
// < 0: unknown). A Bytes before any Step opens a step named after the
// operation.
func (rep *Reporter) Bytes(done, total int64) {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	if rep.ended {
		return
	}
	now := rep.now()
	if !rep.stepOpen {
		rep.step, rep.stepStart, rep.stepOpen = rep.op, now, true
		rep.r.step(rep.stateLocked(now, false))
	}
	if !rep.bytesSeen {
		rep.bytesSeen, rep.firstAt, rep.firstDone = true, now, done
	}
	rep.done, rep.total = done, total
	if rep.sentBytes && now.Sub(rep.lastSent) < rep.r.every() {
		return
	}
	rep.lastSent, rep.sentBytes = now, true
	rep.r.bytes(rep.stateLocked(now, false))
}

// Done ends the operation: the last step's final byte count, then the
// end, failed if err is not nil. Calls after the first do nothing.
func (rep *Reporter) Done(err error) {
	rep.mu.Lock()
	defer rep.mu.Unlock()
	if rep.ended {
		return
	}
	now := rep.now()
	rep.finishLocked(now)
	rep.ended = true
	rep.r.end(rep.stateLocked(now, false), err)
}

// finishLocked sends the open step's final byte count, once.
func (rep *Reporter) finishLocked(now time.Time) {
	if rep.stepOpen && rep.bytesSeen && !rep.sentFinal {
		rep.sentFinal = true
		rep.r.bytes(rep.stateLocked(now, true))
	}
}

func (rep *Reporter) stateLocked(now time.Time, final bool) State {
	s := State{
		Op: rep.op, Step: rep.step, Now: now,
		Elapsed: now.Sub(rep.start), StepElapsed: now.Sub(rep.stepStart),
		Bytes: rep.done, Total: rep.total, Final: final,
	}
	if rep.bytesSeen {
		if d := now.Sub(rep.firstAt); d > 0 && rep.done > rep.firstDone {
			s.Rate = float64(rep.done-rep.firstDone) / d.Seconds()
		} else if d := now.Sub(rep.stepStart); final && d > 0 {
			// Every byte came in one report: the step's average is
			// the best measure left.
			s.Rate = float64(rep.done) / d.Seconds()
		}
	}
	return s
}

// State is a snapshot of an operation's progress, as renderers see it.
type State struct {
	Op, Step string
	Now      time.Time
	// Elapsed is the time since the operation began, StepElapsed since
	// the step did.
	Elapsed, StepElapsed time.Duration
	// Bytes of Total moved in this step; Total < 0 when unknown.
	Bytes, Total int64
	// Rate in bytes per second since the step's first byte (0: not
	// measured yet).
	Rate float64
	// Final: the step's byte count will not change again.
	Final bool
}

// ETA is the time left at the current rate, when the total is known and
// the rate measured.
func (s State) ETA() (time.Duration, bool) {
	if s.Total < 0 || s.Rate <= 0 || s.Final {
		return 0, false
	}
	left := max(s.Total-s.Bytes, 0)
	return time.Duration(float64(left) / s.Rate * float64(time.Second)), true
}

type nopRenderer struct{}

func (nopRenderer) every() time.Duration { return time.Hour }
func (nopRenderer) step(State)           {}
func (nopRenderer) bytes(State)          {}
func (nopRenderer) end(State, error)     {}
