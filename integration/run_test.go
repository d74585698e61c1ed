package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// running lists c's running sandboxes of tag.
func (c *cli) running(tag string) []apiv1.Sandbox {
	var out []apiv1.Sandbox
	for _, s := range c.sandboxes() {
		if s.Tag == tag && s.State == apiv1.StateRunning {
			out = append(out, s)
		}
	}
	return out
}

// TestCLIRunImageRmAndDF: `forkd run` exits with the command's code (128+N
// for a signal, 130 on Ctrl-C) and leaves no sandbox unless --keep; `forkd
// image rm` refuses an image a snapshot uses, naming it; `forkd system
// df` counts them.
func TestCLIRunImageRmAndDF(t *testing.T) {
	c := newCLI(t)
	tag := "it-run-" + snapshot.NewID()
	c.ok("snapshot", "create", "--tag", tag, "--recipe", "minimal")
	defer c.run("rmi", tag)

	out, errs, code := c.run("run", "--tag", tag, "--", "sh", "-c", "echo out; echo err >&2; exit 3")
	if code != 3 || out != "out\n" || !strings.Contains(errs, "err\n") {
		t.Fatalf("run: exit %d\nstdout %q\nstderr %q", code, out, errs)
	}
	if sbs := c.running(tag); len(sbs) != 0 {
		t.Fatalf("run left %+v", sbs)
	}
	if _, errs, code := c.run("run", "--tag", tag, "--", "sh", "-c", "kill -9 $$"); code != 128+9 {
		t.Fatalf("run of a command killed by SIGKILL: exit %d %s", code, errs)
	}
	if _, errs, code := c.run("run", "--tag", "it-run-no-such-tag", "--", "true"); code != 3 || !strings.Contains(errs, "it-run-no-such-tag") {
		t.Fatalf("run from an unknown tag: exit %d %s", code, errs)
	}
	_, errs, code = c.run("run", "--keep", "--tag", tag, "--", "true")
	kept := c.running(tag)
	if code != 0 || len(kept) != 1 || !strings.Contains(errs, kept[0].ID) {
		t.Fatalf("run --keep: exit %d, running %+v, stderr %s", code, kept, errs)
	}
	c.ok("rm", kept[0].ID)

	// Ctrl-C while the command runs: 130, and the sandbox is killed.
	cmd := c.cmd("run", "--tag", tag, "--", "sleep", "600")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the run's sandbox", func() bool { return len(c.running(tag)) == 1 })
	cmd.Process.Signal(os.Interrupt)
	err := cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 130 {
		t.Fatalf("run interrupted: exit %d (%v) %s", code, err, stderr.String())
	}
	if sbs := c.running(tag); len(sbs) != 0 {
		t.Fatalf("an interrupted run left %+v", sbs)
	}

	_, errs, code = c.run("image", "rm", "minimal")
	if code != 1 || !strings.Contains(errs, tag) || !strings.Contains(errs, "forkd rmi") {
		t.Fatalf("image rm of a used image: exit %d %s", code, errs)
	}
	var du apiv1.DiskUsage
	if err := json.Unmarshal([]byte(c.ok("system", "df", "--json")), &du); err != nil {
		t.Fatal(err)
	}
	if du.Images.Active < 1 || du.Snapshots.Count+du.Layers.Count < 1 || du.Snapshots.SizeBytes <= 0 {
		t.Fatalf("df: %+v", du)
	}
	if out := c.ok("system", "df"); !strings.Contains(out, "RECLAIMABLE") {
		t.Fatalf("df table:\n%s", out)
	}
}
