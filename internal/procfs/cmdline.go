package procfs

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"time"
)

// ErrNoCmdline: the process's command line read empty. A kernel thread
// and an exited process have none; a process in the middle of execve has
// none for a moment (the close-on-exec pipe that tells exec.Cmd.Start the
// exec happened closes before the new program's argument area is set up).
var ErrNoCmdline = errors.New("empty command line")

// ReadCmdline returns the arguments of process pid, read from
// /proc/PID/cmdline. An empty command line is ErrNoCmdline.
func ReadCmdline(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, err
	}
	return ParseCmdline(b)
}

// ParseCmdline splits the NUL-separated contents of /proc/PID/cmdline.
func ParseCmdline(b []byte) ([]string, error) {
	if len(b) == 0 {
		return nil, ErrNoCmdline
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), nil
}

// cmdlineSettle bounds WaitCmdline when ctx has no earlier deadline: an
// exec in progress sets the argument area within microseconds, even on a
// loaded machine well within this.
const cmdlineSettle = 5 * time.Second

// WaitCmdline reads pid's command line, reading it again while it is empty
// (a process just started, still in execve) until it is not, ctx ends, or
// 5 s pass. Any other error returns at once. A process whose command line
// stays empty (a kernel thread, or one that exited) is ErrNoCmdline.
func WaitCmdline(ctx context.Context, pid int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdlineSettle)
	defer cancel()
	delay := 100 * time.Microsecond
	for {
		args, err := ReadCmdline(pid)
		if !errors.Is(err, ErrNoCmdline) {
			return args, err
		}
		if st, serr := ReadStat(pid); serr != nil || st.Exited() || st.Flags&PFKthread != 0 {
			return nil, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		delay = min(2*delay, 50*time.Millisecond)
	}
}
