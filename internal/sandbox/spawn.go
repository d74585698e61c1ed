package sandbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/agentconn"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/cleanup"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/metrics"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/state"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// DefaultReadyTimeout bounds one child's restore plus handshake (Config.
// ReadyTimeout). Generous: under TCG with 50 children starting on 2 cores
// a child can wait seconds for CPU.
const DefaultReadyTimeout = 90 * time.Second

// prepared is a VMM process started for a snapshot, waiting to be restored,
// with its network namespace and agent connection already set up. Everything
// that does not depend on the restore happens here, off the critical path.
type prepared struct {
	id       string
	snap     *snapshot.Snapshot
	machine  vmm.Machine
	netns    string
	net      *sbNet
	conn     net.Conn
	teardown []func(context.Context) error
	took     time.Duration
	// linkTook is the part of took spent linking the network (uplink,
	// rules, resolver): zero for a closed room.
	linkTook time.Duration
	// session is set once the VMM was restored ahead in the pool
	// (ahead.go), rehearsed once its first request was rehearsed.
	session   *agentconn.Session
	rehearsed bool
	// pageServed: its memory is served by this daemon's page server
	// (pageserver.go), which ends with the daemon.
	pageServed bool
}

func (p *prepared) discard(ctx context.Context) {
	if p.session != nil {
		p.session.Close()
	}
	p.machine.Kill()
	cleanup.Run(ctx, p.teardown)
}

// machineConfig is the VM shape of a snapshot: a child must match its
// template exactly (image, memory, vCPUs, devices).
// memFile is the complete memory image of the snapshot (memoryImage).
func (e *Engine) machineConfig(id string, snap *snapshot.Snapshot, runDir, memFile string) vmm.MachineConfig {
	return vmm.MachineConfig{
		ID:     id,
		RunDir: runDir,
		Image: vmm.Image{
			Kernel: snap.Image.Kernel, Initrd: snap.Image.Initrd, Rootfs: snap.Image.Rootfs,
			KernelArgs: snap.Image.KernelArgs,
		},
		MemoryMiB:  snap.MemoryMiB,
		VCPUs:      snap.VCPUs,
		Accel:      vmm.Accel(snap.VMM.Accel),
		MemoryFile: memFile,
		ConsoleLog: filepath.Join(runDir, "console.log"),
		DiskRead:   e.cfg.DiskRead,
		// Children are branched with diff snapshots, which such a
		// driver can take only of a machine restored with tracking on.
		TrackDirtyPages: e.features().DirtyPageTracking,
	}
}

// features is what the driver's snapshots and machines can do
// (vmm.FeatureReporter; none beyond full snapshots without it).
func (e *Engine) features() vmm.Features {
	if fr, ok := e.cfg.Driver.(vmm.FeatureReporter); ok {
		return fr.Features()
	}
	return vmm.Features{}
}

// dialAgent connects pv's agent channel after its restore, unless prepare
// already did (off the fork's path, where the driver allows it before the
// restore: vmm.Features.AgentAfterRestore). The connection closes with
// pv's teardown.
func (e *Engine) dialAgent(ctx context.Context, pv *prepared) error {
	if pv.conn != nil {
		return nil
	}
	conn, err := pv.machine.DialAgent(ctx)
	if err != nil {
		return fmt.Errorf("sandbox %s: agent socket: %w", pv.id, err)
	}
	pv.conn = conn
	pv.teardown = append(pv.teardown, func(context.Context) error { return conn.Close() })
	return nil
}

// poolNice is the CPU niceness pool refills start VMMs with: QEMU's
// start-up is ~40 ms of CPU, and a refill runs right after a fork, when
// the new sandboxes' first requests should have the CPU.
const poolNice = 10

