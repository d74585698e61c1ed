package qemu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// fakeQEMU is an executable that answers --version as QEMU 7.2 does,
// enough for New.
func fakeQEMU(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "qemu-system-x86_64")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho 'QEMU emulator version 7.2.0'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDriverConfigReachesConfig(t *testing.T) {
	drv, err := newFromOptions(vmm.Options{Binary: fakeQEMU(t), NoJail: true, Config: map[string]any{
		"cpu": "max,-la57", "tb_size_mib": int64(64), "run_as": "nobody",
	}})
	if err != nil {
		t.Fatal(err)
	}
	d := drv.(*Driver)
	if d.cfg.CPU != "max,-la57" || d.cfg.TBSizeMiB != 64 || d.cfg.RunAs != "nobody" {
		t.Fatalf("config %+v", d.cfg)
	}
	// A user named in the config replaces the uid range root would get.
	if d.cfg.UIDs.Count != 0 || d.uids != nil {
		t.Fatalf("run_as set, yet a uid range: %+v", d.cfg.UIDs)
	}
	if !d.NeedsUnprivilegedUserfaultfd() {
		t.Error("a shared unprivileged user needs vm.unprivileged_userfaultfd for live branches")
	}
}

func TestDriverConfigDefaults(t *testing.T) {
	drv, err := newFromOptions(vmm.Options{Binary: fakeQEMU(t), NoJail: true})
	if err != nil {
		t.Fatal(err)
	}
	d := drv.(*Driver)
	if d.cfg.CPU != "" || d.cfg.TBSizeMiB != DefaultTBSizeMiB || d.cfg.RunAs != "" {
		t.Fatalf("config %+v", d.cfg)
	}
	if root := os.Geteuid() == 0; root != (d.uids != nil) {
		t.Errorf("root %v, uid range %+v", root, d.cfg.UIDs)
	}
}

func TestDriverConfigErrors(t *testing.T) {
	for name, c := range map[string]struct {
		section map[string]any
		says    string
	}{
		"unknown key": {map[string]any{"tb_size": 64}, `"tb_size"`},
		"wrong type":  {map[string]any{"tb_size_mib": "big"}, "tb_size_mib"},
		"no user":     {map[string]any{"run_as": "no-such-user-forkd"}, "no-such-user-forkd"},
	} {
		_, err := newFromOptions(vmm.Options{Binary: fakeQEMU(t), NoJail: true, Config: c.section})
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want an invalid argument naming %s", name, err, c.says)
		}
	}
}
