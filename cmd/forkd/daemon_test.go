package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/forkd-dev/forkd/internal/api"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// --max-connections: default, environment, config file and flag, in that
// order of precedence; a bad value stops the daemon before it starts.
func TestServeMaxConnections(t *testing.T) {
	conf := func(src string) string {
		p := filepath.Join(t.TempDir(), "forkd.toml")
		os.WriteFile(p, []byte(src), 0o644)
		return p
	}
	value := func(args []string, config string) string {
		t.Helper()
		serve := serveWithRoot(&globals{})
		if err := serve.Flags().Parse(args); err != nil {
			t.Fatal(err)
		}
		if _, err := applyConfig(serve, config, true); err != nil {
			t.Fatal(err)
		}
		return serve.Flags().Lookup("max-connections").Value.String()
	}
	if got := value(nil, conf("")); got != strconv.Itoa(api.DefaultMaxConnections) {
		t.Errorf("default %s", got)
	}
	t.Setenv("FORKD_MAX_CONNECTIONS", "7")
	if got := value(nil, conf("")); got != "7" {
		t.Errorf("from the environment: %s", got)
	}
	if got := value(nil, conf("max_connections = 9")); got != "9" {
		t.Errorf("config file over the environment: %s", got)
	}
	if got := value([]string{"--max-connections", "11"}, conf("max_connections = 9")); got != "11" {
		t.Errorf("flag over the config file: %s", got)
	}

	refused := func(args []string, says string) {
		t.Helper()
		serve := serveWithRoot(&globals{})
		if err := serve.Flags().Parse(append(args, "--config", conf(""))); err != nil {
			t.Fatal(err)
		}
		err := serve.RunE(serve, nil)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), says) {
			t.Errorf("%v: %v, want invalid argument saying %q", args, err, says)
		}
	}
	refused([]string{"--max-connections", "-1"}, "--max-connections -1")
	t.Setenv("FORKD_MAX_CONNECTIONS", "lots")
	refused(nil, `FORKD_MAX_CONNECTIONS="lots"`)
}

// accelDriver is a driver that only resolves accelerators.
type accelDriver struct {
	vmm.Driver
	accel vmm.Accel
}

func (d accelDriver) Accel(vmm.Accel) (vmm.Accel, error) { return d.accel, nil }

// The daemon says at start-up that TCG is no security boundary, and says
// nothing of it under KVM.
func TestWarnIfEmulated(t *testing.T) {
	for accel, want := range map[vmm.Accel]bool{vmm.AccelTCG: true, vmm.AccelKVM: false} {
		var b strings.Builder
		warnIfEmulated(slog.New(slog.NewTextHandler(&b, nil)), accelDriver{accel: accel}, vmm.AccelAuto)
		if got := strings.Contains(b.String(), "not a security boundary"); got != want {
			t.Errorf("%s: warned %v, want %v: %q", accel, got, want, b.String())
		}
	}
}

// --guest-memory-share: a multiple of this host's RAM, 0 for no limit;
// out of range stops the daemon.
func TestGuestMemoryLimit(t *testing.T) {
	if miB, err := guestMemoryLimit(0); miB != 0 || err != nil {
		t.Errorf("share 0: %d, %v", miB, err)
	}
	one, err := guestMemoryLimit(1)
	if err != nil || one < 64 {
		t.Fatalf("share 1: %d MiB, %v", one, err)
	}
	if def, _ := guestMemoryLimit(defaultGuestMemShare); def < one {
		t.Errorf("the default share gives %d MiB, less than the host's %d", def, one)
	}
	for _, bad := range []float64{-1, 101} {
		if _, err := guestMemoryLimit(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("share %g: %v", bad, err)
		}
	}
}

