package cgroup

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/testutil"
)

// helperEnv makes the test binary act as a child process (see TestMain).
const helperEnv = "FORKD_CGROUP_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "hog":
		// Touch memory page by page until the OOM killer ends us; 1 GiB
		// is far past any limit the tests set.
		fmt.Println("hog: allocating")
		var keep [][]byte
		for range 1024 {
			b := make([]byte, 1<<20)
			for i := 0; i < len(b); i += 4096 {
				b[i] = 1
			}
			keep = append(keep, b)
		}
		fmt.Println("hog: survived", len(keep), "MiB")
		os.Exit(0)
	case "idle":
		fmt.Println("idle: up")
		time.Sleep(10 * time.Minute)
		os.Exit(0)
	case "spin":
		fmt.Println("spin: up")
		end := time.Now().Add(5 * time.Minute)
		for n := 0; ; n++ {
			if n%1_000_000 == 0 && time.Now().After(end) {
				os.Exit(0)
			}
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown helper", os.Getenv(helperEnv))
		os.Exit(2)
	}
}

// child is a helper process the test started and reaps.
type child struct {
	cmd  *exec.Cmd
	out  *testutil.SyncBuffer
	done chan struct{}
	err  error // Wait's, once done is closed
}

// helperCmd returns the command of a helper in mode ("hog", "idle",
// "spin"), or of argv when mode is "".
func helperCmd(mode string, argv ...string) *exec.Cmd {
	var cmd *exec.Cmd
	if mode != "" {
		cmd = exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"="+mode, "GOMAXPROCS=1")
	} else {
		cmd = exec.Command(argv[0], argv[1:]...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// startIn starts cmd in g (with Group.Start, or started plainly and then
// Group.Add when add is set) and reaps it in the background.
func startIn(t *testing.T, g *Group, cmd *exec.Cmd, add bool) *child {
	t.Helper()
	c := &child{cmd: cmd, out: &testutil.SyncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.out, c.out
	var err error
	if add {
		if err = cmd.Start(); err == nil {
			err = g.Add(cmd.Process.Pid)
		}
	} else {
		err = g.Start(cmd, nil)
	}
	if err != nil {
		if cmd.Process != nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
		t.Fatalf("start %v in %s: %v", cmd.Args, g.ID(), err)
	}
	go func() { c.err = cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-c.done
	})
	return c
}

// alive says whether the child has not exited.
func (c *child) alive() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// waitExit waits up to 60 s for the child to exit and returns its
// signal (0 when it exited normally).
func (c *child) waitExit(t *testing.T) syscall.Signal {
	t.Helper()
	select {
	case <-c.done:
	case <-time.After(60 * time.Second):
		t.Fatalf("%v did not exit within 60 s; output: %s", c.cmd.Args, c.out)
	}
	ws := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		return ws.Signal()
	}
	return 0
}

// fileOf reads file from whichever of g's directories has it.
func fileOf(t *testing.T, g *Group, file string) string {
	t.Helper()
	for _, d := range g.Dirs() {
		if b, err := os.ReadFile(filepath.Join(d, file)); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	t.Fatalf("no %s in %v", file, g.Dirs())
	return ""
}

func hasFile(g *Group, file string) bool {
	for _, d := range g.Dirs() {
		if exists(d, file) {
			return true
		}
	}
	return false
}

// inEveryDir says whether pid is listed in each of g's directories.
func inEveryDir(t *testing.T, g *Group, pid int) bool {
	t.Helper()
	for _, d := range g.Dirs() {
		pids, err := readPids(d)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(pids, pid) {
			return false
		}
	}
	return true
}

// cleanupManager removes every group and the parent groups at the end.
func cleanupManager(t *testing.T, m *Manager) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if _, err := m.Cleanup(ctx, nil); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		for _, d := range m.b.parents() {
			if err := m.ops.rmdir(d); err != nil {
				t.Errorf("remove parent %s: %v", d, err)
			}
		}
	})
}
