package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// cli runs bin/forkd against one test daemon.
type cli struct {
	t      *testing.T
	env    []string
	runDir string
}

func newCLI(t *testing.T) *cli { return newCLIOn(t, dataDir) }

// newCLIOn is newCLI for a daemon over another data dir.
func newCLIOn(t *testing.T, data string) *cli {
	runDir, err := os.MkdirTemp("/run", "forkd-cli-")
	if err != nil {
		t.Fatal(err)
	}
	c := &cli{t: t, runDir: runDir, env: append(os.Environ(),
		"FORKD_DATA_DIR="+data,
		"FORKD_RUN_DIR="+runDir,
		"FORKD_RECIPES="+filepath.Join(repoRoot, "recipes"),
		"FORKD_NETNS_PREFIX=fkc"+snapshot.NewID()[:4]+"-",
		// Closed rooms: only network tests, in namespaces they make
		// themselves, give sandboxes an uplink.
		"FORKD_NETWORK=none",
		// Pools stay at their size: growth after a fan-out is tested in
		// internal/sandbox, and here it would only restore children
		// ahead in the background of the tests that follow.
		"FORKD_POOL_MAX=0",
		// A busy CI machine can starve a child past the product's 90 s.
		"FORKD_READY_TIMEOUT=5m",
	)}
	t.Cleanup(func() {
		// Sandboxes outlive a stopped daemon (the next one re-adopts
		// them), so end them first.
		c.run("--no-autostart", "kill", "--all")
		c.run("daemon", "stop")
		os.RemoveAll(runDir)
	})
	return c
}

func (c *cli) cmd(args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(repoRoot, "bin", "forkd"), args...)
	cmd.Env = c.env
	return cmd
}

