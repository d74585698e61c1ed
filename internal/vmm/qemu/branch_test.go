package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/memlayer"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/testutil/testguest"
	"github.com/forkd-dev/forkd/internal/vmm"
	"github.com/forkd-dev/forkd/internal/vmm/qemu/migstream"
)

// The tests in this file branch running clones of real TCG microVMs.

// source is what a machine is restored from.
type source struct {
	image   vmm.Image
	mem     string
	state   string
	nic     bool // the snapshot has a NIC: every restore needs one
	memMiB  int
	runRoot string // directory for run directories
}

// restore prepares and restores a machine from src and connects its agent.
func (src source) restore(t *testing.T, d *Driver, id string) (*Machine, *testguest.Agent) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	cfg := vmm.MachineConfig{
		ID:         id,
		RunDir:     filepath.Join(src.runRoot, id),
		Image:      src.image,
		MemoryMiB:  src.memMiB,
		MemoryFile: src.mem,
	}
	if src.nic {
		ns, err := netns.Create(ctx, fmt.Sprintf("forkd-qb-%d-%s", os.Getpid(), id), netns.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Remove() })
		cfg.Network = &vmm.Network{NetNSPath: ns.Path(), TapName: ns.TapName(), MAC: netns.GuestMAC}
	}
	vm, err := d.Prepare(ctx, vmm.PrepareSpec{MachineConfig: cfg, StateFile: src.state})
	if err != nil {
		t.Fatal(err)
	}
	m := vm.(*Machine)
	t.Cleanup(func() { m.Kill(); <-m.Done() })
	conn, err := m.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := testguest.NewAgent(conn)
	t.Cleanup(func() { a.Close() })
	if _, err := m.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	r, err := a.Call("ping", callTimeout)
	// A branch taken while the source's test agent was in the middle of a
	// command restores into a guest that finishes it: its reply comes
	// first. (The real agent's HELLO/READY handshake discards such bytes;
	// this line protocol has none.)
	for i := 0; i < 3 && err == nil && r != "pong"; i++ {
		t.Logf("%s: leftover reply %q before pong", id, r)
		r, err = a.ReadLine(callTimeout)
	}
	if err != nil || r != "pong" {
		t.Fatalf("%s ping: %q %v\n%s", id, r, err, m.ConsoleTail(2000))
	}
	return m, a
}

// from is the source a branch result restores from.
func (src source) from(res vmm.SnapshotResult) source {
	src.mem, src.state = res.MemoryFile, res.StateFile
	return src
}

func call(t *testing.T, a *testguest.Agent, line, want string) {
	t.Helper()
	r, err := a.Call(line, callTimeout)
	if err != nil || r != want {
		t.Fatalf("%q: %q %v, want %q", line, r, err, want)
	}
}

func (f *fixture) source() source {
	return source{image: f.image, mem: f.memFile, state: f.state, nic: true, memMiB: testMemMiB, runRoot: f.dir}
}

// branchSpec names a branch's files in dir.
func branchSpec(dir, name string, typ vmm.SnapshotType) vmm.SnapshotSpec {
	return vmm.SnapshotSpec{
		Type:          typ,
		StateFile:     filepath.Join(dir, name+".state"),
		MemoryFile:    filepath.Join(dir, name+".mem"),
		PageIndexFile: filepath.Join(dir, name+".pages"),
	}
}

// checkRunning checks that a machine's guest runs and answers.
func checkRunning(t *testing.T, m *Machine, a *testguest.Agent, wantState string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var st struct{ Status string }
	if err := m.QMP().Execute(ctx, "query-status", nil, &st); err != nil || st.Status != "running" {
		t.Fatalf("%s: status %q %v", m.ID(), st.Status, err)
	}
	m.mu.Lock()
	s := m.state
	m.mu.Unlock()
	if s != stateRunning {
		t.Errorf("%s: machine state %s", m.ID(), s)
	}
	call(t, a, "get", "state="+wantState)
}