// prepare runs the steps that precede a restore: namespace + tap, VMM
// process in -incoming mode, agent socket connected. nice > 0 starts the
// VMM at a lower CPU priority (pool refills).
func (e *Engine) prepare(ctx context.Context, snap *snapshot.Snapshot, nice int) (_ *prepared, err error) {
	start := time.Now()
	id := newSandboxID()
	var cl cleanup.Stack
	defer func() {
		if err != nil {
			cl.Clean(ctx)
		}
	}()

	runDir := filepath.Join(e.cfg.RunDir, "vms", id)
	cl.Push(removeAllStep(runDir))
	var memFile string
	var pages *pageServer
	if e.cfg.MemoryBackend == vmm.MemoryBackendUffd {
		if pages, err = e.openPageServer(snap, runDir); err != nil {
			return nil, fmt.Errorf("sandbox %s: %w", id, err)
		}
		// Pushed before the VMM's kill, so it runs after it.
		cl.Push(pages.close)
	} else if memFile, err = e.memoryImage(snap); err != nil {
		return nil, err
	}
	ns, err := netns.Create(ctx, e.cfg.NetNSPrefix+id, netns.Options{})
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: network namespace: %w", id, err)
	}
	cl.Push(func(context.Context) error { return ns.Remove() })
	// The snapshot's policy (or the daemon's default) is set up now, off
	// the fork's path; a fork asking for another one changes only rules.
	sn := newSandboxNet(id, ns)
	pol, compiled, err := e.net.resolve(nil, snap.Network.Policy)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: snapshot %s: %w", id, snap.Tag, err)
	}
	linkStart := time.Now()
	if err := e.net.apply(sn, pol, compiled); err != nil {
		return nil, err
	}
	linkTook := time.Since(linkStart)
	cl.Push(func(context.Context) error { return e.net.release(sn) })

	mc := e.machineConfig(id, snap, runDir, memFile)
	mc.Network = &vmm.Network{NetNSPath: ns.Path(), TapName: netns.DefaultTap, MAC: snap.Network.GuestMAC}
	mc.VMGenID = newUUID()
	mc.Nice = nice
	spec := vmm.PrepareSpec{MachineConfig: mc, StateFile: snap.Path(snapshot.StateFile)}
	if pages != nil {
		spec.MemoryBackend, spec.UffdSocket = vmm.MemoryBackendUffd, pages.socket
	}
	m, err := e.cfg.Driver.Prepare(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: start VMM: %w", id, err)
	}
	cl.Push(func(context.Context) error { return m.Kill() })
	if pages != nil {
		pages.start(e, id, m)
	}

	var conn net.Conn
	if !e.features().AgentAfterRestore { // else dialAgent, after the restore
		if conn, err = m.DialAgent(ctx); err != nil {
			return nil, fmt.Errorf("sandbox %s: agent socket: %w", id, err)
		}
		cl.Push(func(context.Context) error { return conn.Close() })
	}
	took := time.Since(start)
	e.cfg.Metrics.ObserveVMMStart(metrics.PhasePrepare, took)
	return &prepared{id: id, snap: snap, machine: m, netns: ns.Name(), net: sn, conn: conn, teardown: cl.Release(), took: took, linkTook: linkTook, pageServed: pages != nil}, nil
}

// canRestore checks that this engine's driver can restore snap: the same
// VMM, and a version it can read.
func (e *Engine) canRestore(snap *snapshot.Snapshot) error {
	if snap.VMM.Kind != e.cfg.Driver.Name() {
		return fmt.Errorf("snapshot %q was made by VMM %q, this daemon runs %q: %w", snap.Tag, snap.VMM.Kind, e.cfg.Driver.Name(), errdefs.ErrFailedPrecondition)
	}
	if rc, ok := e.cfg.Driver.(vmm.RestoreChecker); ok {
		if err := rc.CanRestore(snap.VMM.Version); err != nil {
			return fmt.Errorf("snapshot %q: %w", snap.Tag, err)
		}
	}
	return nil
}

// CanRestoreManifest checks that this engine's driver can restore a
// snapshot described by m, one from another host (a pull): the same VMM
// and a version it can read.
func (e *Engine) CanRestoreManifest(m *snapshot.Manifest) error {
	return e.canRestore(&snapshot.Snapshot{Manifest: *m})
}

