package qemu

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// DefaultBinary is the QEMU executable looked up in PATH.
const DefaultBinary = "qemu-system-x86_64"

// kvmUsable reports whether KVM can run guests here: /dev/kvm opens for
// reading and writing and the CPU advertises hardware virtualization. The
// second condition matters: some hosts have a /dev/kvm that opens but
// cannot run a guest (QEMU then hangs or fails at start).
func kvmUsable() (bool, string) {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false, fmt.Sprintf("/dev/kvm: %v", errors.Unwrap(err))
	}
	f.Close()
	flags, err := cpuFlags()
	if err != nil {
		return false, err.Error()
	}
	if !flags["vmx"] && !flags["svm"] {
		return false, "/dev/kvm opens but the CPU advertises neither vmx nor svm (no nested virtualization)"
	}
	return true, "/dev/kvm usable"
}

// cpuFlags returns the flags of the first CPU in /proc/cpuinfo.
func cpuFlags() (map[string]bool, error) {
	v, err := cpuinfoField("flags")
	if err != nil {
		return nil, err
	}
	m := map[string]bool{}
	for _, f := range strings.Fields(v) {
		m[f] = true
	}
	return m, nil
}

// cpuinfoField returns a field of the first CPU in /proc/cpuinfo.
func cpuinfoField(name string) (string, error) {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("/proc/cpuinfo has no %q field", name)
}

// hostTSCKHz returns the host's TSC frequency in kHz: the kernel's own
// figure where it exports one, else cpu0's "cpu MHz" (on VMs and hosts
// without frequency scaling that is the TSC rate; with scaling it is the
// current clock, an approximation that still lets a TCG guest boot).
func hostTSCKHz() (int64, error) {
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/tsc_freq_khz"); err == nil {
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && v > 0 {
			return v, nil
		}
	}
	mhz, err := cpuinfoField("cpu MHz")
	if err != nil {
		return 0, err
	}
	return parseMHzToKHz(mhz)
}

// parseMHzToKHz converts "2596.124" (MHz) to 2596124 (kHz) exactly.
func parseMHzToKHz(s string) (int64, error) {
	whole, frac, _ := strings.Cut(strings.TrimSpace(s), ".")
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w <= 0 {
		return 0, fmt.Errorf("cpu MHz %q: not a frequency", s)
	}
	frac = (frac + "000")[:3]
	f, err := strconv.ParseInt(frac, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cpu MHz %q: not a frequency", s)
	}
	return w*1000 + f, nil
}

var versionRE = regexp.MustCompile(`QEMU emulator version (\d+\.\d+\.\d+)(?:\s+\(([^)]*)\))?`)

// ParseVersion extracts the version from `qemu-system-x86_64 --version`
// output: "7.2.22", or "7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)" when the
// build names its package (distributions patch QEMU, and the migration
// stream a snapshot holds is only promised to load into the same build).
func ParseVersion(out string) (string, error) {
	m := versionRE.FindStringSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("unrecognised QEMU version output %q: %w", firstLine(out), errdefs.ErrInternal)
	}
	if m[2] != "" {
		return m[1] + " (" + m[2] + ")", nil
	}
	return m[1], nil
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// binaryVersion runs `binary --version`.
func binaryVersion(ctx context.Context, binary string) (string, error) {
	out, err := exec.CommandContext(ctx, binary, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", binary, err)
	}
	return ParseVersion(string(out))
}

// resolveAccel turns AccelAuto into KVM or TCG and checks an explicit KVM.
func resolveAccel(a vmm.Accel) (vmm.Accel, error) {
	switch a {
	case vmm.AccelAuto:
		if ok, _ := kvmUsable(); ok {
			return vmm.AccelKVM, nil
		}
		return vmm.AccelTCG, nil
	case vmm.AccelKVM:
		if ok, why := kvmUsable(); !ok {
			return "", fmt.Errorf("accel kvm: %s: %w", why, errdefs.ErrFailedPrecondition)
		}
		return a, nil
	case vmm.AccelTCG:
		return a, nil
	}
	return "", fmt.Errorf("accel %q: %w", a, errdefs.ErrInvalidArgument)
}