// checkBranchFiles checks a branch's output: a sparse memory file of the
// guest's size, a small state file of the right structure whose small RAM
// blocks hold what the template's do.
func checkBranchFiles(t *testing.T, res vmm.SnapshotResult, memMiB int, tmplState string) {
	t.Helper()
	st, err := os.Stat(res.MemoryFile)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != int64(memMiB)<<20 {
		t.Errorf("memory file %d bytes", st.Size())
	}
	alloc, _ := allocatedBytes(res.MemoryFile)
	if alloc >= st.Size() {
		t.Errorf("memory file not sparse: %d of %d bytes allocated", alloc, st.Size())
	}
	sst, err := os.Stat(res.StateFile)
	if err != nil {
		t.Fatal(err)
	}
	if sst.Size() < 10<<10 || sst.Size() > 1<<20 {
		t.Errorf("state file %d bytes", sst.Size())
	}
	data, err := os.ReadFile(res.StateFile)
	if err != nil {
		t.Fatal(err)
	}
	got := streamBlockPages(t, data)
	tmpl, err := os.ReadFile(tmplState)
	if err != nil {
		t.Fatal(err)
	}
	want := streamBlockPages(t, tmpl)
	if len(got["mem"]) != 0 {
		t.Errorf("state file holds %d guest memory pages", len(got["mem"]))
	}
	delete(want, "mem")
	if len(want) == 0 {
		t.Fatal("template state has no firmware blocks")
	}
	for block, pages := range want {
		for p, data := range pages {
			if g, ok := got[block][p]; !ok || !slices.Equal(g, data) {
				t.Errorf("block %s page %d differs from the template's (present %v)", block, p, ok)
			}
		}
	}
	t.Logf("files: memory %d MiB, %.1f MiB allocated; state %d bytes", st.Size()>>20, float64(alloc)/(1<<20), sst.Size())
}

func checkTemplateUnchanged(t *testing.T, path, hash string) {
	t.Helper()
	after, err := fileHash(path)
	if err != nil {
		t.Fatal(err)
	}
	if after != hash {
		t.Errorf("template memory file %s changed", path)
	}
}

// TestBranchPrefixMatchesQEMU checks the configuration and ram start
// section that diff and full branches write against QEMU's own (the
// template's state file).
func TestBranchPrefixMatchesQEMU(t *testing.T) {
	f := template(t)
	d := newTestDriver(t, Config{RunAs: "nobody"})
	c, _ := f.source().restore(t, d, "pfx")
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var info string
	if err := c.QMP().Execute(ctx, "human-monitor-command", map[string]string{"command-line": "info ramblock"}, &info); err != nil {
		t.Fatal(err)
	}
	blocks, err := parseRAMBlocks(info)
	if err != nil {
		t.Fatal(err)
	}
	// Header, configuration and start section, up to the start footer:
	// its length and the start section's header.
	startEnd := func(b []byte) (int, migstream.SectionHeader) {
		sr := migstream.NewReader(strings.NewReader(string(b)))
		sr.Header()
		sr.SectionType()
		sr.Config()
		ty, _ := sr.SectionType()
		h, err := sr.SectionHeader(ty)
		if err != nil || h.Name != migstream.RAMSection {
			t.Fatalf("first section %+v, %v; want %s", h, err, migstream.RAMSection)
		}
		for {
			rec, err := sr.Record()
			if err != nil {
				t.Fatal(err)
			}
			if rec.Flags&migstream.FlagEOS != 0 {
				break
			}
			if rec.Flags&migstream.FlagMemSize != 0 {
				sr.BlockList(rec.Offset, true)
			}
		}
		sr.Footer(h.ID)
		return int(sr.Offset()), h
	}
	tmpl, err := os.ReadFile(f.state)
	if err != nil {
		t.Fatal(err)
	}
	n, ramHdr := startEnd(tmpl)
	// The ram section's id is QEMU's registration order, which differs
	// between versions (see ramSectionID): use the template's.
	var buf strings.Builder
	sw := migstream.NewWriter(&buf)
	writeBranchPrefix(sw, ramHdr.ID, blocks, nil)
	sw.Flush()
	ours := []byte(buf.String())
	k, _ := startEnd(ours)
	if n != k || string(tmpl[:n]) != string(ours[:k]) {
		t.Errorf("prefix differs from QEMU's:\n qemu %x\n ours %x", tmpl[:n], ours[:k])
	}
}

