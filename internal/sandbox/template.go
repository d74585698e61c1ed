package sandbox

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/cleanup"
	"github.com/forkd-dev/forkd/internal/egress"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/image"
	"github.com/forkd-dev/forkd/internal/metrics"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/recipe"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/tailbuf"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// bootTimeout bounds a template's cold boot to its agent answering (3-4 s
// under TCG here; generous for a loaded machine).
const bootTimeout = 2 * time.Minute

// warmTimeout bounds the recipe's warm-up code (importing pandas under TCG
// takes 6-8 s).
const warmTimeout = 5 * time.Minute

// CreateSnapshotOptions says what template to make.
type CreateSnapshotOptions struct {
	Tag string
	// Recipe names a recipe in RecipeDirs; RecipeTOML is a recipe's
	// contents. Exactly one is set.
	Recipe     string
	RecipeTOML string
	// Parsed is a recipe already read (a Dockerfile's, with its build
	// context), instead of Recipe and RecipeTOML.
	Parsed *recipe.Recipe
	// Warm replaces the recipe's Python warm-up code when non-empty.
	Warm      string
	MemoryMiB int // 0: the recipe's
	VCPUs     int // 0: the recipe's
	Progress  func(string)
	// Slot is a build slot the caller took with TryAcquireBuild before
	// answering its client; CreateSnapshot releases it when it returns.
	// Nil: CreateSnapshot takes one for Tenant, bound by Quota.MaxBuilds
	// (builds.go; Tenant "": the operator's), or fails with
	// ResourceExhausted.
	Slot   *BuildSlot
	Tenant string
	Quota  TenantQuota
	// Network is the egress policy the snapshot's children inherit; nil:
	// the daemon's default at each fork.
	Network *egress.Policy
	// BuildNetwork is the egress policy of the build VMs of its image's
	// Run steps; nil: the daemon's default.
	BuildNetwork *egress.Policy
	// Registry is how its image's from is pulled (zero: the daemon's
	// docker config, any address); a tenant's build sends its own.
	Registry image.RegistryAccess
}

// templatePlan is what a valid CreateSnapshotOptions resolves to.
type templatePlan struct {
	recipe *recipe.Recipe
	warm   string
}

// CheckCreateSnapshot validates a snapshot creation without starting it:
// tag (valid, free), recipe, memory, vCPUs, warm-up code, and free disk
// space for the template's memory. The API calls it before it commits to
// a progress stream, so bad input is a plain 4xx; CreateSnapshot checks
// the same again.
func (e *Engine) CheckCreateSnapshot(opts CreateSnapshotOptions) error {
	_, err := e.planTemplate(opts)
	return err
}

func (e *Engine) planTemplate(opts CreateSnapshotOptions) (*templatePlan, error) {
	if err := e.store.CheckFree(opts.Tag); err != nil {
		return nil, err
	}
	if opts.Network != nil {
		if _, _, err := e.net.resolve(opts.Network, nil); err != nil {
			return nil, err
		}
	}
	if err := e.checkBuildNetwork(opts.BuildNetwork); err != nil {
		return nil, err
	}
	r := opts.Parsed
	if r == nil {
		var err error
		if r, err = e.ResolveRecipe(opts.Recipe, opts.RecipeTOML); err != nil {
			return nil, err
		}
	} else {
		c := *r // the overrides below must not change the caller's
		r = &c
		if err := r.Validate(); err != nil {
			return nil, err
		}
	}
	if opts.MemoryMiB != 0 {
		if opts.MemoryMiB < 64 || opts.MemoryMiB > 65536 {
			return nil, fmt.Errorf("memory %d MiB out of range 64..65536: %w", opts.MemoryMiB, errdefs.ErrInvalidArgument)
		}
		r.MemoryMiB = opts.MemoryMiB
	}
	if opts.VCPUs != 0 {
		if opts.VCPUs < 1 || opts.VCPUs > 64 {
			return nil, fmt.Errorf("vcpus %d out of range 1..64: %w", opts.VCPUs, errdefs.ErrInvalidArgument)
		}
		r.VCPUs = opts.VCPUs
		if r.CPUs > float64(r.VCPUs) {
			return nil, fmt.Errorf("vcpus %d is below the recipe's cpus %g: %w", r.VCPUs, r.CPUs, errdefs.ErrInvalidArgument)
		}
	}
	warm := r.Python.Warm
	if opts.Warm != "" {
		if !r.Python.Enabled {
			return nil, fmt.Errorf("--warm needs a recipe with a [python] section; %q has none: %w", r.Name, errdefs.ErrInvalidArgument)
		}
		warm = opts.Warm
	}
	if err := e.checkTemplateSpace(opts.Tag, r.MemoryMiB); err != nil {
		return nil, err
	}
	return &templatePlan{recipe: r, warm: warm}, nil
}

// checkTemplateSpace checks that the snapshot store's file system can
// hold a template's memory file (the guest's RAM, written as it runs)
// plus its device state.
func (e *Engine) checkTemplateSpace(tag string, memoryMiB int) error {
	return checkFreeSpace(e.store.Root(), int64(memoryMiB)<<20+spaceMargin,
		fmt.Sprintf("snapshot %q (%d MiB of guest memory)", tag, memoryMiB))
}

