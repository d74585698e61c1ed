package qemu

import (
	"log/slog"
	"sync"

	"golang.org/x/sys/unix"
)

var thpOnce sync.Once

// disableTHPForChildren sets PR_SET_THP_DISABLE on this process, which every
// QEMU it starts inherits across fork and exec. QEMU madvises its TCG
// translation buffer MADV_HUGEPAGE, so each clone faulted it in 2 MiB at a
// time: ~12 MiB of private huge pages per clone for a few MiB of translated
// code. Clones are many and small; per-clone memory matters more than TLB
// reach. The daemon itself does not rely on huge pages.
func disableTHPForChildren(log *slog.Logger) {
	thpOnce.Do(func() {
		if err := unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0); err != nil {
			log.Warn("could not disable transparent huge pages for VMM processes", "err", err)
		}
	})
}