// TestBranchDiff branches a clone of the shared (disk-backed) template in
// diff mode, restores a grandchild from it, branches that one again, and
// measures the pause of an idle clone.
func TestBranchDiff(t *testing.T) {
	f := template(t)
	d := newTestDriver(t, Config{RunAs: "nobody"})
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	dir := shortDir(t, "forkd-branch")
	t.Cleanup(func() { os.RemoveAll(dir) })
	src := f.source()
	c, ca := src.restore(t, d, "bd")
	call(t, ca, "set before-branch", "ok")

	spec := branchSpec(dir, "b1", vmm.SnapshotDiff)
	res, err := c.Snapshot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("diff branch: paused %v, total %v, %d bytes written, %d dirty pages", res.Paused, res.Duration, res.BytesWritten, res.DirtyPages)
	if res.StateFile != spec.StateFile || res.MemoryFile != spec.MemoryFile || res.PageIndexFile != spec.PageIndexFile ||
		res.Paused <= 0 || res.Duration < res.Paused || res.DirtyPages <= 0 || res.BytesWritten <= res.DirtyPages*pageSize {
		t.Errorf("result %+v", res)
	}
	// The clone runs on, with its state; later changes are its own.
	checkRunning(t, c, ca, "before-branch")
	call(t, ca, "set after-branch", "ok")
	call(t, ca, "run echo clone-file > /tmp/later", "")

	checkBranchFiles(t, res, testMemMiB, f.state)
	ix, err := memlayer.ReadFile(res.PageIndexFile)
	if err != nil {
		t.Fatal(err)
	}
	if int64(ix.Pages()) != res.DirtyPages || ix.MemorySize != testMemMiB<<20 {
		t.Errorf("index: %d pages of %d bytes, result %d pages", ix.Pages(), ix.MemorySize, res.DirtyPages)
	}
	// Every page outside the index is the template's.
	checkOnlyIndexedDiffer(t, f.memFile, res.MemoryFile, ix)

	g, ga := src.from(res).restore(t, d, "bdg")
	checkRunning(t, g, ga, "before-branch")
	call(t, ga, "run cat /tmp/later 2>/dev/null || echo none", "none ")
	call(t, ga, "set grandchild", "ok")
	call(t, ca, "get", "state=after-branch")
	waitFor(t, callTimeout, func() bool { return ticksAfterRestore(g.ConsoleTail(4096)) >= 2 }, "grandchild console ticking")

	// Depth 2: a branch of the grandchild.
	res2, err := g.Snapshot(ctx, branchSpec(dir, "b2", vmm.SnapshotDiff))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("depth-2 diff branch: paused %v, total %v, %d dirty pages", res2.Paused, res2.Duration, res2.DirtyPages)
	call(t, ga, "set grandchild-later", "ok")
	gg, gga := src.from(res2).restore(t, d, "bdgg")
	checkRunning(t, gg, gga, "grandchild")
	checkBranchFiles(t, res2, testMemMiB, f.state)

	// The pause of an idle clone, a few times (logged, not checked: on a
	// busy machine it measures the load; TestBranchMeasurements measures).
	var pauses []time.Duration
	for i := range 5 {
		time.Sleep(300 * time.Millisecond)
		r, err := c.Snapshot(ctx, branchSpec(dir, fmt.Sprintf("idle%d", i), vmm.SnapshotDiff))
		if err != nil {
			t.Fatal(err)
		}
		pauses = append(pauses, r.Paused)
		t.Logf("idle diff branch %d: paused %v, total %v, %d dirty pages, %d bytes", i, r.Paused, r.Duration, r.DirtyPages, r.BytesWritten)
	}
	// The pagemap fallback finds the same kind of set.
	forcePagemapRead = true
	r, err := c.Snapshot(ctx, branchSpec(dir, "fallback", vmm.SnapshotDiff))
	forcePagemapRead = false
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("idle diff branch, pagemap read: paused %v, %d dirty pages", r.Paused, r.DirtyPages)
	if r.DirtyPages < res.DirtyPages/2 {
		t.Errorf("pagemap fallback found %d pages, PAGEMAP_SCAN %d", r.DirtyPages, res.DirtyPages)
	}
	fb, fba := src.from(r).restore(t, d, "bdfb")
	checkRunning(t, fb, fba, "after-branch")
	sort.Slice(pauses, func(i, j int) bool { return pauses[i] < pauses[j] })
	t.Logf("idle diff pauses: %v (median %v)", pauses, pauses[len(pauses)/2])
	checkRunning(t, c, ca, "after-branch")
	checkTemplateUnchanged(t, f.memFile, f.memHash)
}

