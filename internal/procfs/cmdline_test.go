package procfs

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"slices"
	"testing"
)

func TestParseCmdline(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"a\x00-b\x00c d\x00", []string{"a", "-b", "c d"}},
		{"a", []string{"a"}}, // a process that rewrote its arguments
		{"a\x00\x00", []string{"a", ""}},
	} {
		got, err := ParseCmdline([]byte(c.in))
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("ParseCmdline(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	if got, err := ParseCmdline(nil); !errors.Is(err, ErrNoCmdline) {
		t.Errorf("empty command line = %q, %v", got, err)
	}
}

// TestWaitCmdlineJustStarted: a process read at once after exec.Cmd.Start
// (when its command line may still be empty) is seen with its arguments.
func TestWaitCmdlineJustStarted(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	for i := 0; i < 20; i++ {
		cmd := exec.Command(sh, "-c", "read x", "just-started")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		args, err := WaitCmdline(context.Background(), cmd.Process.Pid)
		stdin.Close()
		cmd.Wait()
		if err != nil || !slices.Contains(args, "just-started") {
			t.Fatalf("command line of a just-started process = %q, %v", args, err)
		}
	}
}

func TestWaitCmdlineKernelThreadAndSelf(t *testing.T) {
	// pid 2 is kthreadd where this runs in the root pid namespace.
	if st, err := ReadStat(2); err == nil && st.Flags&PFKthread != 0 {
		if args, err := WaitCmdline(context.Background(), 2); !errors.Is(err, ErrNoCmdline) {
			t.Errorf("kernel thread's command line = %q, %v", args, err)
		}
	}
	args, err := WaitCmdline(context.Background(), os.Getpid())
	if err != nil || len(args) == 0 || args[0] != os.Args[0] {
		t.Errorf("own command line = %q, %v", args, err)
	}
	if _, err := WaitCmdline(context.Background(), -1); err == nil || errors.Is(err, ErrNoCmdline) {
		t.Errorf("pid -1: %v", err)
	}
}
