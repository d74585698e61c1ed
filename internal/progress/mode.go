package progress

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Mode names a renderer. It is a pflag.Value, so a flag parses it.
type Mode string

const (
	// Auto is JSON for scripts (--json), else Bar on a terminal, else
	// Plain; Resolve decides.
	Auto Mode = "auto"
	// Bar draws a bar per step, redrawn in place (a terminal only).
	Bar Mode = "tty"
	// Plain writes a line per step and a byte count now and then.
	Plain Mode = "plain"
	// JSON writes one NDJSON Event per line.
	JSON Mode = "json"
	// None shows nothing.
	None Mode = "none"
)

// Modes is every mode, for help texts.
const Modes = "auto, tty, plain, json or none"

// ParseMode reads a mode's name.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Auto, Bar, Plain, JSON, None:
		return m, nil
	}
	return "", fmt.Errorf("progress mode %q: want %s: %w", s, Modes, errdefs.ErrInvalidArgument)
}

func (m *Mode) String() string { return string(*m) }

// Set parses a flag value.
func (m *Mode) Set(s string) error {
	v, err := ParseMode(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// Type names the flag value in help.
func (*Mode) Type() string { return "mode" }

// Resolve turns Auto into a renderer for out: JSON when the command
// prints JSON, Bar when out is a terminal that can redraw (TERM is not
// "dumb") and says how wide it is (a pty nobody sized says 0 columns,
// where bars would draw nothing), else Plain. Other modes stay as they
// are.
func Resolve(m Mode, jsonOut bool, out *os.File) Mode {
	if m != Auto && m != "" {
		return m
	}
	switch {
	case jsonOut:
		return JSON
	case IsTerminal(out) && os.Getenv("TERM") != "dumb" && termWidth(out) > 0:
		return Bar
	}
	return Plain
}

// termWidth is the terminal's width in columns (0: unknown).
func termWidth(f *os.File) int {
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0
	}
	return int(ws.Col)
}

// IsTerminal reports whether f is a terminal (not merely a character
// device such as /dev/null).
func IsTerminal(f *os.File) bool {
	if f == nil {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