// checkOnlyIndexedDiffer compares two memory images page by page: pages
// outside the index must be equal.
func checkOnlyIndexedDiffer(t *testing.T, base, branch string, ix *memlayer.Index) {
	t.Helper()
	a, err := os.ReadFile(base)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(branch)
	if err != nil {
		t.Fatal(err)
	}
	var differ, outside int
	for p := 0; p < len(a)/pageSize; p++ {
		if string(a[p*pageSize:(p+1)*pageSize]) != string(b[p*pageSize:(p+1)*pageSize]) {
			differ++
			if !ix.Contains(uint64(p)) {
				outside++
			}
		}
	}
	t.Logf("%d pages differ from the template, %d indexed", differ, ix.Pages())
	if outside > 0 {
		t.Errorf("%d differing pages are not in the index", outside)
	}
}

// TestBranchFull branches a clone by copying all of its RAM.
func TestBranchFull(t *testing.T) {
	f := template(t)
	d := newTestDriver(t, Config{RunAs: "nobody"})
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	dir := shortDir(t, "forkd-branch")
	t.Cleanup(func() { os.RemoveAll(dir) })
	src := f.source()
	c, ca := src.restore(t, d, "bf")
	call(t, ca, "set full-before", "ok")
	spec := branchSpec(dir, "f1", vmm.SnapshotFull)
	spec.PageIndexFile = ""
	res, err := c.Snapshot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("full branch: paused %v, total %v, %d bytes written, %d pages copied while paused", res.Paused, res.Duration, res.BytesWritten, res.DirtyPages)
	if res.Paused <= 0 || res.DirtyPages <= 0 || res.PageIndexFile != "" {
		t.Errorf("result %+v", res)
	}
	checkRunning(t, c, ca, "full-before")
	call(t, ca, "set full-after", "ok")
	checkBranchFiles(t, res, testMemMiB, f.state)
	g, ga := src.from(res).restore(t, d, "bfg")
	checkRunning(t, g, ga, "full-before")
	call(t, ca, "get", "state=full-after")
	// The guest memory is the clone's: equal to the template's wherever
	// the clone did not write (compare with a diff branch taken now).
	// That the running guests do not write to the template's file is a
	// negative check: nothing tells that they did not, so they get a moment.
	time.Sleep(200 * time.Millisecond)
	checkTemplateUnchanged(t, f.memFile, f.memHash)

	// A clone whose memory file was renamed away and removed after it
	// mapped it (what forkd rmi does to its snapshot) still branches full:
	// its mappings are found by the file's identity when it started.
	own := src
	own.mem = filepath.Join(dir, "own.mem")
	copyMemoryFile(t, f.memFile, own.mem)
	o, oa := own.restore(t, d, "bfo")
	call(t, oa, "set orphaned", "ok")
	if err := os.Rename(own.mem, own.mem+".trash"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(own.mem + ".trash"); err != nil {
		t.Fatal(err)
	}
	spec = branchSpec(dir, "f2", vmm.SnapshotFull)
	spec.PageIndexFile = ""
	res, err = o.Snapshot(ctx, spec)
	if err != nil {
		t.Fatalf("full branch of a clone whose memory file was removed: %v", err)
	}
	checkRunning(t, o, oa, "orphaned")
	og, oga := src.from(res).restore(t, d, "bfog")
	checkRunning(t, og, oga, "orphaned")
}

// copyMemoryFile makes dst a sparse copy of the memory file src that the
// test's unprivileged QEMU can map.
func copyMemoryFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		t.Fatal(err)
	}
	out, err := os.OpenFile(dst, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := fsutil.CopySparse(out, in, st.Size()); err != nil {
		t.Fatal(err)
	}
}

