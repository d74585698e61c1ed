package reaper

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func start(t *testing.T, script string) *Process {
	t.Helper()
	// Not the test's stdout: go test waits for every holder of it to exit.
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	p, err := Default().Start("/bin/sh", []string{"sh", "-c", script}, &syscall.ProcAttr{
		Env:   []string{"PATH=/usr/bin:/bin"},
		Files: []uintptr{null.Fd(), null.Fd(), null.Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		t.Fatalf("start %q: %v", script, err)
	}
	return p
}

// waitTimeout waits for p; d only bounds a hang (keep it generous: a
// loaded machine is slow to run and reap processes).
func waitTimeout(t *testing.T, p *Process, d time.Duration) Status {
	t.Helper()
	select {
	case <-p.Done():
		return p.Wait()
	case <-time.After(d):
		t.Fatalf("pid %d did not end within %v", p.Pid, d)
		return Status{}
	}
}

func TestExitStatuses(t *testing.T) {
	if st := waitTimeout(t, start(t, "exit 3"), time.Minute); st.ExitCode() != 3 || st.Signal() != "" {
		t.Errorf("exit 3: got %v", st)
	}
	// Exits before the caller gets to wait: the status must not be lost.
	p := start(t, "true")
	time.Sleep(50 * time.Millisecond)
	if st := waitTimeout(t, p, time.Minute); st.ExitCode() != 0 {
		t.Errorf("true: got %v", st)
	}
	p = start(t, "exec sleep 30")
	if err := p.Signal(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if st := waitTimeout(t, p, time.Minute); st.Signal() != "SIGKILL" || st.ExitCode() != 137 {
		t.Errorf("killed: got %v (code %d)", st, st.ExitCode())
	}
	if err := p.Signal(unix.SIGKILL); err != os.ErrProcessDone {
		t.Errorf("Signal after reap = %v, want ErrProcessDone", err)
	}
}

func TestManyConcurrent(t *testing.T) {
	const n = 50
	ps := make([]*Process, n)
	for i := range ps {
		ps[i] = start(t, "exit "+strconv.Itoa(i%7))
	}
	for i, p := range ps {
		if st := waitTimeout(t, p, time.Minute); st.ExitCode() != i%7 {
			t.Errorf("process %d: %v, want exit %d", i, st, i%7)
		}
	}
}

func TestKillGroupReachesBackgroundChildren(t *testing.T) {
	p := start(t, "sleep 100 & sleep 100 & echo $! > /dev/null; wait")
	waitMembers(t, p.Pid, 3, "sh + 2 sleeps")
	if err := p.KillGroup(unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitTimeout(t, p, time.Minute)
	deadline := time.Now().Add(time.Minute)
	for len(groupMembers(t, p.Pid)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("group %d still has members %v", p.Pid, groupMembers(t, p.Pid))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitMembers waits until process group pgid has at least n live members.
func waitMembers(t *testing.T, pgid, n int, what string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for len(groupMembers(t, pgid)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("group %d: members %v, want %s", pgid, groupMembers(t, pgid), what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestOrphansAreReaped(t *testing.T) {
	if err := BecomeSubreaper(); err != nil {
		t.Skipf("PR_SET_CHILD_SUBREAPER: %v", err)
	}
	before := Default().Orphans()
	// The shell exits at once; its background child is reparented to us
	// and exits later: nobody registered it, the reaper must still reap it.
	pidFile := filepath.Join(t.TempDir(), "pid")
	p := start(t, "(sleep 0.2; exit 5) & echo $! > "+pidFile)
	waitTimeout(t, p, time.Minute)
	b, _ := os.ReadFile(pidFile)
	orphan, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("orphan pid %q: %v", b, err)
	}
	// Reaped: its /proc entry (a zombie's too) is gone. Zombies of other
	// exiting processes may show for a moment, hence the wait for none.
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := os.Stat("/proc/" + strconv.Itoa(orphan))
		if os.IsNotExist(err) && Default().Orphans() > before && len(zombies(t)) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("orphan %d not reaped (stat: %v; orphans reaped %d, %d before); zombie children: %v",
				orphan, err, Default().Orphans(), before, zombies(t))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// groupMembers lists live (non-zombie) processes in process group pgid.
func groupMembers(t *testing.T, pgid int) []int {
	var out []int
	forEachProc(t, func(pid int, state byte, ppid, pg int) {
		if pg == pgid && state != 'Z' {
			out = append(out, pid)
		}
	})
	return out
}

// zombies lists zombie children of this process.
func zombies(t *testing.T) []int {
	var out []int
	me := os.Getpid()
	forEachProc(t, func(pid int, state byte, ppid, _ int) {
		if ppid == me && state == 'Z' {
			out = append(out, pid)
		}
	})
	return out
}

func forEachProc(t *testing.T, f func(pid int, state byte, ppid, pgid int)) {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(s[i+1:]) // state ppid pgrp ...
		if len(fields) < 3 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		pgid, _ := strconv.Atoi(fields[2])
		f(pid, fields[0][0], ppid, pgid)
	}
}

// SignalGroup reaches the group while its leader is unreaped and refuses
// once it is: the leader's pid (the group id) may then be reused by
// another process group. KillGroup still reaches what the leader left.
func TestSignalGroupOnlyWhileLeaderUnreaped(t *testing.T) {
	p := start(t, "sleep 100 & exec sleep 100")
	waitMembers(t, p.Pid, 2, "the leader and a background sleep")
	if err := p.SignalGroup(0); err != nil {
		t.Fatalf("running leader: %v", err)
	}
	if err := p.Signal(unix.SIGKILL); err != nil { // the leader only
		t.Fatal(err)
	}
	waitTimeout(t, p, time.Minute)
	if err := p.SignalGroup(unix.SIGKILL); err != os.ErrProcessDone {
		t.Fatalf("reaped leader: %v, want os.ErrProcessDone", err)
	}
	if len(groupMembers(t, p.Pid)) == 0 {
		t.Fatal("the background sleep is gone; the group should outlive its leader")
	}
	if err := p.KillGroup(unix.SIGKILL); err != nil {
		t.Fatalf("KillGroup after the leader: %v", err)
	}
}
