package api

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/procfs"
)

// capacity is this host's room for sandboxes (GET /v1/info, admin
// callers): the engine's load against its limits, the host's memory, and
// the data dir's file system. A part the host cannot report is left 0
// and logged by the caller.
func (s *Server) capacity() (*apiv1.InfoCapacity, error) {
	l := s.Engine.Load()
	c := &apiv1.InfoCapacity{
		GuestMemoryCommittedBytes: (l.RunningMiB + l.StartingMiB) << 20,
		GuestMemoryPooledBytes:    l.PooledMiB << 20,
		GuestMemoryLimitBytes:     l.LimitMiB << 20,
		SandboxesRunning:          l.Running + l.Starting,
	}
	var errs []error
	if m, err := procfs.ReadMeminfo(); err != nil {
		errs = append(errs, err)
	} else {
		c.HostMemoryTotalBytes, c.HostMemoryAvailableBytes = m.Total, m.Available
	}
	var st unix.Statfs_t
	if dir := s.Engine.Config().DataDir; dir != "" {
		if err := unix.Statfs(dir, &st); err != nil {
			errs = append(errs, fmt.Errorf("statfs %s: %w", dir, err))
		} else {
			c.DiskTotalBytes = int64(st.Blocks) * st.Bsize
			c.DiskFreeBytes = int64(st.Bavail) * st.Bsize
		}
	}
	return c, errors.Join(errs...)
}
