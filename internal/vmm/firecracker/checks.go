package firecracker

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/forkd-dev/forkd/internal/vmm"
)

// Checks probes the host for what the driver needs, for `forkd doctor
// --vmm firecracker`: the firecracker and jailer binaries and their
// version, and a usable /dev/kvm. Every failed check says what to
// install or change.
func Checks(ctx context.Context, opts vmm.Options) []vmm.Check {
	var checks []vmm.Check
	bin := opts.Binary
	if bin == "" {
		bin = DefaultBinary
	}
	path, err := exec.LookPath(bin)
	checks = append(checks, vmm.Check{Name: "firecracker binary", OK: err == nil, Detail: orErr(path, err), Fix: installHint})
	if err == nil {
		v, err := binaryVersion(ctx, path)
		detail := orErr(v, err)
		ok := err == nil && versionAtLeast(v, MinVersion)
		if err == nil {
			detail += " (the driver is written against the " + WrittenAgainst + " API, contract-tested only: see README)"
		}
		checks = append(checks, vmm.Check{Name: "firecracker version", OK: ok, Detail: detail,
			Fix: "install Firecracker " + MinVersion + " or newer: " + installHint})
	}
	j := vmm.Check{Name: "jailer binary", Fix: installHint + " (the release tarball has both; or pass --no-vmm-jail to run Firecracker unjailed)"}
	if opts.NoJail {
		j.OK, j.Detail = true, "off (--no-vmm-jail): Firecracker runs without chroot, uid drop or cgroups"
	} else {
		p, err := exec.LookPath(DefaultJailer)
		j.OK, j.Detail = err == nil, orErr(p, err)
		if err == nil && os.Geteuid() != 0 {
			j.OK, j.Detail = false, p+": the jailer needs root"
		}
	}
	checks = append(checks, j)
	checks = append(checks, kvmCheck())
	return checks
}

// kvmCheck opens /dev/kvm read-write, as Firecracker does: it has no
// software emulation.
func kvmCheck() vmm.Check {
	c := vmm.Check{Name: "kvm", Fix: "Firecracker needs KVM: enable hardware virtualization (VT-x/AMD-V, or nested virtualization), load kvm_intel or kvm_amd, and give forkd read-write access to /dev/kvm; without it use --vmm qemu"}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		c.Detail = err.Error()
		return c
	}
	f.Close()
	c.OK, c.Detail = true, "/dev/kvm opens read-write"
	return c
}

// versionAtLeast compares dotted versions ("1.10.1" >= "1.14.0"),
// ignoring a suffix such as "-dev".
func versionAtLeast(v, min string) bool {
	parse := func(s string) [3]int {
		var out [3]int
		s, _, _ = strings.Cut(s, "-")
		for i, p := range strings.SplitN(s, ".", 3) {
			out[i], _ = strconv.Atoi(p)
		}
		return out
	}
	a, b := parse(v), parse(min)
	for i := range a {
		if a[i] != b[i] {
			return a[i] > b[i]
		}
	}
	return true
}

func orErr(s string, err error) string {
	if err != nil {
		return err.Error()
	}
	return s
}
