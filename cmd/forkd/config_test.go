package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func serveWithRoot(g *globals) *cobra.Command {
	root := &cobra.Command{Use: "forkd"}
	root.PersistentFlags().StringVar(&g.dataDir, "data-dir", "/var/lib/forkd", "")
	serve := serveCmd(g)
	root.AddCommand(serve)
	return serve
}

func TestConfigFileFillsUnsetFlags(t *testing.T) {
	g := &globals{}
	serve := serveWithRoot(g)
	if err := serve.Flags().Parse([]string{"--pool", "5"}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "forkd.toml")
	os.WriteFile(p, []byte("pool = 1\nmax_fork = 7\ndata_dir = \"/srv/forkd\"\n"), 0o644)
	if _, err := applyConfig(serve, p, true); err != nil {
		t.Fatal(err)
	}
	if g.poolSize != 5 || g.maxFork != 7 || g.dataDir != "/srv/forkd" {
		t.Fatalf("pool %d (flag wins), max fork %d, data dir %q", g.poolSize, g.maxFork, g.dataDir)
	}
}

func TestConfigFileDriverSections(t *testing.T) {
	p := filepath.Join(t.TempDir(), "forkd.toml")
	os.WriteFile(p, []byte("vmm = \"qemu\"\npool = 1\n[driver.qemu]\ncpu = \"max\"\ntb_size_mib = 64\n"), 0o644)
	g := &globals{}
	drivers, err := applyConfig(serveWithRoot(g), p, true)
	if err != nil {
		t.Fatal(err)
	}
	if q := drivers["qemu"]; q["cpu"] != "max" || q["tb_size_mib"] != int64(64) || len(drivers) != 1 {
		t.Fatalf("driver sections %v", drivers)
	}
	if g.vmmName != "qemu" || g.poolSize != 1 {
		t.Fatalf("flags: vmm %q, pool %d", g.vmmName, g.poolSize)
	}
}

func TestConfigFileErrors(t *testing.T) {
	dir := t.TempDir()
	for name, c := range map[string]struct{ src, says string }{
		"unknown key": {"max_forks = 3", `unknown key "max_forks"`},
		"bad value":   {"pool = \"many\"", "pool = many"},
		"bad toml":    {"pool = ", "forkd.toml"},
		"no driver":   {"[driver.nosuch]\ncpu = \"max\"", `"nosuch"`},
		"not a table": {"driver = 3", "want tables"},
		"flat driver": {"[driver]\nqemu = 3", "want a table"},
	} {
		p := filepath.Join(dir, "forkd.toml")
		os.WriteFile(p, []byte(c.src), 0o644)
		_, err := applyConfig(serveWithRoot(&globals{}), p, true)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want invalid argument saying %q", name, err, c.says)
		}
	}
	if _, err := applyConfig(serveWithRoot(&globals{}), filepath.Join(dir, "absent.toml"), false); err != nil {
		t.Errorf("absent default config: %v", err)
	}
	if _, err := applyConfig(serveWithRoot(&globals{}), filepath.Join(dir, "absent.toml"), true); err == nil {
		t.Error("absent explicit config accepted")
	}
}

func TestServeRefusesAnUnknownLogLevel(t *testing.T) {
	serve := serveWithRoot(&globals{})
	conf := filepath.Join(t.TempDir(), "forkd.toml")
	os.WriteFile(conf, nil, 0o644)
	if err := serve.Flags().Parse([]string{"--log-level", "loud", "--config", conf}); err != nil {
		t.Fatal(err)
	}
	err := serve.RunE(serve, nil)
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), `--log-level "loud"`) {
		t.Fatalf("serve --log-level loud: %v", err)
	}
}