// TestDiskReadFlags: the disk read limits come from the environment unless
// a flag says otherwise; a value that does not parse, or is out of range,
// stops the engine's start naming it (never a silent default).
func TestDiskReadFlags(t *testing.T) {
	flags := func(args ...string) *globals {
		t.Helper()
		g := &globals{}
		f := pflag.NewFlagSet("t", pflag.ContinueOnError)
		addVMMFlags(f, g)
		if err := f.Parse(args); err != nil {
			t.Fatal(err)
		}
		return g
	}
	if g := flags(); g.diskReadMiBps != defaultDiskReadMiBps || g.diskReadIOPS != defaultDiskReadIOPS {
		t.Errorf("defaults %d, %d", g.diskReadMiBps, g.diskReadIOPS)
	}
	t.Setenv("FORKD_DISK_READ_MBPS", "8")
	if g := flags(); g.diskReadMiBps != 8 {
		t.Errorf("from the environment: %d", g.diskReadMiBps)
	}
	if g := flags("--disk-read-mbps", "16"); g.diskReadMiBps != 16 {
		t.Errorf("the flag over the environment: %d", g.diskReadMiBps)
	}
	refused := func(g *globals, says string) {
		t.Helper()
		_, _, err := g.newEngine(engineDeps{})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), says) {
			t.Errorf("%v, want invalid argument saying %q", err, says)
		}
	}
	refused(flags("--disk-read-iops", "-1"), "--disk-read-iops -1")
	t.Setenv("FORKD_DISK_READ_MBPS", "fast")
	refused(flags(), `FORKD_DISK_READ_MBPS="fast"`)
}

func TestUnitOfCgroup(t *testing.T) {
	for in, want := range map[string]string{
		"0::/system.slice/forkd.service\n":                                    "forkd.service",
		"12:pids:/x\n1:name=systemd:/system.slice/forkd-test.service\n0::/\n": "forkd-test.service",
		"0::/user.slice/user-0.slice/user@0.service/app.slice/x.scope\n":      "",
		"0::/user.slice/user-1000.slice/session-3.scope\n":                    "",
		"0::/\n": "",
	} {
		if got := unitOfCgroup([]byte(in)); got != want {
			t.Errorf("unitOfCgroup(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestInstallDirsOf(t *testing.T) {
	// A PREFIX install (`make install PREFIX=/opt/forkd`, the release
	// tarball) finds forkd-agent and the recipes from the binary alone.
	prefix := t.TempDir()
	for _, p := range []string{"bin/forkd", "lib/forkd/forkd-agent", "share/forkd/recipes/minimal.toml"} {
		p = filepath.Join(prefix, p)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var agent, recipes string
	for _, d := range installDirsOf(filepath.Join(prefix, "bin", "forkd")) {
		if _, err := os.Stat(filepath.Join(d, "forkd-agent")); err == nil && agent == "" {
			agent = filepath.Join(d, "forkd-agent")
		}
		if _, err := os.Stat(filepath.Join(d, "recipes", "minimal.toml")); err == nil && recipes == "" {
			recipes = filepath.Join(d, "recipes")
		}
	}
	if agent != filepath.Join(prefix, "lib/forkd/forkd-agent") || recipes != filepath.Join(prefix, "share/forkd/recipes") {
		t.Fatalf("agent %q, recipes %q: want them under %s/lib/forkd and %s/share/forkd", agent, recipes, prefix, prefix)
	}
}

// --pool-max takes FORKD_POOL_MAX as its default; the flag wins, and a
// value that does not parse fails the engine's start naming it.
func TestPoolMaxFlag(t *testing.T) {
	flags := func(args ...string) *globals {
		t.Helper()
		g := &globals{}
		f := pflag.NewFlagSet("t", pflag.ContinueOnError)
		addPoolFlags(f, g, "pool")
		if err := f.Parse(args); err != nil {
			t.Fatal(err)
		}
		return g
	}
	if g := flags(); g.poolMax != sandbox.DefaultPoolMax || g.poolSize != sandbox.DefaultPoolSize {
		t.Errorf("defaults: pool %d, pool max %d", g.poolSize, g.poolMax)
	}
	t.Setenv("FORKD_POOL_MAX", "0")
	if g := flags(); g.poolMax != 0 {
		t.Errorf("from the environment: %d", g.poolMax)
	}
	if g := flags("--pool-max", "8"); g.poolMax != 8 {
		t.Errorf("the flag over the environment: %d", g.poolMax)
	}
	t.Setenv("FORKD_POOL_MAX", "lots")
	_, _, err := flags().newEngine(engineDeps{})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `FORKD_POOL_MAX="lots"`) {
		t.Errorf("%v, want invalid argument naming FORKD_POOL_MAX", err)
	}
}