// Fork creates n children of the snapshot tagged tag and returns once every
// child's agent answers. If any child fails, every child of the request is
// torn down and the first error is returned; the same happens when ctx ends
// (the client went away), so an abandoned request leaves no VMM behind.
func (e *Engine) Fork(ctx context.Context, tag string, n int) ([]*Sandbox, error) {
	return e.ForkWith(ctx, ForkOptions{Tag: tag, Count: n})
}

// ForkWith is Fork with lifetimes and labels. Its outcome is counted in
// forkd_fork_requests_total.
func (e *Engine) ForkWith(ctx context.Context, opts ForkOptions) (_ []*Sandbox, err error) {
	defer func() { e.cfg.Metrics.ObserveForkRequest(err) }()
	tag, n := opts.Tag, opts.Count
	if err := opts.validate(e.cfg.MaxForkCount); err != nil {
		return nil, err
	}
	if opts.Network != nil {
		if _, _, err := e.net.resolve(opts.Network, nil); err != nil {
			return nil, err
		}
	}
	if err := e.pendingErr(tag); err != nil {
		return nil, err // a branch still being written, or failed
	}
	snap, err := e.store.Get(tag)
	if err != nil {
		return nil, err
	}
	// What the clones will map is checked before any is restored, pooled
	// ones included: a layer's chain must be whole (an ancestor removed or
	// replaced since its VMMs were pooled refuses the fork, and those VMMs
	// go), and no file may have changed since it was committed (that
	// marks the snapshot failed: checkIntact).
	if _, err := e.memoryImage(snap); err != nil {
		if snap.IsLayer() {
			e.DropPool(ctx, snap.ID)
		}
		return nil, err
	}
	if err := checkCPU(opts.CPUMillicores, snap.VCPUs); err != nil {
		return nil, err
	}
	if err := e.canRestore(snap); err != nil {
		return nil, err
	}
	releaseQuota, err := e.reserveTenant(opts.Tenant, opts.Quota, n, snap.MemoryMiB)
	if err != nil {
		return nil, err
	}
	defer releaseQuota()
	p := e.poolFor(snap)
	// Deferred first, so it runs last: after releaseSlots. Once the fork
	// committed, its children count as running; until the release they
	// count as starting too, and a refill that looked in between found
	// no room under the guest memory limit.
	defer p.refill()
	releaseSlots, err := e.reserveSlots(n, p)
	if err != nil {
		return nil, err
	}
	defer releaseSlots()
	// Only an admitted fan-out grows the pool: a refused one would fill
	// it ahead for forks that cannot come.
	p.grow(n, e.cfg.PoolMax, time.Now())
	if opts.RequestID == "" {
		opts.RequestID = "fork-" + snapshot.NewID()
	}

	results := make([]*Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = e.spawnOne(ctx, p, opts)
		}()
	}
	wg.Wait()
	var firstErr error
	for _, err := range errs {
		if err != nil {
			firstErr = err
			break
		}
	}
	if firstErr == nil && ctx.Err() != nil {
		firstErr = fmt.Errorf("fork of %q abandoned: %w", tag, context.Cause(ctx))
	}
	if firstErr == nil {
		firstErr = e.commitFork(opts.RequestID, results)
	}
	if firstErr != nil {
		var ids []string
		for _, s := range results {
			if s != nil {
				ids = append(ids, s.ID)
			}
		}
		e.end(context.WithoutCancel(ctx), ids, "")
		e.cfg.Metrics.ObserveSandboxEvents(metrics.SandboxFailed, n)
		return nil, firstErr
	}
	e.cfg.Metrics.ObserveSandboxEvents(metrics.SandboxCreated, n)
	for _, s := range results {
		e.emit(Event{Kind: EventCreated, SandboxID: s.ID, Tag: s.Tag, Tenant: s.Tenant})
	}
	return results, nil
}

