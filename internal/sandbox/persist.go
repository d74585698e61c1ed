package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/agentclient"
	"github.com/forkd-dev/forkd/internal/agentconn"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/state"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// adoptTimeout bounds re-attaching one sandbox at start-up.
const adoptTimeout = 30 * time.Second

// adoptConcurrency bounds the sandboxes adopted at once at start-up.
const adoptConcurrency = 8

// record renders a sandbox for the state store.
func (e *Engine) record(s *Sandbox) state.SandboxRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := state.SandboxRecord{
		ID: s.ID, Tag: s.Tag, SnapshotID: s.SnapshotID, Created: s.Created,
		ReadyMillis: s.ReadyMillis, Pooled: s.Pooled, State: s.state,
		DeadReason: s.deadReason, ConsoleTail: s.consoleTail, NetNS: s.netns, GuestIP: s.GuestIP, PendingFork: s.pendingFork,
		Labels: s.labels, ExpiresAt: s.expiresAt, IdleTimeoutSeconds: int64(s.idleTimeout / time.Second), EndedAt: s.endedAt,
		VMM: e.cfg.Driver.Name(), Process: vmm.ProcessIdentity{PID: s.pid}, Tenant: s.Tenant, CPUMillicores: s.CPUMillicores,
		PageServed: s.pageServed,
	}
	if s.net != nil {
		p := s.net.Policy()
		rec.Network = &p
		rec.NetNSInode = s.net.ns.Inode()
	}
	if s.base != nil {
		rec.BaseManifest, _ = json.Marshal(s.base) // a struct of plain fields: cannot fail
	}
	if s.machine != nil {
		rec.Machine = s.machine.Config()
		if id, ok := s.machine.(vmm.Identifiable); ok {
			rec.Process = id.ProcessIdentity()
		}
	}
	return rec
}

// persist writes the sandbox's record; it returns once it is durable. A
// sandbox is reported as created only after this succeeded.
func (e *Engine) persist(s *Sandbox) error {
	if e.cfg.State == nil {
		return nil
	}
	s.recMu.Lock()
	defer s.recMu.Unlock()
	if err := e.cfg.State.PutSandbox(e.record(s)); err != nil {
		return fmt.Errorf("sandbox %s: record state: %w", s.ID, err)
	}
	return nil
}

// unpersist removes the sandbox's record. Callers mark the sandbox killed
// first, so a commitFork that did not see the mark wrote before this.
func (e *Engine) unpersist(s *Sandbox) {
	if e.cfg.State == nil {
		return
	}
	s.recMu.Lock()
	defer s.recMu.Unlock()
	if err := e.cfg.State.DeleteSandbox(s.ID); err != nil {
		e.log.Error("removing sandbox record", "sandbox_id", s.ID, "err", err)
	}
}

