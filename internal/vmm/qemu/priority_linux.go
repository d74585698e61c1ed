package qemu

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/vmm"
)

var _ vmm.Prioritizer = (*Machine)(nil)

// SetNice sets the niceness of every thread of the VMM process: Linux keeps
// niceness per thread, and QEMU runs vCPUs and I/O on threads of their own.
func (m *Machine) SetNice(nice int) error {
	pid := m.PID()
	if pid == 0 {
		return fmt.Errorf("qemu %s: process has exited", m.cfg.ID)
	}
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return fmt.Errorf("qemu %s: threads: %w", m.cfg.ID, err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil && err != unix.ESRCH {
			return fmt.Errorf("qemu %s: set niceness of thread %d: %w", m.cfg.ID, tid, err)
		}
	}
	return nil
}