// TestBranchFailures checks that a failed branch leaves the clone running
// and no files behind.
func TestBranchFailures(t *testing.T) {
	f := template(t)
	d := newTestDriver(t, Config{RunAs: "nobody"})
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	dir := shortDir(t, "forkd-branch")
	t.Cleanup(func() { os.RemoveAll(dir) })
	c, ca := f.source().restore(t, d, "bx")
	call(t, ca, "set steady", "ok")
	gone := func(spec vmm.SnapshotSpec) {
		t.Helper()
		for _, p := range []string{spec.StateFile, spec.MemoryFile, spec.PageIndexFile} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("%s left behind: %v", p, err)
			}
		}
	}
	// Bad arguments.
	for _, spec := range []vmm.SnapshotSpec{
		{Type: vmm.SnapshotDiff, StateFile: filepath.Join(dir, "s")},
		{Type: vmm.SnapshotDiff, StateFile: filepath.Join(dir, "s"), MemoryFile: f.memFile},
		{Type: "bogus", StateFile: filepath.Join(dir, "s"), MemoryFile: filepath.Join(dir, "m")},
	} {
		if _, err := c.Snapshot(ctx, spec); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%+v: %v", spec, err)
		}
	}
	// The memory file must be new: an existing one is left alone.
	existing := filepath.Join(dir, "existing.mem")
	if err := os.WriteFile(existing, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := branchSpec(dir, "e", vmm.SnapshotDiff)
	spec.MemoryFile = existing
	if _, err := c.Snapshot(ctx, spec); !errdefs.IsAlreadyExists(err) {
		t.Errorf("existing memory file: %v", err)
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep" {
		t.Errorf("existing memory file changed: %q", b)
	}
	// A disk-backed clone cannot branch live.
	if err := c.LiveBranchSupport(); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("LiveBranchSupport of a disk-backed clone: %v", err)
	}
	if _, err := c.Snapshot(ctx, branchSpec(dir, "live", vmm.SnapshotLive)); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("live branch of a disk-backed clone: %v", err)
	}
	checkRunning(t, c, ca, "steady")

	// Failures while the guest is stopped, and after.
	for _, point := range []string{"stopped", "resumed"} {
		for _, mode := range []vmm.SnapshotType{vmm.SnapshotDiff, vmm.SnapshotFull} {
			branchHook = func(p string) error {
				if p == point {
					return errors.New("injected failure at " + p)
				}
				return nil
			}
			spec := branchSpec(dir, "fail", mode)
			_, err := c.Snapshot(ctx, spec)
			branchHook = nil
			if err == nil || !strings.Contains(err.Error(), "injected") {
				t.Errorf("%s at %s: %v", mode, point, err)
			}
			checkRunning(t, c, ca, "steady")
			gone(spec)
		}
	}
	// An unwritable target: the state file's directory does not exist (it
	// is written after the pause, so the memory is copied first).
	spec = branchSpec(dir, "x", vmm.SnapshotDiff)
	spec.StateFile = filepath.Join(dir, "missing", "x.state")
	if _, err := c.Snapshot(ctx, spec); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing directory: %v", err)
	}
	checkRunning(t, c, ca, "steady")
	gone(spec)
	// A target on a read-only file system: fails before the pause.
	spec = branchSpec(dir, "y", vmm.SnapshotFull)
	spec.MemoryFile = "/proc/forkd-branch.mem"
	if _, err := c.Snapshot(ctx, spec); err == nil {
		t.Error("branch to /proc succeeded")
	}
	checkRunning(t, c, ca, "steady")
	// After all that, a branch still works.
	res, err := c.Snapshot(ctx, branchSpec(dir, "ok", vmm.SnapshotDiff))
	if err != nil {
		t.Fatal(err)
	}
	g, ga := f.source().from(res).restore(t, d, "bxg")
	checkRunning(t, g, ga, "steady")
}

// shmTemplate boots a template whose memory file is on tmpfs, with a
// driver that runs QEMU as root: what live branches need.
type shmFixture struct {
	src  source
	hash string
	d    *Driver
}