// commitFork makes the children of a fork that is about to answer
// permanent: each was recorded as pending when it became ready, and all
// of them lose that mark in one transaction. A daemon killed before this
// point kills every child of the fork at its next start (none was
// reported); one killed after it re-adopts all of them.
//
// Each child's record lock is held from reading its state to the write,
// as persist and unpersist do: a child killed meanwhile (its id is
// listed) either is seen as killed and skipped, or has its record removed
// after this write, never before it (which would bring it back).
func (e *Engine) commitFork(requestID string, sbs []*Sandbox) error {
	for _, s := range sbs {
		s.recMu.Lock()
		defer s.recMu.Unlock()
	}
	recs := make([]state.SandboxRecord, 0, len(sbs))
	for _, s := range sbs {
		s.mu.Lock()
		s.pendingFork = ""
		killed := s.killed
		s.mu.Unlock()
		if killed {
			continue // killed on request meanwhile: its record is gone for good
		}
		recs = append(recs, e.record(s))
	}
	if e.cfg.State == nil {
		return nil
	}
	if testHookCommitFork != nil {
		testHookCommitFork(sbs)
	}
	if err := e.cfg.State.PutSandboxes(recs); err != nil {
		return fmt.Errorf("fork %s: record its %d sandboxes: %w", requestID, len(sbs), err)
	}
	return nil
}

// testHookCommitFork, set by tests, runs in commitFork just before the
// children's records are written.
var testHookCommitFork func(sbs []*Sandbox)

