// Package power shuts the VM down cleanly: terminate every process, sync,
// unmount what can be, power off. Only PID 1 may use it.
package power

import (
	"bufio"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/procfs"
)

// Grace is how long processes get between SIGTERM and SIGKILL.
const Grace = 2 * time.Second

// Off powers the VM off. It does not return.
func Off(logf func(string, ...any)) {
	t0 := time.Now()
	// kill(-1) reaches every process but PID 1 (us).
	if unix.Kill(-1, unix.SIGTERM) == nil {
		deadline := time.Now().Add(Grace)
		for othersAlive() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
	}
	_ = unix.Kill(-1, unix.SIGKILL)
	unix.Sync()
	unmountAll(logf)
	unix.Sync()
	logf("powering off (%v)", time.Since(t0).Round(time.Millisecond))
	err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	// No ACPI power-off: a reset ends the VM too when QEMU runs with
	// -no-reboot.
	logf("power off: %v; resetting", err)
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	for {
		time.Sleep(time.Hour)
	}
}

// othersAlive reports whether any user process besides PID 1 still runs.
// (kill(-1, 0) cannot tell: kernel threads count for it.) Zombies do not
// count: the reaper is collecting them.
func othersAlive() bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return false
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == 1 {
			continue
		}
		if st, err := procfs.ReadStat(pid); err == nil && !st.Exited() && st.Flags&procfs.PFKthread == 0 {
			return true
		}
	}
	return false
}

// unmountAll unmounts every mount, innermost first; the root (and whatever
// is busy) is remounted read-only instead.
func unmountAll(logf func(string, ...any)) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return
	}
	var targets []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) >= 2 {
			targets = append(targets, unescape(fields[1]))
		}
	}
	f.Close()
	slices.Reverse(targets)
	for _, t := range targets {
		if t == "/" {
			continue
		}
		if err := unix.Unmount(t, 0); err != nil {
			_ = unix.Mount("", t, "", unix.MS_REMOUNT|unix.MS_RDONLY, "")
		}
	}
	_ = unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY, "")
}

// unescape decodes the octal escapes of /proc/self/mounts (\040 = space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			v := (s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0')
			b.WriteByte(v)
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
