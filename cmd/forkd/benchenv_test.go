package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// deadPID returns the pid of a process that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func TestReapStaleBenchRuns(t *testing.T) {
	runDir, dataDir := t.TempDir(), t.TempDir()
	dead, self := deadPID(t), os.Getpid()
	stale := filepath.Join(runDir, fmt.Sprintf("bench-spawn-%d", dead))
	oldStyle := filepath.Join(runDir, fmt.Sprintf("bench-%d", dead))
	live := filepath.Join(runDir, fmt.Sprintf("bench-api-%d", self))
	other := filepath.Join(runDir, "vms")
	for _, d := range []string{stale, oldStyle, live, other} {
		os.MkdirAll(filepath.Join(d, "vms", "sb-1"), 0o755)
	}
	// A VMM of the dead run.
	vmm := fakeVMM(filepath.Join(stale, "vms", "sb-1"))
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- vmm.Wait() }()
	t.Cleanup(func() { vmm.Process.Kill() })
	staleData := filepath.Join(dataDir, fmt.Sprintf(".bench-state-%d", dead))
	liveData := filepath.Join(dataDir, fmt.Sprintf(".bench-api-audit-%d", self))
	os.MkdirAll(staleData, 0o700)
	os.MkdirAll(liveData, 0o700)

	var said []string
	reapStaleBenchRuns(runDir, dataDir, func(f string, a ...any) { said = append(said, fmt.Sprintf(f, a...)) })

	for _, gone := range []string{stale, oldStyle, staleData} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s of a dead run kept (%v)", gone, err)
		}
	}
	for _, kept := range []string{live, other, liveData} {
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("%s removed: %v", kept, err)
		}
	}
	select {
	case err := <-exited:
		if ws, ok := vmm.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Errorf("the dead run's VMM ended with %v, want SIGKILL", err)
		}
	case <-time.After(time.Minute):
		t.Error("the dead run's VMM still runs")
	}
	if !strings.Contains(strings.Join(said, "\n"), "killed its 1 VMM(s)") {
		t.Errorf("reported %q", said)
	}
}

// TestBenchWatchdog: once the bench run's end of the pipe closes (the run
// exited, SIGKILL included), its watchdog kills the run's VMMs and removes
// its run dir, namespaces and data-dir files, and only those.
func TestBenchWatchdog(t *testing.T) {
	t.Setenv("FORKD_TEST_CLI", "1") // the watchdog is this test binary as forkd
	g := &globals{runDir: t.TempDir(), dataDir: t.TempDir()}
	owner := os.Getpid() // the watchdog's owner is this process
	runDir := filepath.Join(g.runDir, fmt.Sprintf("bench-spawn-%d", owner))
	otherRun := filepath.Join(g.runDir, fmt.Sprintf("bench-spawn-%d", deadPID(t)))
	dataDir := filepath.Join(g.dataDir, fmt.Sprintf(".bench-state-%d", owner))
	for _, d := range []string{filepath.Join(runDir, "vms", "sb-1"), otherRun, dataDir} {
		os.MkdirAll(d, 0o755)
	}
	vmm := fakeVMM(filepath.Join(runDir, "vms", "sb-1"))
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	vmmExited := make(chan struct{})
	go func() { vmm.Wait(); close(vmmExited) }()
	t.Cleanup(func() { vmm.Process.Kill() })
	nsName := benchNetNSPrefix(owner) + "sb-w"
	if os.Geteuid() == 0 {
		ns, err := netns.Create(context.Background(), nsName, netns.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Remove() })
	}

	alive, wd, err := startBenchWatchdog(g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wd.Process.Kill() })
	exited := make(chan error, 1)
	go func() { exited <- wd.Wait() }()
	select {
	case err := <-exited:
		t.Fatalf("the watchdog exited while its owner runs: %v", err)
	default:
	}
	alive.Close() // as the kernel does when the owner dies
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("watchdog: %v", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("the watchdog did not end after its owner did")
	}
	select {
	case <-vmmExited:
	case <-time.After(time.Minute):
		t.Fatal("the owner's VMM still runs")
	}
	for _, gone := range []string{runDir, dataDir} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s kept: %v", gone, err)
		}
	}
	if _, err := os.Stat(otherRun); err != nil {
		t.Errorf("another run's dir was removed: %v", err)
	}
	if names, _ := netns.List(benchNetNSPrefix(owner)); len(names) != 0 {
		t.Errorf("namespaces kept: %v", names)
	}
}

func TestReapStaleBenchNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	dead := deadPID(t)
	staleName := benchNetNSPrefix(dead) + "sb-test"
	liveName := benchNetNSPrefix(os.Getpid()) + "sb-test"
	for _, n := range []string{staleName, liveName} {
		ns, err := netns.Create(context.Background(), n, netns.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ns.Remove() })
	}
	reapStaleBenchRuns(t.TempDir(), t.TempDir(), func(string, ...any) {})
	names, _ := netns.List("fkb")
	if strings.Contains(strings.Join(names, " "), staleName) || !strings.Contains(strings.Join(names, " "), liveName) {
		t.Fatalf("after reaping: %v (want %s gone, %s kept)", names, staleName, liveName)
	}
}

func TestBenchReport(t *testing.T) {
	r := &benchReport{Bench: "spawn", Date: time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC),
		Machine: benchMachine{Host: "h", CPUs: 2, CPUModel: "cpu", Kernel: "6.1", VMM: "qemu", VMMVersion: "7.2", Accel: "tcg"},
		Setup:   "pool 2"}
	r.row("fork-to-ready (agent answering), p50 / p90", "1.0 ms / 2.0 ms", vals{"p50_ms": 1, "p90_ms": 2})
	md := r.markdown()
	want := "### forkd bench spawn — 2026-01-02 03:04 UTC\n\nMachine: h, 2 CPUs (cpu), kernel 6.1; VMM qemu 7.2, accel tcg; pool 2.\n\n" +
		"| measure | value |\n|---|---|\n| fork-to-ready (agent answering), p50 / p90 | 1.0 ms / 2.0 ms |\n"
	if md != want {
		t.Errorf("markdown:\n%s\nwant:\n%s", md, want)
	}
	r.columns = []string{"a", "b"}
	r.Rows = []benchRow{{Measure: "m", Error: "no", cells: []string{"1", "2"}}}
	if md := r.markdown(); !strings.Contains(md, "| a | b |\n|---|---|\n| 1 | 2 |\n") {
		t.Errorf("markdown with columns:\n%s", md)
	}
	data, _ := json.Marshal(r)
	var back map[string]any
	json.Unmarshal(data, &back)
	if back["bench"] != "spawn" || back["machine"].(map[string]any)["accel"] != "tcg" || back["rows"].([]any)[0].(map[string]any)["error"] != "no" {
		t.Errorf("json: %s", data)
	}
}

// A ratio over an empty measure is NaN or infinite; --json still prints
// the report (without that number) instead of failing after the run.
func TestBenchReportJSONWithNonFiniteNumbers(t *testing.T) {
	r := &benchReport{Bench: "spawn"}
	zero := 0.0
	r.row("cold boot / fork-to-ready p50", fmt.Sprintf("%.0f×", 1/zero), vals{"ratio": 1 / zero})
	r.row("head / flat", fmt.Sprintf("%.2f×", zero/zero), vals{"ratio": zero / zero, "n": 3})
	var buf bytes.Buffer
	if err := r.write(&buf, true); err != nil {
		t.Fatalf("--json: %v", err)
	}
	var back benchReport
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, buf.String())
	}
	if len(back.Rows) != 2 || len(back.Rows[0].Values) != 0 || back.Rows[1].Values["n"] != 3 || back.Rows[0].Value != "+Inf×" {
		t.Fatalf("rows %+v", back.Rows)
	}
}

// release kills a VMM of the run that the engine left running before it
// removes the run dir, after which nothing could find it.
func TestBenchReleaseKillsLeftVMMs(t *testing.T) {
	b := &benchEnv{runDir: filepath.Join(t.TempDir(), fmt.Sprintf("bench-spawn-%d", os.Getpid())), dataDir: t.TempDir()}
	os.MkdirAll(filepath.Join(b.runDir, "vms", "sb-1"), 0o755)
	// A VMM, and a process that only names a file of the run (a tail of
	// its console).
	vmm := fakeVMM(filepath.Join(b.runDir, "vms", "sb-1"))
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	bystander := exec.Command("sleep", "60", filepath.Join(b.runDir, "vms", "sb-1", "console.log"))
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bystander.Process.Kill(); bystander.Wait() })
	exited := make(chan struct{})
	go func() { vmm.Wait(); close(exited) }()
	t.Cleanup(func() { vmm.Process.Kill() })
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b.alive, b.watchdog = w, exec.Command("true")
	if err := b.watchdog.Start(); err != nil {
		t.Fatal(err)
	}
	b.release()
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatal("the run's VMM still runs after release")
	}
	if _, err := os.Stat(b.runDir); !os.IsNotExist(err) {
		t.Fatalf("run dir kept: %v", err)
	}
	if err := bystander.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("a process that only names a file of the run was killed: %v", err)
	}
}

// fakeVMM is a process with the command line of a QEMU the driver started
// with run dir runDir.
func fakeVMM(runDir string) *exec.Cmd {
	return testutil.FakeVMM(60, "-name", "forkd-"+filepath.Base(runDir),
		"-qmp", "unix:"+filepath.Join(runDir, "qmp.sock")+",server=on,wait=off")
}
