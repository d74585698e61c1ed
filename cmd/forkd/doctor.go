package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// hostChecks are the prerequisites outside the VMM driver: privileges, the
// image builder's tools, cgroups and disk. The driver adds its own (VMM
// binary, /dev/kvm, tun, userfaultfd).
func hostChecks(ctx context.Context, g *globals) []apiv1.Check {
	var out []apiv1.Check
	add := func(name string, ok bool, detail, fix string) {
		c := apiv1.Check{Name: name, OK: ok, Detail: detail}
		if !ok {
			c.Fix = fix
		}
		out = append(out, c)
	}
	add("root", os.Geteuid() == 0, fmt.Sprintf("running as uid %d", os.Geteuid()),
		"run forkd as root (sudo): it creates network namespaces and tap devices")
	for _, t := range []struct{ bin, pkg, why string }{
		{"apt-get", "apt", "downloads the kernel and packages"},
		{"dpkg", "dpkg", "unpacks .deb files"},
		{"mkfs.ext4", "e2fsprogs", "builds the read-only root file system"},
		{"mmdebstrap", "mmdebstrap", "builds Debian root file systems (recipes with base = \"debian\")"},
		{"ip", "iproute2", "lets operators inspect sandbox namespaces (ip netns)"},
	} {
		p, err := exec.LookPath(t.bin)
		add("tool "+t.bin, err == nil, orElse(p, "not found")+": "+t.why, "apt-get install -y "+t.pkg)
	}
	lists, _ := filepath.Glob("/var/lib/apt/lists/*Packages*")
	add("apt package lists", len(lists) > 0, fmt.Sprintf("%d package lists", len(lists)), "apt-get update")
	agent, err := agentBinary()
	add("forkd-agent", err == nil, orElse(agent, fmt.Sprint(err)), "make build (puts bin/forkd-agent next to bin/forkd), or set FORKD_AGENT")
	add("cgroups", true, cgroupMode(), "")
	var st unix.Statfs_t
	dir := g.dataDir
	for dir != "/" {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		dir = filepath.Dir(dir)
	}
	if unix.Statfs(dir, &st) == nil {
		free := int64(st.Bavail) * st.Bsize
		add("disk space", free > 4<<30, fmt.Sprintf("%s free under %s", human(free), dir),
			"free space or point --data-dir/FORKD_DATA_DIR at a larger disk: images and snapshots need a few GiB")
	}
	return out
}

func orElse(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// cgroupMode describes the host's cgroup layout (v1, v2 or hybrid); quotas
// come later and must support both.
func cgroupMode() string {
	var st unix.Statfs_t
	if unix.Statfs("/sys/fs/cgroup", &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
		return "cgroup v2 (unified)"
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory"); err == nil {
		if _, err := os.Stat("/sys/fs/cgroup/unified"); err == nil {
			return "cgroup v1 with v2 hybrid (memory controller on v1)"
		}
		return "cgroup v1"
	}
	return "cgroup layout not recognised"
}

func doctorCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check this host for what forkd needs and say how to fix what is missing",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			checks := hostChecks(cmd.Context(), g)
			if ctor, err := vmm.Lookup(g.vmmName); err != nil {
				checks = append(checks, apiv1.Check{Name: "vmm driver", Detail: err.Error(), Fix: "use --vmm " + strings.Join(vmm.List(), " or ")})
			} else {
				for _, c := range ctor.Checks(cmd.Context(), vmm.Options{Accel: vmm.Accel(g.accel)}) {
					checks = append(checks, apiv1.Check{Name: c.Name, OK: c.OK, Detail: c.Detail, Fix: c.Fix})
				}
			}
			if g.jsonOut {
				return printJSON(checks)
			}
			failed := 0
			for _, c := range checks {
				mark := "ok  "
				if !c.OK {
					mark = "FAIL"
					failed++
				}
				fmt.Printf("%s %-22s %s\n", mark, c.Name, c.Detail)
				if !c.OK && c.Fix != "" {
					fmt.Printf("     %-22s fix: %s\n", "", c.Fix)
				}
			}
			if failed > 0 {
				fmt.Printf("\n%d check(s) failed\n", failed)
				return exitError{1}
			}
			fmt.Println("\nall checks passed")
			return nil
		},
	}
	cmd.Flags().StringVar(&g.vmmName, "vmm", envOr("FORKD_VMM", "qemu"), "VMM driver to check")
	cmd.Flags().StringVar(&g.accel, "accel", os.Getenv("FORKD_ACCEL"), "accelerator to check (kvm, tcg, auto)")
	return cmd
}
