package qemu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/testutil/testguest"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// TestMigrationFiles follows every migration file through real QEMUs: a
// template's snapshot, a clone's restore, a live and a full branch of the
// clone and the restores of both. After each hand-over QEMU holds no
// descriptor set (query-fdsets), and no QEMU warned in its qemu.log of a
// deprecated migration (QEMU 9.1+ does for "fd:" to a file).
func TestMigrationFiles(t *testing.T) {
	sf := buildShmTemplate(t)
	d := sf.d
	t.Logf("QEMU %s: file migration (add-fd, file:/dev/fdset/N) %v", d.version, d.feat.fileMigration)
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	out, err := os.MkdirTemp("/dev/shm", "forkd-handover-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(out) })
	runDirs := []string{filepath.Join(sf.src.runRoot, "tmpl")} // the template's snapshot

	// A prepared clone holds the state file, in a set where QEMU has file
	// migration; its restore takes it back.
	src := sf.src
	vm, err := d.Prepare(ctx, vmm.PrepareSpec{MachineConfig: vmm.MachineConfig{
		ID: "mf", RunDir: filepath.Join(src.runRoot, "mf"), Image: src.image, MemoryMiB: src.memMiB, MemoryFile: src.mem,
	}, StateFile: src.state})
	if err != nil {
		t.Fatal(err)
	}
	c := vm.(*Machine)
	t.Cleanup(func() { c.Kill(); <-c.Done() })
	runDirs = append(runDirs, c.cfg.RunDir)
	if sets := queryFdsets(t, c); d.feat.fileMigration && (len(sets) != 1 || len(sets[0].FDs) != 1 || sets[0].FDs[0].Opaque != stateFD) {
		t.Fatalf("prepared clone's descriptor sets: %+v, want the state file's", sets)
	}
	conn, err := c.DialAgent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ca := testguest.NewAgent(conn)
	t.Cleanup(func() { ca.Close() })
	if _, err := c.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	call(t, ca, "ping", "pong")
	waitNoFdsets(t, c, "restore")
	call(t, ca, "set handover-live", "ok")

	live, err := c.Snapshot(ctx, branchSpec(out, "live", vmm.SnapshotLive))
	if err != nil {
		t.Fatal(err)
	}
	waitNoFdsets(t, c, "live branch")
	checkRunning(t, c, ca, "handover-live")
	call(t, ca, "set handover-full", "ok")
	full, err := c.Snapshot(ctx, branchSpec(out, "full", vmm.SnapshotFull))
	if err != nil {
		t.Fatal(err)
	}
	waitNoFdsets(t, c, "full branch")
	checkRunning(t, c, ca, "handover-full")

	// The branches' files fork as the template's do.
	for _, b := range []struct {
		name, want string
		res        vmm.SnapshotResult
	}{{"mfl", "handover-live", live}, {"mff", "handover-full", full}} {
		g, ga := src.from(b.res).restore(t, d, b.name)
		checkRunning(t, g, ga, b.want)
		waitNoFdsets(t, g, "restore of a branch")
		runDirs = append(runDirs, g.cfg.RunDir)
		g.Kill()
		<-g.Done()
	}
	c.Kill()
	<-c.Done()
	// qemu.log is complete once its QEMU is reaped.
	for _, dir := range runDirs {
		log, err := os.ReadFile(filepath.Join(dir, stderrFile))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if strings.Contains(string(log), "deprecated") {
			t.Errorf("%s:\n%s", filepath.Join(dir, stderrFile), log)
		}
	}
}

func queryFdsets(t *testing.T, m *Machine) []fdsetInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	var sets []fdsetInfo
	if err := m.QMP().Execute(ctx, "query-fdsets", nil, &sets); err != nil {
		t.Fatal(err)
	}
	return sets
}

// waitNoFdsets waits until QEMU lists no descriptor set: the driver has
// removed its own, and QEMU's duplicate for the migration is closed when
// the migration's cleanup has run (a moment after "completed").
func waitNoFdsets(t *testing.T, m *Machine, after string) {
	t.Helper()
	var sets []fdsetInfo
	deadline := time.Now().Add(callTimeout)
	for {
		if sets = queryFdsets(t, m); len(sets) == 0 {
			return
		}
		for _, s := range sets {
			if len(s.FDs) > 0 {
				t.Fatalf("%s: after the %s QEMU still holds the driver's descriptor set %+v", m.ID(), after, s)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: after the %s QEMU lists descriptor sets %+v", m.ID(), after, sets)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
