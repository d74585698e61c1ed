package sandbox

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// spaceMargin is what a snapshot needs on disk besides its memory: the
// device state (a few MB), the manifest, a page index, and room for the
// file system's own bookkeeping, so that a snapshot that fits does not
// leave the disk full for everything else.
const spaceMargin = 64 << 20

// statfs is unix.Statfs; tests replace it to report a full disk.
var statfs = unix.Statfs

// checkFreeSpace refuses, before it starts, work that writes up to need
// bytes under dir, when the file system holding dir has less available:
// better a clear refusal now than ENOSPC minutes into a template boot or
// in the middle of a branch (which pauses the sandbox). what names the
// work and why it needs that much ("snapshot create py: 256 MiB of guest
// memory"). It is a FailedPrecondition: retrying does not help until
// space is freed.
func checkFreeSpace(dir string, need int64, what string) error {
	var st unix.Statfs_t
	if err := statfs(dir, &st); err != nil {
		return fmt.Errorf("%s: free space of %s: %w", what, dir, err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if free < need {
		return fmt.Errorf("%s: needs %s free in %s (with %d MiB of margin), the file system has %s available: free some space (remove unused snapshots with `forkd rmi`, images with their directories) or use a data dir on a larger file system (--data-dir): %w",
			what, mib(need), dir, spaceMargin>>20, mib(free), errdefs.ErrFailedPrecondition)
	}
	return nil
}

// mib renders a byte count in MiB, rounded up.
func mib(b int64) string { return fmt.Sprintf("%d MiB", (b+(1<<20)-1)>>20) }

// explainNoSpace turns a full file system (ENOSPC, EDQUOT), met while
// writing a snapshot despite the check up front (something else filled
// it meanwhile), into a FailedPrecondition that says so and that nothing
// was kept (the staging directory is removed); other errors pass as they
// are.
func (e *Engine) explainNoSpace(err error, what string) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return fmt.Errorf("%s: the file system of %s filled up (%w); nothing was kept: free some space and retry: %w",
			what, e.store.Root(), err, errdefs.ErrFailedPrecondition)
	}
	return err
}
