package sandbox

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"unicode"
)

// Bounds on the output of one Run step shown as build progress: lines
// past maxStepOutputLines are counted, not shown (a failed step's error
// keeps the end of its output anyway), and a line is cut at
// maxStepLineBytes.
const (
	maxStepOutputLines = 2000
	maxStepLineBytes   = 512
)

// stepOutputPrefix starts each output line in the progress, setting it
// apart from forkd's own messages.
const stepOutputPrefix = "  | "

// lineWriter passes what a build step writes to out a line at a time,
// printable (the guest's output goes to an operator's terminal: control
// characters become spaces, invalid UTF-8 is replaced) and bounded. Safe
// for concurrent writers (stdout and stderr).
type lineWriter struct {
	out func(string)
	max int

	mu      sync.Mutex
	line    []byte
	cut     bool // the current line is longer than what line holds
	sent    int
	dropped int
}

func newLineWriter(out func(string), max int) *lineWriter {
	return &lineWriter{out: out, max: max}
}

func (l *lineWriter) Write(p []byte) (int, error) {
	n := len(p)
	if l.out == nil {
		return n, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if room := maxStepLineBytes - len(l.line); len(chunk) > room {
			chunk, l.cut = chunk[:room], true
		}
		l.line = append(l.line, chunk...)
		if i < 0 {
			break
		}
		l.emitLocked()
		p = p[i+1:]
	}
	return n, nil
}

// Flush passes on a last line without a newline and says how many lines
// were not shown.
func (l *lineWriter) Flush() {
	if l.out == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.line) > 0 || l.cut {
		l.emitLocked()
	}
	if l.dropped > 0 {
		l.out(fmt.Sprintf("%s… %d more lines not shown", stepOutputPrefix, l.dropped))
		l.dropped = 0
	}
}

func (l *lineWriter) emitLocked() {
	text := printableLine(l.line)
	if l.cut {
		text += " …"
	}
	l.line, l.cut = l.line[:0], false
	if l.sent >= l.max {
		l.dropped++
		return
	}
	l.sent++
	l.out(stepOutputPrefix + text)
}

// printableLine is b for a terminal: valid UTF-8 without control
// characters (a carriage return or an escape sequence could rewrite what
// the operator sees), trailing spaces trimmed.
func printableLine(b []byte) string {
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	return strings.TrimRight(s, " ")
}
