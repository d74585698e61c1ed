package api

import (
	"context"
	"net"

	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/egress"
	"github.com/forkd-dev/forkd/internal/image"
	"github.com/forkd-dev/forkd/internal/recipe"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// Engine is what the API uses of the sandbox engine (*sandbox.Engine),
// declared here, by its consumer: the routes depend on these methods, not
// on the engine's whole surface.
type Engine interface {
	AgentFor(ctx context.Context, id string) (*agentclient.Client, error)
	Branch(ctx context.Context, id string, opts sandbox.BranchOptions) (*sandbox.BranchResult, error)
	BranchAsync(ctx context.Context, id string, opts sandbox.BranchOptions, done func(*sandbox.BranchResult, error)) (sandbox.PendingSnapshot, error)
	BuildImageWith(ctx context.Context, slot *sandbox.BuildSlot, r *recipe.Recipe, opts sandbox.BuildOptions) (*image.Image, error)
	CheckBuildNetwork(p *egress.Policy) error
	CanRestoreManifest(m *snapshot.Manifest) error
	CheckCreateSnapshot(opts sandbox.CreateSnapshotOptions) error
	CompactFor(ctx context.Context, from, to, tenant string) (*snapshot.Snapshot, error)
	Config() sandbox.Config
	CreateSnapshot(ctx context.Context, opts sandbox.CreateSnapshotOptions) (*snapshot.Snapshot, error)
	DialPort(ctx context.Context, id string, port int) (net.Conn, error)
	DiskUsage() (sandbox.DiskUsage, error)
	Driver() vmm.Driver
	DropPool(ctx context.Context, snapshotID string)
	ForkWith(ctx context.Context, opts sandbox.ForkOptions) ([]*sandbox.Sandbox, error)
	Get(id string) (*sandbox.Sandbox, error)
	Go(ctx context.Context, fn func(ctx context.Context)) error
	Images() ([]*image.Image, error)
	Kill(ctx context.Context, ids []string) ([]string, error)
	KillAll(ctx context.Context) []string
	List() []*sandbox.Sandbox
	Load() sandbox.Load
	Pending(tag string) (sandbox.PendingSnapshot, bool)
	PendingList() []sandbox.PendingSnapshot
	PoolSize(snapshotID string) int
	Prune(ctx context.Context, opts sandbox.PruneOptions) (sandbox.PruneResult, error)
	RemoveImage(ctx context.Context, ref string) (*image.Image, error)
	RemoveSnapshotWith(ctx context.Context, tag string, opts sandbox.RemoveOptions) ([]string, error)
	ResolveRecipe(name, toml string) (*recipe.Recipe, error)
	SetLifetime(id string, l sandbox.Lifetime) (*sandbox.Sandbox, error)
	SetNetwork(id string, p egress.Policy) (egress.Policy, error)
	SnapshotIntact(snap *snapshot.Snapshot) error
	Store() *snapshot.Store
	TenantUsage(tenant string) sandbox.TenantUsage
	TryAcquireBuild(what, tenant string, q sandbox.TenantQuota) (*sandbox.BuildSlot, error)
}

var _ Engine = (*sandbox.Engine)(nil)