// run returns stdout, stderr and the exit code.
func (c *cli) run(args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	cmd := c.cmd(args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("forkd %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

func (c *cli) ok(args ...string) string {
	c.t.Helper()
	out, errs, code := c.run(args...)
	if code != 0 {
		c.t.Fatalf("forkd %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errs)
	}
	return out
}

func (c *cli) sandboxes() []apiv1.Sandbox {
	c.t.Helper()
	var sbs []apiv1.Sandbox
	if err := json.Unmarshal([]byte(c.ok("ls", "--json")), &sbs); err != nil {
		c.t.Fatal(err)
	}
	return sbs
}

// vmmProcesses counts VMM processes whose command line names this daemon's
// run dir.
func (c *cli) vmmProcesses() int { return len(c.vmmPIDs()) }

// vmmPIDs are the pids of the VMM processes of the test's daemon.
func (c *cli) vmmPIDs() map[int]bool {
	pids := map[int]bool{}
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		data, _ := os.ReadFile(p)
		if bytes.Contains(data, []byte("qemu")) && bytes.Contains(data, []byte(c.runDir+"/vms/")) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			pids[pid] = true
		}
	}
	return pids
}

// TestCLI drives the daemon through the CLI the way a user does, starting
// with a command that auto-starts the daemon.
func TestCLI(t *testing.T) {
	c := newCLI(t)
	tag := "it-cli-" + snapshot.NewID()
	out, errs, code := c.run("snapshot", "create", "--tag", tag, "--recipe", "minimal")
	if code != 0 || !strings.Contains(out, "snapshot "+tag+" created") || !strings.Contains(errs, "started daemon") {
		t.Fatalf("snapshot create: exit %d\n%s\n%s", code, out, errs)
	}
	defer c.run("rmi", tag)

	var fr apiv1.ForkResponse
	if err := json.Unmarshal([]byte(c.ok("fork", "--tag", tag, "-n", "2", "--json")), &fr); err != nil {
		t.Fatal(err)
	}
	if len(fr.Sandboxes) != 2 {
		t.Fatalf("fork: %+v", fr)
	}
	id := fr.Sandboxes[0].ID

	out, errs, code = c.run("exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
	if code != 3 || out != "out\n" || errs != "err\n" {
		t.Fatalf("exec: exit %d stdout %q stderr %q", code, out, errs)
	}

	// With --json, stdout is the API's NDJSON events: output and exit
	// apart from each other, the exit code still the command's.
	out, errs, code = c.run("--json", "exec", id, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var ev apiv1.ExecEvent
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("exec --json: line %q: %v", line, err)
		}
		if ev.Type == "start" && len(got) == 0 {
			continue // the process's guest pid, before any output
		}
		got = append(got, fmt.Sprintf("%s %q %d", ev.Type, ev.Data, ev.ExitCode))
	}
	if len(got) > 1 {
		slices.Sort(got[:len(got)-1]) // stdout and stderr are read apart: either may come first
	}
	if want := []string{`stderr "err\n" 0`, `stdout "out\n" 0`, `exit "" 3`}; code != 3 || errs != "" || !slices.Equal(got, want) {
		t.Fatalf("exec --json: exit %d, stderr %q, events %q, want %q", code, errs, got, want)
	}

	local := filepath.Join(t.TempDir(), "f.txt")
	os.WriteFile(local, []byte("cp round trip\n"), 0o644)
	var fi apiv1.FileInfo
	json.Unmarshal([]byte(c.ok("--json", "cp", "--mode", "755", local, id+":/root/f.txt")), &fi)
	if fi.Mode != 0o755 || fi.Size != int64(len("cp round trip\n")) {
		t.Fatalf("cp --mode 755 in: %+v", fi)
	}
	back := filepath.Join(t.TempDir(), "back.txt")
	fi = apiv1.FileInfo{}
	json.Unmarshal([]byte(c.ok("--json", "cp", id+":/root/f.txt", back)), &fi)
	if data, _ := os.ReadFile(back); string(data) != "cp round trip\n" || fi.Path != back || fi.Size != int64(len(data)) {
		t.Fatalf("cp back: %q, --json said %+v", data, fi)
	}
	if out := c.ok("sandbox", "info", id); !strings.Contains(out, id) || !strings.Contains(out, "running") {
		t.Fatalf("sandbox info:\n%s", out)
	}
	if _, errs, code := c.run("cp", id+":/no/such/file", back); code == 0 || !strings.Contains(errs, "/no/such/file") {
		t.Fatalf("cp of a missing file: exit %d %s", code, errs)
	}

	// BRANCH: the running sandbox (with the file copied in) becomes a tag.
	btag := tag + "-br"
	if out := c.ok("branch", id, "--tag", btag); !strings.Contains(out, "snapshot "+btag) {
		t.Fatalf("branch: %s", out)
	}
	var bf apiv1.ForkResponse
	json.Unmarshal([]byte(c.ok("fork", "--tag", btag, "--json")), &bf)
	if len(bf.Sandboxes) != 1 {
		t.Fatalf("fork of the branch: %+v", bf)
	}
	if out := c.ok("exec", bf.Sandboxes[0].ID, "--", "cat", "/root/f.txt"); out != "cp round trip\n" {
		t.Fatalf("grandchild sees %q", out)
	}
	c.ok("kill", bf.Sandboxes[0].ID)
	c.ok("rmi", btag) // also ends its pool of VMMs, counted below

	if _, errs, code := c.run("run-code", id, "1+1"); code == 0 || !strings.Contains(errs, "Python") {
		t.Fatalf("run-code without python: exit %d %s", code, errs)
	}
	if _, errs, code := c.run("fork", "--tag", "no-such-tag"); code != 3 || !strings.Contains(errs, tag) {
		t.Fatalf("unknown tag: exit %d %s", code, errs)
	}
	// With --json the error is the daemon's problem object, same exit code.
	var p apiv1.Problem
	if _, errs, code := c.run("--json", "fork", "--tag", "no-such-tag"); code != 3 || json.Unmarshal([]byte(errs), &p) != nil ||
		p.Status != 404 || p.Code != "not_found" || p.RequestID == "" || !strings.Contains(p.Detail, "no-such-tag") {
		t.Fatalf("unknown tag --json: exit %d, stderr %s", code, errs)
	}
	if _, errs, code := c.run("fork", "--tag", tag, "-n", "0"); code != 2 {
		t.Fatalf("-n 0: exit %d %s", code, errs)
	}
	if _, errs, code := c.run("fork", "--tag", "UPPER"); code != 2 || !strings.Contains(errs, "lowercase") {
		t.Fatalf("invalid tag: exit %d %s", code, errs)
	}

	// Killing the CLI mid-fork leaves no VMM without an owner: the daemon
	// tears down the abandoned request's children. First a steady state
	// (the pool full, no VMM starting), so that the only thing that can
	// take a pooled VMM or start a new one is the fork.
	var sbs []apiv1.Sandbox
	var snap apiv1.Snapshot
	steady := func() (pooled, vmms int, ok bool) {
		sbs = c.sandboxes()
		json.Unmarshal([]byte(c.ok("snapshot", "info", tag, "--json")), &snap)
		n := c.vmmProcesses()
		return snap.Pooled, n, len(sbs) == 2 && n == len(sbs)+snap.Pooled
	}
	var pooled0, vmms0 int
	deadline := time.Now().Add(5 * time.Minute) // pooled VMMs boot under TCG
	for {
		// Two equal readings in a row: the pool has stopped refilling.
		p1, n1, ok1 := steady()
		time.Sleep(300 * time.Millisecond)
		p2, n2, ok2 := steady()
		if ok1 && ok2 && p1 == p2 && n1 == n2 && p2 > 0 {
			pooled0, vmms0 = p2, n2
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no steady state before the fork: %d sandboxes, %d pooled, %d VMM processes", len(sbs), snap.Pooled, c.vmmProcesses())
		}
	}
	// Ten children: the pool holds two, so VMMs start for the other
	// eight. Each is stopped (SIGSTOP) as soon as it appears: the fork
	// then cannot finish before the CLI is killed, however fast or
	// loaded the host (a fork of four once finished between the test
	// seeing it in flight and its kill). The daemon's teardown kills
	// stopped VMMs like any other.
	before := c.vmmPIDs()
	fork := c.cmd("fork", "--tag", tag, "-n", "10")
	if err := fork.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- fork.Wait() }()
	held := map[int]bool{}
	for len(held) == 0 {
		select {
		case err := <-exited:
			t.Fatalf("the fork ended (%v) before a VMM was started for it; nothing was killed mid-fork", err)
		case <-time.After(10 * time.Millisecond):
		}
		for pid := range c.vmmPIDs() {
			if !before[pid] && !held[pid] {
				syscall.Kill(pid, syscall.SIGSTOP)
				held[pid] = true
			}
		}
	}
	json.Unmarshal([]byte(c.ok("snapshot", "info", tag, "--json")), &snap)
	t.Logf("fork in flight: %d VMM processes (%d before, %d held stopped), %d pooled (%d before); killing the CLI", c.vmmProcesses(), vmms0, len(held), snap.Pooled, pooled0)
	fork.Process.Signal(syscall.SIGKILL)
	if err := <-exited; err == nil {
		t.Fatal("the fork completed before it was killed; nothing was killed mid-fork")
	}
	deadline = time.Now().Add(5 * time.Minute)
	for {
		if _, _, ok := steady(); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after killing the CLI mid-fork: %d sandboxes listed, %d pooled, %d VMM processes (orphans)", len(sbs), snap.Pooled, c.vmmProcesses())
		}
		time.Sleep(200 * time.Millisecond)
	}

	c.ok("kill", "--all")
	if sbs := c.sandboxes(); len(sbs) != 0 {
		t.Fatalf("after kill --all: %+v", sbs)
	}
	c.ok("rmi", tag)
	if out := c.ok("snapshots"); strings.Contains(out, tag) {
		t.Fatalf("rmi left %s:\n%s", tag, out)
	}

	// Every mutating request left a hash-chained audit record naming who
	// did what to which ids.
	if out := c.ok("audit", "verify"); !strings.Contains(out, "chain intact") {
		t.Fatalf("audit verify: %s", out)
	}
	var recs []struct {
		Action  string   `json:"action"`
		Targets []string `json:"targets"`
		Outcome string   `json:"outcome"`
		Peer    string   `json:"peer"`
	}
	if err := json.Unmarshal([]byte(c.ok("audit", "tail", "-n", "200", "--json")), &recs); err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, r := range recs {
		switch {
		case r.Action == "POST /v1/sandboxes" && r.Outcome == "ok" && len(r.Targets) == 2 && r.Targets[0] == id:
			found["fork"] = strings.HasPrefix(r.Peer, "unix:uid=0")
		case r.Action == "POST /v1/sandboxes" && r.Outcome == "not_found":
			found["fork unknown tag"] = true
		case r.Action == "DELETE /v1/snapshots/{tag}" && len(r.Targets) == 1 && r.Targets[0] == tag:
			found["rmi"] = true
		}
	}
	for _, k := range []string{"fork", "fork unknown tag", "rmi"} {
		if !found[k] {
			t.Errorf("no audit record for %s in %+v", k, recs)
		}
	}
}