// CreateSnapshot boots the recipe's image with its RAM in a shared file,
// warms the Python session, and saves the device state: the parent of every
// later fork. It is staged and committed atomically; on any error no tag is
// left behind.
func (e *Engine) CreateSnapshot(ctx context.Context, opts CreateSnapshotOptions) (_ *snapshot.Snapshot, err error) {
	defer func() {
		if err == nil {
			e.emit(Event{Kind: EventSnapshotCreated, Tag: opts.Tag, Tenant: opts.Tenant, Reason: "template"})
		}
	}()
	start := time.Now()
	progress := opts.Progress
	if progress == nil {
		progress = func(string) {}
	}
	slot := opts.Slot
	defer slot.Release()
	plan, err := e.planTemplate(opts)
	if err != nil {
		return nil, err
	}
	r, warm := plan.recipe, plan.warm
	if slot == nil {
		if slot, err = e.TryAcquireBuild("create snapshot "+opts.Tag, opts.Tenant, opts.Quota); err != nil {
			return nil, err
		}
		defer slot.Release()
	}
	st, err := e.store.Stage(opts.Tag)
	if err != nil {
		return nil, err
	}
	defer st.Abort()

	progress(fmt.Sprintf("building image for recipe %s", r.Name))
	img, err := e.builderFor(BuildOptions{Progress: progress, Network: opts.BuildNetwork, Registry: opts.Registry, Tenant: opts.Tenant}).Build(ctx, r)
	if err != nil {
		return nil, err
	}

	// The image build may have filled the disk the template writes to.
	if err := e.checkTemplateSpace(opts.Tag, r.MemoryMiB); err != nil {
		return nil, err
	}
	id := "tpl-" + snapshot.NewID()
	var cl cleanup.Stack
	defer cl.Clean(ctx)
	runDir := filepath.Join(e.cfg.RunDir, "vms", id)
	cl.Push(removeAllStep(runDir))
	ns, err := netns.Create(ctx, e.cfg.NetNSPrefix+id, netns.Options{})
	if err != nil {
		return nil, fmt.Errorf("template network namespace: %w", err)
	}
	cl.Push(func(context.Context) error { return ns.Remove() })

	vimg := img.VMM()
	vimg.KernelArgs = append(vimg.KernelArgs, guestNetworkArgs()...)
	mc := vmm.MachineConfig{
		ID: id, RunDir: runDir, Image: vimg,
		MemoryMiB: r.MemoryMiB, VCPUs: r.VCPUs, Accel: e.cfg.Accel,
		Network:    &vmm.Network{NetNSPath: ns.Path(), TapName: netns.DefaultTap, MAC: netns.GuestMAC},
		MemoryFile: st.Path(snapshot.MemoryFile),
		ConsoleLog: filepath.Join(runDir, "console.log"),
	}
	progress(fmt.Sprintf("booting template (%d MiB, %d vCPU)", r.MemoryMiB, r.VCPUs))
	bootStart := time.Now()
	m, err := e.cfg.Driver.Boot(ctx, vmm.BootSpec{MachineConfig: mc})
	if err != nil {
		return nil, fmt.Errorf("boot template: %w", err)
	}
	cl.Push(func(context.Context) error { return m.Kill() })
	bctx, cancel := context.WithTimeout(ctx, bootTimeout)
	defer cancel()
	conn, err := m.DialAgent(bctx)
	if err != nil {
		return nil, fmt.Errorf("template agent socket: %w", err)
	}
	cl.Push(func(context.Context) error { return conn.Close() })
	sess, ready, err := e.greetAgent(bctx, conn, id)
	if err != nil {
		return nil, fmt.Errorf("template agent did not answer within %s: %w\nconsole:\n%s", bootTimeout, err, m.ConsoleTail(consoleTailBytes))
	}
	cl.Push(func(context.Context) error { return sess.Close() })
	agent := e.agentClient(sess)
	e.cfg.Metrics.ObserveVMMStart(metrics.PhaseBoot, time.Since(bootStart))
	progress(fmt.Sprintf("agent %s answered after %s", ready.Info.AgentVersion, time.Since(bootStart).Round(time.Millisecond)))

	if r.Python.Enabled {
		progress("starting the Python session and running the warm-up code")
		wctx, cancel := context.WithTimeout(ctx, warmTimeout)
		res, err := agent.StartPython(wctx, agentapi.PythonStartRequest{Warm: warm, TimeoutMillis: warmTimeout.Milliseconds()})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("start Python session: %w", err)
		}
		if res.Warm.Error != nil {
			return nil, fmt.Errorf("warm-up code failed: %s: %s\n%s: %w", res.Warm.Error.Name, res.Warm.Error.Value, res.Warm.Error.Traceback, errdefs.ErrInvalidArgument)
		}
		progress(fmt.Sprintf("warm-up done in %s", time.Duration(res.Warm.DurationMicros)*time.Microsecond))
	}
	if err := runWarmCommands(ctx, agent, r.Warm, progress); err != nil {
		return nil, err
	}

	// The agent ends its session and waits for a new HELLO: that is the
	// state every child resumes in. The host connection stays open through
	// the save so the virtio-serial port is "connected" in the saved state,
	// as it will be in each child.
	if err := agent.Quiesce(ctx); err != nil {
		return nil, fmt.Errorf("quiesce agent: %w", err)
	}
	progress("saving device state")
	saveStart := time.Now()
	res, err := m.Snapshot(ctx, vmm.SnapshotSpec{Type: vmm.SnapshotFull, StateFile: st.Path(snapshot.StateFile), StopAfter: true})
	if err != nil {
		return nil, e.explainNoSpace(fmt.Errorf("save template: %w", err), "snapshot "+opts.Tag)
	}
	e.cfg.Metrics.ObserveVMMStart(metrics.PhaseSnapshotSave, time.Since(saveStart))
	version, _ := e.cfg.Driver.Version(ctx)
	accel := string(m.Config().Accel)
	if res.MemoryFile != st.Path(snapshot.MemoryFile) {
		return nil, fmt.Errorf("driver wrote memory to %s, want %s: %w", res.MemoryFile, st.Path(snapshot.MemoryFile), errdefs.ErrInternal)
	}
	progress("hashing and committing snapshot files")
	snap, err := st.Commit(snapshot.Manifest{
		Image: snapshot.ImageRef{
			Digest: img.Digest, Recipe: r.Name, RecipeDigest: r.Digest(), KernelVersion: img.KernelVersion,
			Kernel: vimg.Kernel, Initrd: vimg.Initrd, Rootfs: vimg.Rootfs, KernelArgs: vimg.KernelArgs,
		},
		VMM:           snapshot.VMMRef{Kind: e.cfg.Driver.Name(), Version: version, Accel: accel},
		MemoryMiB:     r.MemoryMiB,
		VCPUs:         r.VCPUs,
		CPUMillicores: int64(math.Round(r.CPUs * 1000)),
		Python:        snapshot.Python{Enabled: r.Python.Enabled, Warm: strings.TrimSpace(warm), Rehearse: strings.TrimSpace(r.Python.Rehearse)},
		Network:       snapshot.Network{GuestMAC: netns.GuestMAC, GuestIP: netns.GuestAddr, GatewayIP: netns.HostAddr, Policy: opts.Network},
		CreateMillis:  time.Since(start).Milliseconds(),
	})
	if err != nil {
		return nil, e.explainNoSpace(err, "snapshot "+opts.Tag)
	}
	progress(fmt.Sprintf("snapshot %s ready in %s", snap.Tag, time.Since(start).Round(time.Millisecond)))
	if e.cfg.PoolSize > 0 {
		e.poolFor(snap).refill()
	}
	return snap, nil
}