// adoptRecorded takes over the sandboxes an earlier daemon recorded: each
// running one is adopted (VMM identity verified, QMP and agent
// reconnected), one whose VMM is gone is marked dead with the reason. It
// returns the ids whose VMM, run dir and namespace must be kept.
func (e *Engine) adoptRecorded() map[string]bool {
	keep := map[string]bool{}
	if e.cfg.State == nil {
		return keep
	}
	recs, err := e.cfg.State.Sandboxes()
	if err != nil {
		e.log.Error("reading sandbox records", "err", err)
		return keep
	}
	var running []state.SandboxRecord
	for _, rec := range recs {
		switch {
		case rec.PendingFork != "":
			e.discardPending(rec)
		case rec.State != apiv1.StateRunning:
			e.registerDead(rec)
		default:
			running = append(running, rec)
		}
	}
	// Each adoption waits on its VMM (QMP) and guest agent (a new session
	// that must answer), mostly idle time: adopting several at once keeps
	// a restart with many sandboxes short.
	adopted := make([]*Sandbox, len(running))
	errs := make([]error, len(running))
	sem := make(chan struct{}, adoptConcurrency)
	var wg sync.WaitGroup
	for i, rec := range running {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			adopted[i], errs[i] = e.adoptOne(rec)
		}()
	}
	wg.Wait()
	for i, rec := range running {
		s, err := adopted[i], errs[i]
		if err != nil {
			rec.State = apiv1.StateDead
			rec.EndedAt = time.Now().UTC()
			rec.DeadReason = "VMM lost while the daemon was down: " + err.Error()
			e.log.Warn("sandbox lost across restart", "sandbox_id", rec.ID, "err", err)
			e.registerDead(rec)
			if perr := e.cfg.State.PutSandbox(rec); perr != nil {
				e.log.Error("recording dead sandbox", "sandbox_id", rec.ID, "err", perr)
			}
			e.emit(Event{Kind: EventDied, SandboxID: rec.ID, Tag: rec.Tag, Tenant: rec.Tenant, Reason: rec.DeadReason})
			continue
		}
		keep[rec.ID] = true
		e.log.Info("sandbox adopted", "sandbox_id", s.ID, "pid", s.pid)
	}
	return keep
}

// discardPending forgets a sandbox whose fork never answered: the daemon
// stopped (kill -9, crash) between the child becoming ready and the fork
// committing its children, so no client ever received its id. Its VMM,
// run dir and namespace are not kept: reapLeftovers kills and removes
// them. The record goes, and the audit log says so.
func (e *Engine) discardPending(rec state.SandboxRecord) {
	reason := fmt.Sprintf("created by fork %s, which never answered (the daemon stopped during it): no client has this sandbox, so its VMM is killed", rec.PendingFork)
	e.log.Warn("discarding a sandbox of an unfinished fork", "sandbox_id", rec.ID, "fork", rec.PendingFork, "pid", rec.Process.PID)
	if err := e.cfg.State.DeleteSandbox(rec.ID); err != nil {
		e.log.Error("removing the record of a discarded sandbox", "sandbox_id", rec.ID, "err", err)
	}
	e.emit(Event{Kind: EventDiscarded, SandboxID: rec.ID, Tag: rec.Tag, Tenant: rec.Tenant, Reason: reason})
}

func (e *Engine) adoptOne(rec state.SandboxRecord) (_ *Sandbox, err error) {
	adopter, ok := e.cfg.Driver.(vmm.Adopter)
	if !ok || rec.VMM != e.cfg.Driver.Name() {
		return nil, fmt.Errorf("VMM driver %q cannot adopt a %q VMM", e.cfg.Driver.Name(), rec.VMM)
	}
	if rec.PageServed {
		return nil, errors.New("its memory was served by the previous daemon's page server, which ended with it")
	}
	ctx, cancel := context.WithTimeout(context.Background(), adoptTimeout)
	defer cancel()
	m, err := adopter.Adopt(ctx, rec.AdoptSpec())
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			m.Kill()
		}
	}()
	conn, sess, err := e.reattachAgent(ctx, m, rec.ID)
	if err != nil {
		return nil, err
	}
	sn, err := e.readoptNetwork(rec)
	if err != nil {
		sess.Close()
		conn.Close()
		return nil, fmt.Errorf("network: %w", err)
	}
	s := &Sandbox{
		ID: rec.ID, Tag: rec.Tag, SnapshotID: rec.SnapshotID, Created: rec.Created,
		ReadyMillis: rec.ReadyMillis, Pooled: rec.Pooled, GuestIP: rec.GuestIP, base: baseManifest(rec), Tenant: rec.Tenant, CPUMillicores: rec.CPUMillicores,
		machine: m, pid: m.PID(), netns: rec.NetNS, net: sn, conn: conn, session: sess, agent: e.agentClient(sess),
		teardown: e.sandboxTeardown(rec.NetNS, rec.Machine.RunDir, conn, sn),
		state:    apiv1.StateRunning, exited: make(chan struct{}),
		labels: rec.Labels, expiresAt: rec.ExpiresAt, idleTimeout: time.Duration(rec.IdleTimeoutSeconds) * time.Second,
	}
	s.agent.Gone = s.goneReason
	s.touch()
	if err := e.register(s); err != nil {
		sess.Close()
		return nil, err
	}
	go s.watch(e)
	return s, nil
}

