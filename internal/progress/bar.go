package progress

import (
	"io"
	"sync/atomic"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
)

// barEvery spaces the byte counts a bar is given; mpb redraws on its own
// tick (barRefresh) from the last one.
const (
	barEvery   = 100 * time.Millisecond
	barRefresh = 150 * time.Millisecond
	// barFillWidth is the most columns a bar's filling takes.
	barFillWidth = 30
)

// barConfig is for tests: a buffer is no terminal, so they force one of
// a fixed width.
type barConfig struct {
	forceTTY bool
	width    int
}

// barRenderer draws a line per step on a terminal with mpb: a spinner
// while the step runs without a known total, a bar once it has one, and,
// when the step ends, a ✓ (✗ when the operation failed) with its final
// count and time. Finished steps scroll up and stay; only the running one
// is redrawn.
type barRenderer struct {
	p   *mpb.Progress
	cur *stepBar
}

func newBarRenderer(out io.Writer, cfg barConfig) *barRenderer {
	opts := []mpb.ContainerOption{
		mpb.WithOutput(out),
		mpb.WithRefreshRate(barRefresh),
		mpb.PopCompletedMode(),
	}
	if cfg.forceTTY {
		opts = append(opts, mpb.ForceTTY(), mpb.WithAutoRefresh())
	}
	if cfg.width > 0 {
		opts = append(opts, mpb.WithWidth(cfg.width))
	}
	return &barRenderer{p: mpb.New(opts...)}
}

func (b *barRenderer) every() time.Duration { return barEvery }

func (b *barRenderer) step(s State) {
	b.finish(s, true)
	sb := &stepBar{name: printable(s.Step), start: s.Now, wallStart: time.Now()}
	sb.took.Store(-1)
	// Total 0: mpb never completes it by itself; finish does.
	bar, err := b.p.Add(0, sb.filler(),
		mpb.BarFillerTrim(),
		mpb.BarFillerOnComplete("✓"),
		mpb.BarFillerOnAbort("✗"),
		mpb.AppendDecorators(decor.Any(sb.text)),
	)
	if err != nil {
		return // only after end, which the Reporter never passes
	}
	sb.bar, b.cur = bar, sb
}

func (b *barRenderer) bytes(s State) {
	sb := b.cur
	if sb == nil {
		return
	}
	st := s
	sb.st.Store(&st)
	if s.Total > 0 {
		sb.bar.SetTotal(s.Total, false)
	}
	sb.bar.SetCurrent(s.Bytes)
}

func (b *barRenderer) end(s State, err error) {
	b.finish(s, err == nil)
	b.p.Wait()
}

// finish ends the current step's bar: completed (✓) or aborted (✗).
func (b *barRenderer) finish(s State, ok bool) {
	sb := b.cur
	if sb == nil {
		return
	}
	b.cur = nil
	sb.took.Store(int64(s.Now.Sub(sb.start)))
	if ok {
		sb.bar.SetTotal(-1, true)
	} else {
		sb.bar.Abort(false)
	}
	// Until its last frame is drawn and it scrolled up: mpb orders bars
	// that end within one frame bottom-up, so steps would swap. The bar
	// being the only one running, mpb draws at once.
	sb.bar.Wait()
}

// stepBar is one step's line. Its decorator runs on mpb's goroutine, so
// what it reads is atomic.
type stepBar struct {
	bar       *mpb.Bar
	name      string
	start     time.Time // on the Reporter's clock
	wallStart time.Time // for the running time shown while nothing else moves
	st        atomic.Pointer[State]
	took      atomic.Int64 // the step's duration once it ended; -1 before
}

// filler is a spinner until the step has a byte total, then a bar.
func (sb *stepBar) filler() mpb.BarFiller {
	spin := mpb.SpinnerStyle().Build()
	bar := mpb.BarStyle().Build()
	return mpb.BarFillerFunc(func(w io.Writer, stat decor.Statistics) error {
		if s := sb.st.Load(); s != nil && s.Total > 0 {
			stat.RequestedWidth = barFillWidth
			return bar.Fill(w, stat)
		}
		stat.RequestedWidth = 1
		return spin.Fill(w, stat)
	})
}

// text follows the filler: the step's name, then its bytes (as the plain
// renderer writes them) or its running time.
func (sb *stepBar) text(decor.Statistics) string {
	t := " " + sb.name + "  "
	switch s, took := sb.st.Load(), sb.took.Load(); {
	case s != nil:
		return t + bytesText(*s)
	case took >= 0:
		return t + humanDuration(time.Duration(took))
	default:
		return t + time.Since(sb.wallStart).Round(time.Second).String()
	}
}