func buildShmTemplate(t *testing.T) *shmFixture {
	t.Helper()
	f := template(t) // the image
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Skip("no /dev/shm")
	}
	shm, err := os.MkdirTemp("/dev/shm", "forkd-branch-")
	if err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { os.RemoveAll(shm) })
	run := shortDir(t, "forkd-live")
	t.Cleanup(func() { os.RemoveAll(run) })
	d := newTestDriver(t, Config{}) // root: userfaultfd
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	src := source{image: f.image, mem: filepath.Join(shm, "t.mem"), state: filepath.Join(shm, "t.state"), memMiB: testMemMiB, runRoot: run}
	m, err := d.Boot(ctx, vmm.BootSpec{MachineConfig: vmm.MachineConfig{
		ID: "shmtmpl", RunDir: filepath.Join(run, "tmpl"), Image: f.image, MemoryMiB: testMemMiB, MemoryFile: src.mem,
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Kill()
	conn, err := m.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := testguest.NewAgent(conn)
	if r, err := a.Call("ping", vmTimeout); err != nil || r != "pong" { // the boot
		t.Fatalf("shm template agent: %q %v\n%s", r, err, m.ConsoleTail(2000))
	}
	call(t, a, "set shm-template", "ok")
	a.Close()
	if _, err := m.Snapshot(ctx, vmm.SnapshotSpec{StateFile: src.state, StopAfter: true}); err != nil {
		t.Fatal(err)
	}
	h, err := fileHash(src.mem)
	if err != nil {
		t.Fatal(err)
	}
	return &shmFixture{src: src, hash: h, d: d}
}

// TestBranchLive branches a clone with QEMU's background-snapshot while
// it keeps running, and branches the same clone in diff mode (memory on
// tmpfs), checking the grandchildren of both.
func TestBranchLive(t *testing.T) {
	sf := buildShmTemplate(t)
	d := sf.d
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	out, err := os.MkdirTemp("/dev/shm", "forkd-branch-out-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(out) })
	c, ca := sf.src.restore(t, d, "bl")
	if err := c.LiveBranchSupport(); err != nil {
		t.Fatal(err)
	}
	call(t, ca, "get", "state=shm-template")
	call(t, ca, "set live-before", "ok")

	// A live branch while the clone is busy writing memory (once the
	// command has started; it may be over by then on a slow machine).
	busy := make(chan error, 1)
	go func() {
		_, err := ca.Call("run echo busy-start >/dev/console; dd if=/dev/urandom of=/tmp/busy bs=64k count=160 2>/dev/null; echo done", callTimeout)
		busy <- err
	}()
	waitFor(t, callTimeout, func() bool { return strings.Contains(c.ConsoleTail(4096), "busy-start") }, "the busy command to start")
	spec := branchSpec(out, "l1", vmm.SnapshotLive)
	res, err := c.Snapshot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	t.Logf("live branch (busy clone): paused %v, total %v, %d bytes written, %d pages with data", res.Paused, res.Duration, res.BytesWritten, res.DirtyPages)
	if res.Paused <= 0 || res.Duration < res.Paused || res.DirtyPages <= 0 || res.PageIndexFile != "" {
		t.Errorf("result %+v", res)
	}
	checkRunning(t, c, ca, "live-before")
	call(t, ca, "set live-after", "ok")
	checkBranchFiles(t, res, testMemMiB, sf.src.state)
	assertCapOff(t, c)
	g, ga := sf.src.from(res).restore(t, d, "blg")
	checkRunning(t, g, ga, "live-before")
	call(t, ca, "get", "state=live-after")

	// Idle pauses, live and diff, on the same clone.
	time.Sleep(time.Second)
	var live, diff []time.Duration
	for i := range 3 {
		r, err := c.Snapshot(ctx, branchSpec(out, fmt.Sprintf("li%d", i), vmm.SnapshotLive))
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, r.Paused)
		t.Logf("idle live branch %d: paused %v, total %v, %d bytes", i, r.Paused, r.Duration, r.BytesWritten)
		os.Remove(r.MemoryFile)
		time.Sleep(300 * time.Millisecond)
		r, err = c.Snapshot(ctx, branchSpec(out, fmt.Sprintf("di%d", i), vmm.SnapshotDiff))
		if err != nil {
			t.Fatal(err)
		}
		diff = append(diff, r.Paused)
		t.Logf("idle diff branch (tmpfs) %d: paused %v, total %v, %d dirty pages, %d bytes", i, r.Paused, r.Duration, r.DirtyPages, r.BytesWritten)
		if i == 0 {
			dg, dga := sf.src.from(r).restore(t, d, "bldg")
			checkRunning(t, dg, dga, "live-after")
		}
		os.Remove(r.MemoryFile)
		time.Sleep(300 * time.Millisecond)
	}
	t.Logf("idle pauses: live %v, diff %v", live, diff)

	// A live branch of the grandchild (depth 2).
	call(t, ga, "set grandchild", "ok")
	res2, err := g.Snapshot(ctx, branchSpec(out, "l2", vmm.SnapshotLive))
	if err != nil {
		t.Fatal(err)
	}
	gg, gga := sf.src.from(res2).restore(t, d, "blgg")
	checkRunning(t, gg, gga, "grandchild")

	// The grandchild's memory file renamed away and removed (forkd rmi of
	// its snapshot): a live branch still finds the file system its RAM is
	// on, through the mapping.
	if err := os.Rename(res.MemoryFile, res.MemoryFile+".trash"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(res.MemoryFile + ".trash"); err != nil {
		t.Fatal(err)
	}
	if err := g.LiveBranchSupport(); err != nil {
		t.Fatalf("live branch support once the memory file is gone: %v", err)
	}
	res3, err := g.Snapshot(ctx, branchSpec(out, "lgone", vmm.SnapshotLive))
	if err != nil {
		t.Fatalf("live branch once the memory file is gone: %v", err)
	}
	g3, g3a := sf.src.from(res3).restore(t, d, "blg3")
	checkRunning(t, g3, g3a, "grandchild")

	// Failures: the stream breaks off mid-way; the clone runs on.
	for _, point := range []string{"before-migrate", "stream", "converted"} {
		branchHook = func(p string) error {
			if p == point {
				return errors.New("injected failure at " + p)
			}
			return nil
		}
		spec = branchSpec(out, "lf", vmm.SnapshotLive)
		_, err := c.Snapshot(ctx, spec)
		branchHook = nil
		if err == nil {
			t.Errorf("live branch with a failure at %s succeeded", point)
		}
		t.Logf("failure at %s: %v", point, err)
		checkRunning(t, c, ca, "live-after")
		assertCapOff(t, c)
		for _, p := range []string{spec.StateFile, spec.MemoryFile, spec.MemoryFile + liveSpoolSuffix} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("%s left behind", p)
			}
		}
	}
	if _, err := os.Stat(res2.MemoryFile + liveSpoolSuffix); !os.IsNotExist(err) {
		t.Errorf("a successful live branch left its stream spool: %v", err)
	}
	// The caller gives up while the snapshot runs: the branch fails once
	// QEMU has finished, and the clone runs on. It gives up 50 ms after the
	// migration starts: 50 ms after the call can fall, on a busy machine,
	// in an earlier step, which fails another way.
	cctx, ccancel := context.WithCancel(ctx)
	branchHook = func(p string) error {
		if p == "before-migrate" {
			time.AfterFunc(50*time.Millisecond, ccancel)
		}
		return nil
	}
	spec = branchSpec(out, "lc", vmm.SnapshotLive)
	_, err = c.Snapshot(cctx, spec)
	branchHook = nil
	ccancel()
	if !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled live branch: %v", err)
	}
	checkRunning(t, c, ca, "live-after")
	assertCapOff(t, c)
	// The caller gives up while QEMU switches background-snapshot on, or
	// starts the snapshot, and the reply is lost, though QEMU did it: the
	// capability goes off and QEMU lets the spool go all the same.
	for _, point := range []string{"capabilities", "migrate"} {
		cctx, ccancel := context.WithCancel(ctx)
		branchHook = func(p string) error {
			if p == point {
				ccancel()
				return context.Cause(cctx)
			}
			return nil
		}
		spec = branchSpec(out, "lr", vmm.SnapshotLive)
		_, err = c.Snapshot(cctx, spec)
		branchHook = nil
		ccancel()
		if !errors.Is(err, context.Canceled) {
			t.Errorf("live branch cancelled at %s: %v", point, err)
		}
		t.Logf("cancelled at %s: %v", point, err)
		checkRunning(t, c, ca, "live-after")
		assertCapOff(t, c)
		spool := spec.MemoryFile + liveSpoolSuffix
		waitFor(t, callTimeout, func() bool { return !holdsFile(c.PID(), spool) }, "QEMU to close %s", spool)
		for _, p := range []string{spec.StateFile, spec.MemoryFile, spool} {
			if _, err := os.Stat(p); !os.IsNotExist(err) {
				t.Errorf("%s left behind", p)
			}
		}
	}
	// And a later live branch works.
	if _, err := c.Snapshot(ctx, branchSpec(out, "l3", vmm.SnapshotLive)); err != nil {
		t.Fatal(err)
	}
	checkTemplateUnchanged(t, sf.src.mem, sf.hash)

	// A QEMU without the right to create a userfaultfd cannot branch live.
	if b, _ := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd"); strings.TrimSpace(string(b)) != "1" {
		nd := newTestDriver(t, Config{RunAs: "nobody"})
		n, na := sf.src.restore(t, nd, "bln")
		if _, err := n.Snapshot(ctx, branchSpec(out, "ln", vmm.SnapshotLive)); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("live branch of a QEMU running as nobody: %v", err)
		}
		checkRunning(t, n, na, "shm-template")
	}
}