// waitTemplateBooting waits until a template VMM runs (the image may have
// to be built first: minutes on a cold cache), failing if exited says the
// command ended first.
func (c *cli) waitTemplateBooting(exited <-chan error) {
	c.t.Helper()
	for deadline := time.Now().Add(15 * time.Minute); c.vmmProcesses() == 0; time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-exited:
			c.t.Fatalf("snapshot create ended (%v) before its template was seen booting", err)
		default:
		}
		if time.Now().After(deadline) {
			c.t.Fatal("no template VMM seen booting")
		}
	}
}

// TestSnapshotCreateSurvivesClient: the daemon owns a snapshot create: a
// client killed while the template boots does not stop it; the tag
// appears, forks, and its operation says succeeded.
func TestSnapshotCreateSurvivesClient(t *testing.T) {
	c := newCLI(t)
	c.ok("daemon", "start")
	tag := "it-survive-" + snapshot.NewID()
	create := c.cmd("snapshot", "create", "--tag", tag, "--recipe", "minimal")
	if err := create.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- create.Wait() }()
	c.waitTemplateBooting(exited)
	create.Process.Signal(syscall.SIGKILL)
	<-exited
	t.Cleanup(func() { c.run("rmi", tag) })
	var ops []apiv1.Operation
	if err := json.Unmarshal([]byte(c.ok("--json", "operation", "list")), &ops); err != nil {
		t.Fatal(err)
	}
	id := ""
	for _, op := range ops {
		if op.Kind == apiv1.OpSnapshotCreate && op.Target == tag {
			id = op.ID
		}
	}
	if id == "" {
		t.Fatalf("no snapshot.create operation for %s in %+v", tag, ops)
	}
	// Re-attach: watch follows it to its end.
	if out := c.ok("operation", "watch", id); !strings.Contains(out, "succeeded") {
		t.Fatalf("operation watch %s: %q", id, out)
	}
	c.ok("snapshot", "info", tag)
	out := c.ok("fork", "--tag", tag, "--quiet")
	if id := strings.TrimSpace(out); id == "" {
		t.Fatalf("fork of the created tag printed %q", out)
	}
}

