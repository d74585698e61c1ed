package apiv1

// Usage is one kind of thing the daemon holds (GET /v1/system/df).
type Usage struct {
	// Count of them; Active: those in use (an image a snapshot was taken
	// from, a snapshot with running sandboxes or pooled VMMs, a memory
	// image a snapshot needs, a running sandbox).
	Count  int `json:"count"`
	Active int `json:"active"`
	// SizeBytes is disk space (allocated bytes) for images, snapshots,
	// layers and memory images; guest memory committed for pools and
	// sandboxes.
	SizeBytes int64 `json:"size_bytes"`
	// ReclaimableBytes is what `forkd system prune --images` would free.
	ReclaimableBytes int64 `json:"reclaimable_bytes"`
}

// DiskUsage answers GET /v1/system/df.
type DiskUsage struct {
	Images    Usage `json:"images"`
	Snapshots Usage `json:"snapshots"` // self-contained snapshots
	Layers    Usage `json:"layers"`    // diff layers (snapshots with a parent)
	// MemoryImages are the assembled memory images forks of layers (and,
	// with --memory-dir, of every snapshot) map.
	MemoryImages Usage `json:"memory_images"`
	// OCILayers is the cache of OCI layers images built with from
	// pulled, shared by digest: active, those an image lists.
	OCILayers Usage `json:"oci_layers"`
	Pools     Usage `json:"pools"` // pooled VMMs, ready for forks
	Sandboxes Usage `json:"sandboxes"`
}

// PruneRequest is POST /v1/system/prune.
type PruneRequest struct {
	// Images also removes the images no snapshot was taken from.
	Images bool `json:"images,omitempty"`
	// DryRun reports what would be removed and removes nothing.
	DryRun bool `json:"dry_run,omitempty"`
}

// PruneResponse is what a prune removed (or, with dry_run, would remove).
type PruneResponse struct {
	DryRun bool `json:"dry_run"`
	// Sandboxes are the dead sandboxes forgotten.
	Sandboxes []string `json:"sandboxes"`
	Images    []Image  `json:"images"`
	// MemoryImages are the digests of the assembled memory images removed.
	MemoryImages []string `json:"memory_images"`
	// OCILayers are the digests of the cached OCI layers removed.
	OCILayers      []string `json:"oci_layers"`
	ReclaimedBytes int64    `json:"reclaimed_bytes"`
	// Skipped says what was left for another prune, and why (the OCI
	// layer cache while a build pulls layers).
	Skipped []string `json:"skipped,omitempty"`
}
