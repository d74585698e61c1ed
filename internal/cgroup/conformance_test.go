package cgroup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// suite describes a Manager under test for runConformance.
type suite struct {
	// newManager returns a Manager with a parent group of its own that
	// is removed when the test ends.
	newManager func(t *testing.T) *Manager
	// live: a real cgroupfs, so real processes and kernel enforcement
	// (OOM kill, pids, CPU quota) are tested. Otherwise only the
	// file-writing contract is, and oomKill fakes the kernel's counter.
	live    bool
	oomKill func(t *testing.T, g *Group)
}

func ctx60(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// runConformance is the behaviour every Manager must have, v1 or v2.
func runConformance(t *testing.T, s suite) {
	t.Run("InvalidLimits", func(t *testing.T) {
		m := s.newManager(t)
		_, err := m.Create("bad", Limits{MemoryBytes: 1000, CPUWeight: 20000, Pids: -1})
		if !errdefs.IsInvalidArgument(err) {
			t.Fatalf("Create with bad limits: %v, want invalid argument", err)
		}
		for _, want := range []string{"MemoryBytes=1000", "[1048576, 1125899906842624]", "CPUWeight=20000", "[1, 10000]", "Pids=-1"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not name %q", err, want)
			}
		}
		if _, err := m.Create("../escape", Limits{}); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Create(../escape): %v, want invalid argument", err)
		}
		if ids, _ := m.List(); len(ids) != 0 {
			t.Errorf("failed creates left groups %v", ids)
		}
	})

	t.Run("LimitsWritten", func(t *testing.T) {
		m := s.newManager(t)
		l := Limits{MemoryBytes: 48 << 20, CPUMillicores: 1500, CPUWeight: 250, Pids: 64}
		g, err := m.Create("limits", l)
		if err != nil {
			t.Fatal(err)
		}
		got, err := g.Limits()
		if err != nil {
			t.Fatal(err)
		}
		if got = defaultIO(got); got != l {
			t.Errorf("Limits() = %+v, want %+v", got, l)
		}
		checkLimitFiles(t, m, g, l)
		// The CPU quota changes while the group lives; out of range is
		// refused and changes nothing.
		if err := g.SetCPU(500); err != nil {
			t.Fatal(err)
		}
		l.CPUMillicores = 500
		if got, err := g.Limits(); err != nil || defaultIO(got) != l {
			t.Errorf("after SetCPU(500): %+v %v, want %+v", got, err, l)
		}
		checkLimitFiles(t, m, g, l)
		if err := g.SetCPU(5); !errdefs.IsInvalidArgument(err) {
			t.Errorf("SetCPU(5): %v, want invalid argument", err)
		}
		st, err := g.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if st.MemoryLimit != 48<<20 || st.OOMKills != 0 {
			t.Errorf("Stats() = %+v, want MemoryLimit 48 MiB and no OOM kills", st)
		}
		// No limits at all: nothing written, nothing in force.
		g0, err := m.Create("nolimits", Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := g0.Limits(); err != nil || defaultIO(got) != (Limits{CPUWeight: 100}) {
			t.Errorf("Limits() of an unlimited group = %+v, %v; want only the default weight 100", got, err)
		}
	})

	t.Run("IOWeight", func(t *testing.T) {
		m := s.newManager(t)
		io := controllerInfo(m, IO)
		g, err := m.Create("io", Limits{IOWeight: 200})
		if !io.Available {
			// No silent fallback: the limit is refused, naming why.
			if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "io") {
				t.Fatalf("Create with IOWeight where io is unavailable (%s): %v, want failed precondition", io.Detail, err)
			}
			t.Logf("io weight unavailable here, refused as it should be: %v", err)
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := g.Limits(); got.IOWeight != 200 {
			t.Errorf("IOWeight read back %d, want 200", got.IOWeight)
		}
	})

	t.Run("ExistsAndOpen", func(t *testing.T) {
		m := s.newManager(t)
		if _, err := m.Create("dup", Limits{}); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Create("dup", Limits{}); !errdefs.IsAlreadyExists(err) {
			t.Errorf("second Create: %v, want already exists", err)
		}
		if g, err := m.Open("dup"); err != nil || g.ID() != "dup" {
			t.Errorf("Open(dup) = %v, %v", g, err)
		}
		if _, err := m.Open("nope"); !errdefs.IsNotFound(err) {
			t.Errorf("Open(nope): %v, want not found", err)
		}
	})

	t.Run("DeleteRemovesDirs", func(t *testing.T) {
		m := s.newManager(t)
		g, err := m.Create("del", Limits{MemoryBytes: 16 << 20, Pids: 16})
		if err != nil {
			t.Fatal(err)
		}
		dirs := g.Dirs()
		if len(dirs) == 0 {
			t.Fatal("no directories")
		}
		if err := g.Delete(ctx60(t), false); err != nil {
			t.Fatal(err)
		}
		for _, d := range dirs {
			if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s still there after Delete (%v)", d, err)
			}
		}
		if err := g.Delete(ctx60(t), false); err != nil {
			t.Errorf("second Delete: %v", err)
		}
	})

	t.Run("Cleanup", func(t *testing.T) {
		m := s.newManager(t)
		var groups []*Group
		for _, id := range []string{"dead-a", "dead-b", "live-c"} {
			g, err := m.Create(id, Limits{Pids: 16})
			if err != nil {
				t.Fatal(err)
			}
			groups = append(groups, g)
		}
		var leftover *child
		if s.live {
			leftover = startIn(t, groups[1], helperCmd("", "sleep", "600"), false)
		}
		removed, err := m.Cleanup(ctx60(t), func(id string) bool { return id == "live-c" })
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(removed, []string{"dead-a", "dead-b"}) {
			t.Errorf("Cleanup removed %v, want [dead-a dead-b]", removed)
		}
		if ids, _ := m.List(); !slices.Equal(ids, []string{"live-c"}) {
			t.Errorf("List after Cleanup = %v, want [live-c]", ids)
		}
		if leftover != nil {
			if sig := leftover.waitExit(t); sig != syscall.SIGKILL {
				t.Errorf("leftover process ended by %v, want SIGKILL", sig)
			}
		}
	})

	t.Run("Add", func(t *testing.T) {
		m := s.newManager(t)
		g, err := m.Create("add", Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if !s.live {
			if err := g.Add(4242); err != nil {
				t.Fatal(err)
			}
			for _, d := range g.Dirs() {
				if got, _ := read(d, "cgroup.procs"); got != "4242" {
					t.Errorf("%s/cgroup.procs = %q, want 4242", d, got)
				}
				os.WriteFile(d+"/cgroup.procs", nil, 0o644) // the fake process is gone
			}
			return
		}
		c := startIn(t, g, helperCmd("", "sleep", "600"), true)
		if !inEveryDir(t, g, c.cmd.Process.Pid) {
			t.Errorf("pid %d not in every directory of %v", c.cmd.Process.Pid, g.Dirs())
		}
	})

	t.Run("OOMReported", func(t *testing.T) {
		if s.live {
			testOOMKillAlone(t, s.newManager(t))
			return
		}
		m := s.newManager(t)
		g, err := m.Create("oom", Limits{MemoryBytes: 32 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if k, err := g.OOMKilled(); err != nil || k {
			t.Fatalf("OOMKilled before any OOM = %v, %v", k, err)
		}
		events, err := g.WatchOOM(ctx60(t))
		if err != nil {
			t.Fatal(err)
		}
		s.oomKill(t, g)
		select {
		case n := <-events:
			if n != 1 {
				t.Errorf("WatchOOM sent %d, want 1", n)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("WatchOOM sent nothing within 60 s")
		}
		if k, err := g.OOMKilled(); err != nil || !k {
			t.Errorf("OOMKilled after the kill = %v, %v", k, err)
		}
	})

	if !s.live {
		return
	}
	t.Run("StartInside", func(t *testing.T) {
		m := s.newManager(t)
		g, err := m.Create("start", Limits{MemoryBytes: 64 << 20, Pids: 16})
		if err != nil {
			t.Fatal(err)
		}
		c := startIn(t, g, helperCmd("", "sleep", "600"), false)
		if !inEveryDir(t, g, c.cmd.Process.Pid) {
			t.Errorf("pid %d not in every directory of %v", c.cmd.Process.Pid, g.Dirs())
		}
		// The daemon's thread went back: nothing of this process is in it.
		procs, _ := g.Procs()
		if slices.Contains(procs, os.Getpid()) || len(procs) != 1 {
			t.Errorf("group holds %v, want only %d", procs, c.cmd.Process.Pid)
		}
		// Inside from the first instruction: a process that reads its own
		// cgroups at once already sees the group in every hierarchy.
		cat := startIn(t, g, helperCmd("", "cat", "/proc/self/cgroup"), false)
		if sig := cat.waitExit(t); sig != 0 {
			t.Fatalf("cat ended by %v", sig)
		}
		in := 0
		for _, line := range strings.Split(cat.out.String(), "\n") {
			if strings.HasSuffix(line, "/"+filepath.Base(filepath.Dir(g.Dirs()[0]))+"/start") {
				in++
			}
		}
		if in != len(g.Dirs()) {
			t.Errorf("a started process saw itself in %d of the group's %d hierarchies:\n%s", in, len(g.Dirs()), cat.out)
		}
		if err := g.Delete(ctx60(t), false); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("Delete without kill of a busy group: %v, want failed precondition", err)
		}
		if err := g.Delete(ctx60(t), true); err != nil {
			t.Fatal(err)
		}
		if sig := c.waitExit(t); sig != syscall.SIGKILL {
			t.Errorf("process ended by %v, want SIGKILL", sig)
		}
		for _, d := range g.Dirs() {
			if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s still there after Delete", d)
			}
		}
	})
	t.Run("PidsMax", func(t *testing.T) { testPidsMax(t, s.newManager(t)) })
	t.Run("CPUQuota", func(t *testing.T) { testCPUQuota(t, s.newManager(t)) })
}

// defaultIO reads the default I/O weight as unset.
func defaultIO(l Limits) Limits {
	if l.IOWeight == 100 {
		l.IOWeight = 0
	}
	return l
}

func controllerInfo(m *Manager, c Controller) ControllerInfo {
	for _, i := range m.Controllers() {
		if i.Controller == c {
			return i
		}
	}
	return ControllerInfo{}
}

// checkLimitFiles checks the exact contents of the control files.
func checkLimitFiles(t *testing.T, m *Manager, g *Group, l Limits) {
	t.Helper()
	mem := strconv.FormatInt(l.MemoryBytes, 10)
	want := map[string]string{}
	switch m.Mode() {
	case ModeV2:
		want["memory.max"] = mem
		want["cpu.max"] = fmt.Sprintf("%d 100000", l.CPUMillicores*100)
		want["cpu.weight"] = "250"
		want["pids.max"] = "64"
		if hasFile(g, "memory.swap.max") {
			want["memory.swap.max"] = "0"
		}
		if hasFile(g, "memory.oom.group") {
			want["memory.oom.group"] = "1"
		}
	default:
		want["memory.limit_in_bytes"] = mem
		if hasFile(g, "memory.memsw.limit_in_bytes") {
			want["memory.memsw.limit_in_bytes"] = mem
		} else {
			want["memory.swappiness"] = "0"
		}
		want["cpu.cfs_period_us"] = "100000"
		want["cpu.cfs_quota_us"] = strconv.FormatInt(l.CPUMillicores*100, 10)
		want["cpu.shares"] = "2560"
		want["pids.max"] = "64"
		if oc := fileOf(t, g, "memory.oom_control"); !strings.Contains(oc, "oom_kill_disable 0") {
			t.Errorf("memory.oom_control = %q, want the OOM killer enabled", oc)
		}
	}
	for f, v := range want {
		if got := fileOf(t, g, f); got != v {
			t.Errorf("%s = %q, want %q", f, got, v)
		}
	}
}