// TestSnapshotCreateCancelled: `forkd operation cancel` stops a create
// started with --detach: no tag, no staging directory, no VMM left, and
// the operation ends cancelled.
func TestSnapshotCreateCancelled(t *testing.T) {
	c := newCLI(t)
	c.ok("daemon", "start")
	tag := "it-cancel-" + snapshot.NewID()
	id := strings.TrimSpace(c.ok("snapshot", "create", "--tag", tag, "--recipe", "minimal", "--detach"))
	if !strings.HasPrefix(id, "op-") {
		t.Fatalf("--detach printed %q, want an operation id", id)
	}
	c.waitTemplateBooting(nil)
	if out := c.ok("operation", "cancel", id); !strings.Contains(out, apiv1.OpCancelled) {
		t.Fatalf("operation cancel %s: %q", id, out)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		staging, _ := filepath.Glob(filepath.Join(dataDir, "snapshots", ".staging-"+tag+"*"))
		_, _, code := c.run("snapshot", "info", tag)
		if len(staging) == 0 && code == 3 && c.vmmProcesses() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cancelled create left staging %v, info exit %d, %d VMMs", staging, code, c.vmmProcesses())
		}
		time.Sleep(200 * time.Millisecond)
	}
	var op apiv1.Operation
	if err := json.Unmarshal([]byte(c.ok("--json", "operation", "show", id)), &op); err != nil || op.State != apiv1.OpCancelled {
		t.Fatalf("operation after cancel: %+v %v", op, err)
	}
}