// holdsFile reports whether process pid has path open (or had, before it
// was removed).
func holdsFile(pid int, path string) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err == nil && (l == path || l == path+" (deleted)") {
			return true
		}
	}
	return false
}

func assertCapOff(t *testing.T, m *Machine) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var caps []struct {
		Capability string
		State      bool
	}
	if err := m.QMP().Execute(ctx, "query-migrate-capabilities", nil, &caps); err != nil {
		t.Fatal(err)
	}
	for _, c := range caps {
		if c.Capability == "background-snapshot" && c.State {
			t.Error("background-snapshot left on")
		}
		if c.Capability == migstream.CapIgnoreShared && !c.State {
			t.Error("x-ignore-shared switched off")
		}
	}
}

// TestBranchMeasurements times branches of idle and busy clones in each
// mode. It runs only with FORKD_TEST_MEASURE=1 (without -race for
// meaningful numbers):
//
//	FORKD_TEST_MEASURE=1 go test -run TestBranchMeasurements -v ./internal/vmm/qemu/
func TestBranchMeasurements(t *testing.T) {
	if os.Getenv("FORKD_TEST_MEASURE") != "1" {
		t.Skip("set FORKD_TEST_MEASURE=1 to measure")
	}
	const n = 5
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	measure := func(name string, c *Machine, dir string, mode vmm.SnapshotType, count int) {
		t.Helper()
		var pauses, totals []time.Duration
		var pages, bytes int64
		for i := range count {
			time.Sleep(300 * time.Millisecond)
			spec := branchSpec(dir, fmt.Sprintf("m%d", i), mode)
			r, err := c.Snapshot(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			pauses, totals = append(pauses, r.Paused), append(totals, r.Duration)
			pages, bytes = r.DirtyPages, r.BytesWritten
			for _, p := range []string{spec.MemoryFile, spec.StateFile, spec.PageIndexFile} {
				os.Remove(p)
			}
		}
		slices.Sort(pauses)
		slices.Sort(totals)
		t.Logf("%-34s pause p50 %8v (min %8v max %8v), total p50 %v, %d pages, %.1f MB written",
			name, pauses[len(pauses)/2].Round(10*time.Microsecond), pauses[0].Round(10*time.Microsecond),
			pauses[len(pauses)-1].Round(10*time.Microsecond), totals[len(totals)/2].Round(time.Millisecond), pages, float64(bytes)/1e6)
	}
	busy := func(a *testguest.Agent) {
		t.Helper()
		call(t, a, "run dd if=/dev/urandom of=/tmp/busy bs=1M count=50 2>/dev/null; echo done", "done ")
	}

	// Disk-backed template (the shared fixture), QEMU as nobody.
	f := template(t)
	d := newTestDriver(t, Config{RunAs: "nobody"})
	dir := shortDir(t, "forkd-branch-m")
	t.Cleanup(func() { os.RemoveAll(dir) })
	c, ca := f.source().restore(t, d, "bm")
	time.Sleep(time.Second)
	measure("idle, disk, diff", c, dir, vmm.SnapshotDiff, n)
	measure("idle, disk, full", c, dir, vmm.SnapshotFull, 3)
	busy(ca)
	measure("wrote 50 MB, disk, diff", c, dir, vmm.SnapshotDiff, 3)

	// tmpfs-backed template, QEMU as root.
	sf := buildShmTemplate(t)
	out, err := os.MkdirTemp("/dev/shm", "forkd-branch-m-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(out) })
	l, la := sf.src.restore(t, sf.d, "bml")
	time.Sleep(time.Second)
	measure("idle, tmpfs, diff", l, out, vmm.SnapshotDiff, n)
	measure("idle, tmpfs, live", l, out, vmm.SnapshotLive, n)
	measure("idle, tmpfs, diff (after live)", l, out, vmm.SnapshotDiff, 3)
	busy(la)
	measure("wrote 50 MB, tmpfs, diff", l, out, vmm.SnapshotDiff, 3)
	measure("wrote 50 MB, tmpfs, live", l, out, vmm.SnapshotLive, 3)
}