// reattachAgent opens a new agent session with the sandbox's identity: the
// agent dropped the old daemon's session when its connection went away.
// The session must answer a request before it is trusted: under load the
// guest can learn of the old connection's end after the new HELLO (the
// port's "host closed" notice is processed after the new host's bytes),
// and then ends the new session too, silently: the agent goes back to
// awaiting a HELLO and drops the new session's frames, so the host sees no
// EOF and a request on it waits forever. Seen in CI as an EOF on the first
// exec after a restart, and in quick successive restarts as a sandbox
// declared lost when one such wait used up the whole adoption timeout.
// So each attempt has its own short deadline, and a session that does not
// answer is replaced, a few times at most.
func (e *Engine) reattachAgent(ctx context.Context, m vmm.Machine, id string) (net.Conn, *agentconn.Session, error) {
	var lastErr error
	for attempt := 1; attempt <= reattachAttempts; attempt++ {
		conn, sess, err := e.reattachOnce(ctx, m, id)
		if err == nil {
			return conn, sess, nil
		}
		if ctx.Err() != nil {
			return nil, nil, err
		}
		lastErr = err
		e.log.Warn("adopted sandbox's new agent session did not answer; connecting again", "sandbox_id", id, "attempt", attempt, "err", err)
	}
	return nil, nil, fmt.Errorf("agent session did not hold after %d attempts: %w", reattachAttempts, lastErr)
}

// Attempts at a new agent session for an adopted sandbox, and how long
// each may take: a handshake (with its resync after a second) and one info
// request, which a guest answers in milliseconds even under load.
const (
	reattachAttempts = 3
	reattachTimeout  = 5 * time.Second
)

// reattachOnce dials the agent, handshakes and checks that the new
// session answers, all within reattachTimeout.
func (e *Engine) reattachOnce(ctx context.Context, m vmm.Machine, id string) (net.Conn, *agentconn.Session, error) {
	ctx, cancel := context.WithTimeout(ctx, reattachTimeout)
	defer cancel()
	conn, err := m.DialAgent(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("agent socket: %w", err)
	}
	sess, _, err := e.greetAgent(ctx, conn, id)
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("agent did not answer: %w", err)
	}
	// A moment for a late end of the old session to show.
	select {
	case <-sess.Done():
	case <-time.After(25 * time.Millisecond):
	}
	if _, err = agentclient.New(sess).Info(ctx); err != nil {
		sess.Close()
		conn.Close()
		return nil, nil, fmt.Errorf("agent session: %w", err)
	}
	return conn, sess, nil
}

// sandboxTeardown is what a sandbox's end releases besides its VMM.
func (e *Engine) sandboxTeardown(nsName, runDir string, conn interface{ Close() error }, sn *sbNet) []func(context.Context) error {
	return []func(context.Context) error{
		removeAllStep(runDir),
		func(context.Context) error { return e.net.release(sn) },
		func(context.Context) error {
			ns, err := netns.Open(nsName, netns.DefaultTap)
			if err != nil {
				return nil // already gone
			}
			return ns.Remove()
		},
		func(context.Context) error { return conn.Close() },
	}
}

// baseManifest reads the record's copy of the manifest the sandbox was
// forked from; nil if it has none (or an unreadable one: full branches
// then fall back to the snapshot store, as for records without it).
func baseManifest(rec state.SandboxRecord) *snapshot.Manifest {
	if len(rec.BaseManifest) == 0 {
		return nil
	}
	var m snapshot.Manifest
	if json.Unmarshal(rec.BaseManifest, &m) != nil {
		return nil
	}
	return &m
}