// spawnOne turns a prepared VMM (pooled, or started now) into a running
// sandbox: restore, then the agent handshake carrying the child's identity.
// A child restored ahead whose hand-out fails (its guest stopped answering
// in the pool) is discarded and the fork goes on with a VMM started and
// restored now: slower, but the caller gets a sandbox.
func (e *Engine) spawnOne(ctx context.Context, p *pool, opts ForkOptions) (*Sandbox, error) {
	select {
	case e.spawnSem <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	defer func() { <-e.spawnSem }()

	start := time.Now()
	pv, pooled := p.take()
	if pv != nil && pv.session != nil && opts.Network != nil {
		// A child restored ahead has run under the pooled policy, and a
		// connection opened then would outlive a change of rules: a fork
		// that asks for another policy gets a VMM restored now.
		if pol, _, err := e.net.resolve(opts.Network, p.snap.Network.Policy); err == nil && !samePolicy(pol, pv.net.Policy()) {
			e.discardLater(pv)
			pv, pooled = nil, false
		}
	}
	s, err := e.spawnFrom(ctx, p, opts, pv, pooled, start)
	var hf *handOutError
	if errors.As(err, &hf) && ctx.Err() == nil {
		e.log.Warn("a pooled child failed its hand-out: restoring another now", "sandbox_id", hf.id, "tag", p.snap.Tag, "err", hf.err)
		e.cfg.Metrics.ObservePoolHandOutFailure(hf.err)
		s, err = e.spawnFrom(ctx, p, opts, nil, false, start)
	}
	return s, err
}

// handOutError is a child restored ahead that could not be handed out.
type handOutError struct {
	id  string
	err error
}

func (h *handOutError) Error() string { return h.err.Error() }
func (h *handOutError) Unwrap() error { return h.err }

// spawnFrom is spawnOne with its VMM: pv taken from the pool (pooled), or
// nil for one started now. start is when the fork began to wait for it.
func (e *Engine) spawnFrom(ctx context.Context, p *pool, opts ForkOptions, pv *prepared, pooled bool, start time.Time) (_ *Sandbox, err error) {
	if pv == nil {
		if pv, err = e.prepare(ctx, p.snap, 0); err != nil {
			return nil, err
		}
	} else if pr, ok := pv.machine.(vmm.Prioritizer); ok {
		// It waited at pool priority; a sandbox runs at normal priority.
		if err := pr.SetNice(0); err != nil {
			e.log.Warn("could not restore a pooled VMM's CPU priority", "sandbox_id", pv.id, "err", err)
		}
	}
	defer func() {
		if err != nil {
			pv.discard(ctx)
		}
	}()
	cpu, err := e.applyCPULimit(pv, p.snap, opts.CPUMillicores)
	if err != nil {
		return nil, err
	}
	var phases ReadyPhases
	if !pooled {
		phases.PrepareMillis = millis(pv.took)
		phases.NetworkMillis = millis(pv.linkTook)
	}
	if opts.Network != nil {
		// Before the guest runs (a child restored ahead under another
		// policy was not taken, above): it never sends under the pooled one.
		pol, compiled, err := e.net.resolve(opts.Network, p.snap.Network.Policy)
		if err != nil {
			return nil, err
		}
		if !samePolicy(pol, pv.net.Policy()) {
			t := time.Now()
			if err := e.net.apply(pv.net, pol, compiled); err != nil {
				return nil, err
			}
			phases.NetworkMillis += since(t)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, e.cfg.ReadyTimeout)
	defer cancel()
	var sess *agentconn.Session
	if pv.session != nil {
		t := time.Now()
		if sess, err = e.handOut(rctx, pv); err != nil {
			return nil, &handOutError{id: pv.id, err: err}
		}
		phases.HandOutMillis = since(t)
	} else {
		restoreStart := time.Now()
		if _, err := pv.machine.Restore(rctx); err != nil {
			return nil, fmt.Errorf("sandbox %s: restore: %w (console: %s)", pv.id, err, pv.machine.ConsoleTail(512))
		}
		e.cfg.Metrics.ObserveVMMStart(metrics.PhaseRestore, time.Since(restoreStart))
		phases.RestoreMillis = since(restoreStart)
		t := time.Now()
		if err := e.dialAgent(rctx, pv); err != nil {
			return nil, err
		}
		if sess, _, err = e.greetAgent(rctx, pv.conn, pv.id); err != nil {
			return nil, fmt.Errorf("sandbox %s: agent did not answer: %w (console: %s)", pv.id, err, pv.machine.ConsoleTail(512))
		}
		phases.HelloMillis = since(t)
	}
	s := &Sandbox{
		ID: pv.id, Tag: p.snap.Tag, SnapshotID: p.snap.ID, Created: time.Now().UTC(),
		ReadyMillis: since(start), Phases: phases, Pooled: pooled, Rehearsed: pv.rehearsed, pageServed: pv.pageServed, GuestIP: p.snap.Network.GuestIP, base: &p.snap.Manifest, Tenant: opts.Tenant,
		machine: pv.machine, pid: pv.machine.PID(), netns: pv.netns, net: pv.net, conn: pv.conn, session: sess,
		agent: e.agentClient(sess), teardown: pv.teardown,
		state: apiv1.StateRunning, exited: make(chan struct{}),
		labels: opts.Labels, idleTimeout: opts.IdleTimeout, pendingFork: opts.RequestID, CPUMillicores: cpu,
	}
	s.agent.Gone = s.goneReason
	if opts.Timeout > 0 {
		s.expiresAt = s.Created.Add(opts.Timeout)
	}
	s.touch()
	// Durable before it is listed or reported, as pending: a daemon killed
	// before the fork answers kills it at its next start, one killed
	// after re-adopts it (commitFork).
	if err := e.persist(s); err != nil {
		sess.Close()
		return nil, err
	}
	if err := e.register(s); err != nil {
		e.unpersist(s)
		sess.Close()
		return nil, err
	}
	e.cfg.Metrics.ObserveForkReady(MetricsTag(p.snap), pooled, time.Since(start))
	go s.watch(e)
	return s, nil
}

// newIdentity makes what distinguishes a child from its siblings: its id as
// hostname, the host's clock, and fresh entropy for every RNG in the guest.
func newIdentity(id string) agentapi.Identity {
	entropy := make([]byte, 64)
	if _, err := rand.Read(entropy); err != nil {
		panic(err)
	}
	return agentapi.Identity{SandboxID: id, Hostname: id, UnixNano: time.Now().UnixNano(), Entropy: entropy}
}

func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// agentClient returns a client of a sandbox's agent whose calls are timed
// in the engine's metrics.
func (e *Engine) agentClient(sess *agentconn.Session) *agentclient.Client {
	c := agentclient.New(sess)
	c.Observe = e.cfg.Metrics.ObserveAgentRPC
	return c
}