// guestNetworkArgs tell the agent how to configure eth0. The address is the
// same in every sandbox: each lives in its own network namespace. The
// default route and the name server are the tap's address in every clone:
// what the guest reaches through them is its namespace's egress policy
// (internal/egress), which can change without the guest knowing.
func guestNetworkArgs() []string {
	return []string{"forkd.ip=" + netns.GuestAddr + "/30", "forkd.gw=" + netns.HostAddr, "forkd.dns=" + netns.HostAddr}
}

// runWarmCommands runs a recipe's warm commands in the template, in
// order, each with sh -c and within warmTimeout; what they leave running
// is snapshotted with the template. The first that fails (a non-zero exit,
// its timeout) fails the snapshot with the end of its output.
func runWarmCommands(ctx context.Context, agent *agentclient.Client, cmds []string, progress func(string)) error {
	for i, c := range cmds {
		progress(fmt.Sprintf("warm command %d of %d: %s", i+1, len(cmds), firstLine(c)))
		out := tailbuf.New(2048)
		wctx, cancel := context.WithTimeout(ctx, warmTimeout+30*time.Second)
		ev, err := agent.Exec(wctx, agentapi.ExecRequest{Shell: c, TimeoutMillis: warmTimeout.Milliseconds()}, nil, out, out)
		cancel()
		switch {
		case err != nil:
			return fmt.Errorf("warm[%d] %q: %w", i, firstLine(c), err)
		case ev.TimedOut:
			return fmt.Errorf("warm[%d] %q: still running after %s (leave a server running with `cmd &`): %w\n%s", i, firstLine(c), warmTimeout, errdefs.ErrInvalidArgument, out)
		case ev.ExitCode != 0:
			return fmt.Errorf("warm[%d] %q exited with %d: %w\n%s", i, firstLine(c), ev.ExitCode, errdefs.ErrInvalidArgument, out)
		}
	}
	return nil
}

// firstLine is a command's first line, cut to 80 bytes, for messages.
func firstLine(c string) string {
	c, _, _ = strings.Cut(strings.TrimSpace(c), "\n")
	if len(c) > 80 {
		c = c[:80] + "…"
	}
	return c
}
