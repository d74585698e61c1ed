package integration

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/testutil"
)

// copyFile copies src to dst with src's mode.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, fi.Mode().Perm()); err != nil {
		t.Fatal(err)
	}
}

// unitSettings reads the [Service] settings of a systemd unit: each key's
// values in order (a setting may repeat).
func unitSettings(t *testing.T, path string) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "["):
			section = line
		case section == "[Service]":
			if k, v, ok := strings.Cut(line, "="); ok {
				out[k] = append(out[k], v)
			}
		}
	}
	return out
}

// TestUnitFileSystem runs the daemon as packaging/forkd.service's file
// system settings would (ProtectSystem=strict with its ReadWritePaths,
// PrivateTmp, ProtectHome), without systemd, which this machine does not
// run: everything but the data and run dirs, /run/netns and the API file
// systems is read-only. An image build (kernel and root fs), a snapshot, a
// fork and an exec must work there.
func TestUnitFileSystem(t *testing.T) {
	testutil.RequiresRoot(t)
	testutil.RequiresBinary(t, "unshare")
	testutil.RequiresBinary(t, "findmnt")
	unit := unitSettings(t, filepath.Join(repoRoot, "packaging", "forkd.service"))
	// What the simulation stands for; a change to these settings needs a
	// change to testdata/unit-fs.sh too.
	for k, want := range map[string]string{"ProtectSystem": "strict", "PrivateTmp": "yes", "ProtectHome": "yes", "StateDirectory": "forkd", "RuntimeDirectory": "forkd"} {
		if got := unit[k]; len(got) != 1 || got[0] != want {
			t.Fatalf("forkd.service: %s=%v, the simulation assumes %s", k, got, want)
		}
	}
	// The unit's StateDirectory and RuntimeDirectory, as scratch stand-ins
	// (the image cache is this test's own: /var/tmp is private in there).
	data, err := os.MkdirTemp("/var/lib", "forkd-unitfs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(data) })
	run, err := os.MkdirTemp("/run", "forkd-unitfs-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	// The binaries and the recipe, where the simulation still shows them:
	// the checkout may be under /tmp, /var/tmp or /root, which it hides.
	stage, err := os.MkdirTemp("/run", "forkd-unitfs-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(stage) })
	for _, f := range []string{"bin/forkd", "bin/forkd-agent", "recipes/minimal.toml"} {
		copyFile(t, filepath.Join(repoRoot, f), filepath.Join(stage, filepath.Base(f)))
	}
	rw := []string{data, run}
	for _, v := range unit["ReadWritePaths"] {
		rw = append(rw, strings.Fields(v)...)
	}
	cmd := exec.Command(filepath.Join(repoRoot, "integration", "testdata", "unit-fs.sh"))
	cmd.Env = append(os.Environ(),
		"FORKD="+filepath.Join(stage, "forkd"), "FORKD_AGENT="+filepath.Join(stage, "forkd-agent"),
		"DATA="+data, "RUN="+run, "RW="+strings.Join(rw, " "), "PREFIX=fku"+snapshot.NewID()[:4]+"-",
		"RECIPE=minimal", "FORKD_RECIPES="+stage)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "hello from a read-only system") {
		log, _ := os.ReadFile(filepath.Join(run, "serve.log"))
		t.Fatalf("forkd under the unit's file-system settings: %v\n%s\ndaemon log:\n%s", err, out, log)
	}
}
