package progress

import (
	"fmt"
	"io"
	"time"
)

// plainEvery is the longest a plain renderer stays silent while bytes
// move; with a known total it also writes at each quarter.
const plainEvery = 5 * time.Second

// plainRenderer writes lines for logs and pipes: one per step, then a
// byte count at most every plainEvery or quarter of the total, and the
// step's final count (its time and rate). Nothing is redrawn.
type plainRenderer struct {
	out      io.Writer
	lastLine time.Time
	// lastBytes is the count of the step's last byte line (-1: none).
	lastBytes int64
}

func newPlainRenderer(out io.Writer) *plainRenderer {
	return &plainRenderer{out: out, lastBytes: -1}
}

// Byte updates come often enough to catch each quarter; the renderer
// decides what to write.
func (p *plainRenderer) every() time.Duration { return 250 * time.Millisecond }

func (p *plainRenderer) step(s State) {
	p.line(s, printable(s.Step))
	p.lastBytes = -1
}

func (p *plainRenderer) bytes(s State) {
	switch q := quarter(s.Bytes, s.Total); {
	case s.Final, s.Now.Sub(p.lastLine) >= plainEvery:
	case s.Total > 0 && q < 4 && q > quarter(max(p.lastBytes, 0), s.Total):
		// 25, 50 and 75%; the final line says 100%.
	default:
		return
	}
	p.line(s, "  "+bytesText(s))
	p.lastBytes = s.Bytes
}

// end writes nothing: the command prints its result or its error.
func (p *plainRenderer) end(State, error) {}

func (p *plainRenderer) line(s State, text string) {
	fmt.Fprintf(p.out, "[%6.1fs] %s\n", s.Elapsed.Seconds(), text)
	p.lastLine = s.Now
}

func quarter(done, total int64) int64 { return percent(done, total) / 25 }
