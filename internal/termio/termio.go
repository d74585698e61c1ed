// Package termio connects the local terminal to an interactive exec
// session (`forkd exec -it`, `forkd shell`): raw mode while the session
// runs, restored on every way out; the window size followed (SIGWINCH);
// keystrokes, ^C included, passed to the guest's terminal as bytes.
package termio

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Session is what Run drives (client.ExecSession implements it).
type Session interface {
	io.Writer // stdin
	CloseStdin() error
	Resize(rows, cols int) error
	Signal(sig string) error
	Wait(ctx context.Context, stdout, stderr io.Writer) (apiv1.ExecWSExit, error)
	Close() error
}

// Options say how the session meets the local terminal.
type Options struct {
	// Stdin, Stdout, Stderr: the local streams.
	Stdin          *os.File
	Stdout, Stderr io.Writer
	// Input forwards Stdin (-i); without it the session's input ends at
	// once.
	Input bool
	// TTY: the session has a terminal (-t). With Input, Stdin is put in
	// raw mode; the size follows the local terminal's.
	TTY bool
}

// DefaultSize is the terminal size when no local terminal tells one.
var DefaultSize = apiv1.PTY{Rows: 24, Cols: 80}

// Size is the local terminal's size (from f, else DefaultSize).
func Size(files ...*os.File) apiv1.PTY {
	for _, f := range files {
		if f == nil || !term.IsTerminal(int(f.Fd())) {
			continue
		}
		if cols, rows, err := term.GetSize(int(f.Fd())); err == nil && rows > 0 && cols > 0 {
			return apiv1.PTY{Rows: min(rows, apiv1.MaxPTYSize), Cols: min(cols, apiv1.MaxPTYSize)}
		}
	}
	return DefaultSize
}

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool { return f != nil && term.IsTerminal(int(f.Fd())) }

// CheckTTY refuses -it without a terminal on stdin, as docker does: raw
// mode and ^C need one.
func CheckTTY(o Options) error {
	if o.TTY && o.Input && !IsTerminal(o.Stdin) {
		return fmt.Errorf("-t with -i needs a terminal on stdin (this one is a pipe or a file): drop -t to stream stdin, or run from a terminal: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// Run connects the local terminal to s until its process exits, and
// returns the exit. The local terminal is restored before Run returns,
// also when ctx ends or SIGTERM, SIGHUP, SIGQUIT or SIGPIPE arrive (the session is
// then closed, which kills the guest's process group). In raw mode ^C is
// a byte for the guest's terminal; without raw mode it is the local
// SIGINT, which ends ctx in the CLI.
func Run(ctx context.Context, s Session, o Options) (apiv1.ExecWSExit, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer s.Close()

	raw := o.TTY && o.Input && IsTerminal(o.Stdin)
	if raw {
		old, err := term.MakeRaw(int(o.Stdin.Fd()))
		if err != nil {
			return apiv1.ExecWSExit{}, fmt.Errorf("putting the terminal in raw mode: %v: %w", err, errdefs.ErrFailedPrecondition)
		}
		defer term.Restore(int(o.Stdin.Fd()), old)
	}

	sigs := make(chan os.Signal, 4)
	// SIGPIPE too: stdout may be a pipe (forkd shell | tee log) whose
	// reader ends, and Go's default would kill forkd on the next write
	// with the terminal left raw.
	watched := []os.Signal{unix.SIGTERM, unix.SIGHUP, unix.SIGQUIT, unix.SIGPIPE}
	if o.TTY {
		watched = append(watched, unix.SIGWINCH)
	}
	signal.Notify(sigs, watched...)
	defer signal.Stop(sigs)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case sig := <-sigs:
				switch sig {
				case unix.SIGWINCH:
					sz := Size(o.Stdin, fileOf(o.Stdout))
					s.Resize(sz.Rows, sz.Cols)
				default:
					cancel(fmt.Errorf("forkd got %v: the guest process was killed: %w", sig, errdefs.ErrCanceled))
					s.Close()
					return
				}
			}
		}
	}()

	if o.Input {
		go func() {
			// Ends at the local EOF (not in raw mode, where ^D is a byte
			// for the guest) or when the session is over.
			if _, err := io.Copy(s, o.Stdin); err == nil {
				s.CloseStdin()
			}
		}()
	} else {
		s.CloseStdin()
	}

	exit, err := s.Wait(ctx, o.Stdout, o.Stderr)
	if err != nil && ctx.Err() != nil {
		if cause := context.Cause(ctx); !errors.Is(cause, context.Canceled) {
			err = cause
		} else {
			err = fmt.Errorf("interrupted: the guest process was killed: %w", errdefs.ErrCanceled)
		}
	}
	return exit, err
}

// fileOf is w as a file, if it is one (for its terminal size).
func fileOf(w io.Writer) *os.File {
	f, _ := w.(*os.File)
	return f
}

// ExitCode is the status forkd exits with for a guest exit (ExitStatus).
func ExitCode(e apiv1.ExecWSExit) int { return ExitStatus(e.ExitCode, e.Signal, e.TimedOut) }

// ExitStatus is the status forkd exits with for a guest process that
// exited with code, or was killed by signal ("SIGKILL" or "KILL"), or ran
// past its timeout: 124 for a timeout, 128+n for signal n (as docker and
// shells do), else the code.
func ExitStatus(code int, signal string, timedOut bool) int {
	switch {
	case timedOut:
		return 124
	case signal != "":
		name := strings.ToUpper(signal)
		if !strings.HasPrefix(name, "SIG") {
			name = "SIG" + name
		}
		if n := unix.SignalNum(name); n != 0 {
			return 128 + int(n)
		}
	}
	return code
}
