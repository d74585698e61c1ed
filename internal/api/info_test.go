package api

import (
	"testing"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/sandbox"
)

// TestInfoCapacityForAdminsOnly: an admin's GET /v1/info carries the
// host's room for sandboxes (the engine's limit, the host's memory, the
// data dir's file system); a tenant's does not.
func TestInfoCapacityForAdminsOnly(t *testing.T) {
	tk := newTenancy(t, func(c *sandbox.Config) { c.MaxGuestMemoryMiB = 3072 })
	var info apiv1.Info
	tk.getJSON("ops", "/v1/info", &info)
	c := info.Capacity
	if c == nil {
		t.Fatalf("admin's info has no capacity: %+v", info)
	}
	if c.GuestMemoryLimitBytes != 3072<<20 || c.GuestMemoryCommittedBytes != 0 || c.SandboxesRunning != 0 {
		t.Errorf("engine load %+v, want limit 3 GiB and nothing running", c)
	}
	if c.HostMemoryTotalBytes <= 0 || c.HostMemoryAvailableBytes <= 0 || c.HostMemoryAvailableBytes > c.HostMemoryTotalBytes {
		t.Errorf("host memory %d available of %d", c.HostMemoryAvailableBytes, c.HostMemoryTotalBytes)
	}
	if c.DiskTotalBytes <= 0 || c.DiskFreeBytes < 0 || c.DiskFreeBytes > c.DiskTotalBytes {
		t.Errorf("data dir's disk %d free of %d", c.DiskFreeBytes, c.DiskTotalBytes)
	}
	for _, who := range []string{"alice", "viewer"} {
		var info apiv1.Info
		tk.getJSON(who, "/v1/info", &info)
		if info.Capacity != nil {
			t.Errorf("%s (not an admin) was shown the host's capacity: %+v", who, info.Capacity)
		}
	}
}
