package termio

import (
	"errors"
	"os"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestExitCode(t *testing.T) {
	for _, c := range []struct {
		exit apiv1.ExecWSExit
		want int
	}{
		{apiv1.ExecWSExit{ExitCode: 0}, 0},
		{apiv1.ExecWSExit{ExitCode: 3}, 3},
		{apiv1.ExecWSExit{ExitCode: 130, Signal: "SIGINT"}, 130},
		{apiv1.ExecWSExit{ExitCode: 137, Signal: "KILL"}, 137},
		{apiv1.ExecWSExit{ExitCode: -1, Signal: "term"}, 143},
		{apiv1.ExecWSExit{ExitCode: 137, Signal: "SIGKILL", TimedOut: true}, 124},
	} {
		if got := ExitCode(c.exit); got != c.want {
			t.Errorf("%+v: %d, want %d", c.exit, got, c.want)
		}
	}
}

// -it needs a terminal on stdin; -i or -t alone do not.
func TestCheckTTY(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := CheckTTY(Options{Stdin: r, Input: true, TTY: true}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("-it on a pipe: %v", err)
	}
	for _, o := range []Options{{Stdin: r, Input: true}, {Stdin: r, TTY: true}} {
		if err := CheckTTY(o); err != nil {
			t.Fatalf("%+v: %v", o, err)
		}
	}
	if got := Size(r); got != DefaultSize {
		t.Fatalf("size of a pipe %+v, want the default", got)
	}
}