// registerDead lists a recorded dead sandbox (it has no VMM) until killed.
func (e *Engine) registerDead(rec state.SandboxRecord) {
	s := &Sandbox{
		ID: rec.ID, Tag: rec.Tag, SnapshotID: rec.SnapshotID, Created: rec.Created,
		ReadyMillis: rec.ReadyMillis, Pooled: rec.Pooled, GuestIP: rec.GuestIP, pid: rec.Process.PID, Tenant: rec.Tenant,
		netns: rec.NetNS, state: apiv1.StateDead,
		// Recorded by an older daemon maybe, which did not escape them.
		deadReason: vmm.EscapeConsole(rec.DeadReason), consoleTail: vmm.EscapeConsole(rec.ConsoleTail),
		labels: rec.Labels, exited: make(chan struct{}), endedAt: rec.EndedAt,
	}
	if s.endedAt.IsZero() {
		// Recorded before EndedAt existed: its retention starts now.
		s.endedAt = time.Now().UTC()
	}
	close(s.exited)
	cleanupDeadResources(rec)
	e.mu.Lock()
	e.sandboxes[s.ID] = s
	e.mu.Unlock()
}

func cleanupDeadResources(rec state.SandboxRecord) {
	if rec.Machine.RunDir != "" {
		os.RemoveAll(rec.Machine.RunDir)
	}
	if rec.NetNS != "" {
		if ns, err := netns.Open(rec.NetNS, netns.DefaultTap); err == nil {
			ns.Remove()
		}
	}
}

// reapLeftovers kills VMM processes and removes run dirs and network
// namespaces of this engine that no adopted sandbox owns: what a crashed
// daemon was preparing (pooled VMMs, forks in flight) or never recorded.
// No VMM is left without an owner.
func (e *Engine) reapLeftovers(keep map[string]bool) {
	vmsDir := filepath.Join(e.cfg.RunDir, "vms")
	if l, ok := e.cfg.Driver.(vmm.Lister); ok {
		for _, v := range l.VMMsUnder(vmsDir) {
			if filepath.Dir(v.RunDir) == vmsDir && keep[filepath.Base(v.RunDir)] {
				continue
			}
			e.log.Warn("killing a VMM no sandbox owns (left by a previous daemon)", "pid", v.PID, "run_dir", v.RunDir)
			syscall.Kill(v.PID, syscall.SIGKILL)
		}
	}
	if c, ok := e.cfg.Driver.(vmm.GroupCleaner); ok {
		// The leftover VMMs' cgroups (killed above), and those of
		// machines no daemon will come back for.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		removed, err := c.RemoveLeftoverGroups(ctx, vmsDir, func(id string) bool { return keep[id] })
		cancel()
		if err != nil {
			e.log.Warn("removing leftover VMM cgroups", "err", err)
		} else if len(removed) > 0 {
			e.log.Info("removed leftover VMM cgroups", "count", len(removed))
		}
	}
	entries, _ := os.ReadDir(filepath.Join(e.cfg.RunDir, "vms"))
	for _, ent := range entries {
		if !keep[ent.Name()] {
			os.RemoveAll(filepath.Join(e.cfg.RunDir, "vms", ent.Name()))
		}
	}
	if _, err := e.net.RemoveLeftovers(keep); err != nil {
		e.log.Warn("removing leftover sandbox uplinks", "err", err)
	}
	if names, err := netns.List(e.cfg.NetNSPrefix); err == nil {
		for _, n := range names {
			if keep[strings.TrimPrefix(n, e.cfg.NetNSPrefix)] {
				continue
			}
			ns, err := netns.Open(n, netns.DefaultTap)
			if err == nil {
				err = ns.Remove()
			}
			if err != nil {
				e.log.Warn("removing leftover network namespace", "netns", n, "err", err)
			}
		}
	}
}
