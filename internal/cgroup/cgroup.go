// Package cgroup gives each sandbox's VMM (one QEMU process) its own
// control group with a hard memory limit without swap, a CPU quota and
// weight, a task limit and an I/O weight, on cgroup v1, hybrid and v2
// hosts.
//
// The daemon makes one Manager. It finds the cgroup layout, creates the
// daemon's parent group ("forkd" below the daemon's own cgroup unless
// configured) and refuses to start when a required controller is missing.
// Each sandbox gets a Group named by its id below that parent, so that a
// restarted daemon finds the groups of sandboxes that died meanwhile
// (Manager.Cleanup).
//
// A guest that exhausts its memory is killed by the OOM killer of its own
// group, alone; Group.OOMKilled tells the daemon afterwards (the kernel
// counts the kill before it sends SIGKILL) and Group.WatchOOM as it
// happens.
//
// The package writes cgroupfs directly rather than using
// github.com/containerd/cgroups: forkd needs a dozen files, the v1/v2
// differences fit in two small backends, and the library would add a
// large dependency tree (runtime-spec, ebpf, dbus, logrus) without
// covering what matters here (placing the process before it runs on v1,
// OOM-kill accounting, memory.oom.group).
package cgroup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Controller names a resource controller by its cgroup v2 name (v1:
// io is blkio).
type Controller string

const (
	Memory Controller = "memory"
	CPU    Controller = "cpu"
	Pids   Controller = "pids"
	IO     Controller = "io"
)

var allControllers = []Controller{Memory, CPU, Pids, IO}

// DefaultRequire is what New requires when Config.Require is nil. I/O is
// not in it: weights need BFQ or io.cost, which many hosts lack.
var DefaultRequire = []Controller{Memory, CPU, Pids}

// Config configures the Manager.
type Config struct {
	// Parent is the daemon's group, under which each sandbox's group is
	// made: absolute inside each hierarchy ("/forkd") or relative to
	// the daemon's own cgroup there ("forkd", "../sandboxes"). Default
	// "forkd".
	Parent string
	// Require lists the controllers New insists on; nil means
	// DefaultRequire, an empty slice none.
	Require []Controller
	// MoveSelf (cgroup v2): when controllers cannot be enabled in the
	// daemon's own cgroup because it holds processes (the "no internal
	// processes" rule), move those processes into a "daemon" leaf below
	// it and retry. For a systemd unit with Delegate=yes.
	MoveSelf bool
	// Hierarchy overrides Detect (tests, unusual mounts).
	Hierarchy *Hierarchy
	// Logger receives warnings (default slog.Default()).
	Logger *slog.Logger
}

// ControllerInfo is one controller's state, for a doctor check.
type ControllerInfo struct {
	Controller Controller
	Available  bool
	// Path is the parent group's directory for it.
	Path string
	// Detail says what is missing, or notes how it is enforced.
	Detail string
}

// Stats are a group's counters. Fields the kernel does not provide are 0.
type Stats struct {
	MemoryCurrent   uint64 // bytes charged now
	MemoryPeak      uint64 // highest charge (v1 max_usage_in_bytes, v2 memory.peak)
	MemoryLimit     uint64 // 0: none
	MemoryLimitHits uint64 // times the limit was hit (v1 failcnt or memsw.failcnt, v2 memory.events max)
	OOMKills        uint64 // processes the group's OOM killer killed
	CPUUsage        time.Duration
	CPUThrottled    uint64 // periods in which the quota ran out
	CPUThrottledFor time.Duration
	PidsCurrent     uint64
	PidsLimitHits   uint64 // forks refused by the pids limit
}

// backend is one cgroup version's file layout.
type backend interface {
	controllers() []ControllerInfo
	parents() []string
	dirs(id string) []string
	list() ([]string, error)
	create(id string, l Limits) error
	limits(id string) (Limits, error)
	stats(id string) (Stats, error)
	oomKills(id string) (uint64, error)
	procs(id string) ([]int, error)
	add(id string, pid int) error
	setCPU(id string, millicores int64) error
	start(id string, cmd *exec.Cmd, via func(func() error) error) error
	kill(id string) error
	watchOOM(ctx context.Context, id string) (<-chan uint64, error)
}

// fsOps are the directory operations; tests on a fake tree replace them
// to do what cgroupfs does on its own (populate and drop control files).
type fsOps struct {
	mkdir func(string) error
	rmdir func(string) error
}

// Manager manages the daemon's parent group and the sandboxes' groups.
type Manager struct {
	h   *Hierarchy
	b   backend
	log *slog.Logger
	ops fsOps
}

// New detects the layout (unless cfg.Hierarchy is set), creates the
// parent group and checks the required controllers: a missing one is an
// errdefs.ErrFailedPrecondition naming it and why.
func New(cfg Config) (*Manager, error) {
	return newManager(cfg, fsOps{mkdir: func(p string) error { return os.Mkdir(p, 0o755) }, rmdir: unix.Rmdir})
}

func newManager(cfg Config, ops fsOps) (*Manager, error) {
	h := cfg.Hierarchy
	if h == nil {
		var err error
		if h, err = Detect(); err != nil {
			return nil, err
		}
	}
	if cfg.Parent == "" {
		cfg.Parent = "forkd"
	}
	if cfg.Require == nil {
		cfg.Require = DefaultRequire
	}
	m := &Manager{h: h, log: cfg.Logger, ops: ops}
	if m.log == nil {
		m.log = slog.Default()
	}
	var err error
	switch h.Mode {
	case ModeV1, ModeHybrid:
		m.b, err = newV1(m, cfg)
	case ModeV2:
		m.b, err = newV2(m, cfg)
	default:
		err = fmt.Errorf("cgroup: unknown layout: %w", errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, c := range m.b.controllers() {
		if !c.Available && slices.Contains(cfg.Require, c.Controller) {
			missing = append(missing, fmt.Sprintf("%s (%s)", c.Controller, c.Detail))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("cgroup %s: required controllers unavailable: %s: %w",
			h.Mode, strings.Join(missing, "; "), errdefs.ErrFailedPrecondition)
	}
	return m, nil
}

// Mode is the host's layout.
func (m *Manager) Mode() Mode { return m.h.Mode }

// Controllers reports each controller's availability, for doctor.
func (m *Manager) Controllers() []ControllerInfo { return m.b.controllers() }

// Check says whether l can be enforced here: an invalid limit is
// ErrInvalidArgument, one whose controller is unavailable
// ErrFailedPrecondition. Create does the same checks.
func (m *Manager) Check(l Limits) error {
	if err := l.Validate(); err != nil {
		return err
	}
	info := m.b.controllers()
	var errs []error
	for _, c := range l.needs() {
		for _, i := range info {
			if i.Controller == c && !i.Available {
				errs = append(errs, fmt.Errorf("cgroup %s: controller %s needed by the limits is unavailable (%s): %w",
					m.h.Mode, c, i.Detail, errdefs.ErrFailedPrecondition))
			}
		}
	}
	return errors.Join(errs...)
}

var idRule = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

func checkID(id string) error {
	if !idRule.MatchString(id) {
		return fmt.Errorf("cgroup: group name %q: want 1-128 of [A-Za-z0-9_.-], starting with a letter or digit: %w",
			id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Create makes the group of sandbox id with limits l. The group must not
// exist (errdefs.ErrAlreadyExists: Cleanup stale ones first).
func (m *Manager) Create(id string, l Limits) (*Group, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if err := m.Check(l); err != nil {
		return nil, err
	}
	if err := m.b.create(id, l); err != nil {
		return nil, err
	}
	return &Group{m: m, id: id}, nil
}

// Open returns the existing group of sandbox id (errdefs.ErrNotFound if
// none), e.g. to watch a VMM a restarted daemon adopts.
func (m *Manager) Open(id string) (*Group, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	for _, d := range m.b.dirs(id) {
		if _, err := os.Stat(d); err == nil {
			return &Group{m: m, id: id}, nil
		}
	}
	return nil, fmt.Errorf("cgroup %q: %w", id, errdefs.ErrNotFound)
}

// List returns the ids of the groups below the parent.
func (m *Manager) List() ([]string, error) { return m.b.list() }

// Cleanup deletes, killing what still runs in them, the groups whose id
// keep rejects (sandboxes that are gone), and returns their ids. Call it
// at daemon start, after adopting the VMMs that survived.
func (m *Manager) Cleanup(ctx context.Context, keep func(id string) bool) ([]string, error) {
	ids, err := m.List()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, id := range ids {
		if keep != nil && keep(id) {
			continue
		}
		g := &Group{m: m, id: id}
		if err := g.Delete(ctx, true); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, id)
	}
	return removed, errors.Join(errs...)
}

// Remove deletes every group (killing what runs in them) and then the
// parent group itself: for tests and for uninstalling.
func (m *Manager) Remove(ctx context.Context) error {
	if _, err := m.Cleanup(ctx, nil); err != nil {
		return err
	}
	var errs []error
	for _, d := range m.b.parents() {
		if err := m.ops.rmdir(d); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("cgroup: remove %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

// Group is one sandbox's cgroup.
type Group struct {
	m  *Manager
	id string
}

// ID is the sandbox id the group is named by.
func (g *Group) ID() string { return g.id }

// Dirs are the group's directories (one per v1 hierarchy, one on v2).
func (g *Group) Dirs() []string { return g.m.b.dirs(g.id) }

// Add moves a running process (all its threads) into the group. On v1 it
// ran outside the limits until now: prefer Start.
func (g *Group) Add(pid int) error { return g.m.b.add(g.id, pid) }

// Start starts cmd (not started) with its process inside the group from
// its first instruction: on v2 through clone3(CLONE_INTO_CGROUP)
// (SysProcAttr.UseCgroupFD; Linux 5.7+), on v1 by forking from an OS
// thread moved into the group for the fork and moved back after it.
//
// via, when not nil, wraps the fork for other per-thread state and must
// call its argument on a goroutine of its own that ends afterwards, as
// netns.DoPath does: g.Start(cmd, func(f func() error) error { return
// netns.DoPath(ns, f) }). Should the thread fail to return to the
// daemon's groups (logged), it stays locked and dies with that goroutine;
// a SysProcAttr.Pdeathsig, which follows the forking thread, then fires.
// On v1 the thread counts against the group's pids limit and CPU quota
// for the moment of the fork.
func (g *Group) Start(cmd *exec.Cmd, via func(func() error) error) error {
	if via == nil {
		via = func(f func() error) error {
			errc := make(chan error, 1)
			go func() { errc <- f() }()
			return <-errc
		}
	}
	return g.m.b.start(g.id, cmd, via)
}

// SetCPU changes the group's CPU quota (millicores, 1000 = one CPU) while
// it runs, e.g. for a pooled VMM handed to a fork that asks for less.
func (g *Group) SetCPU(millicores int64) error {
	if err := (Limits{CPUMillicores: millicores}).Validate(); err != nil {
		return err
	}
	return g.m.b.setCPU(g.id, millicores)
}

// Procs lists the processes in the group.
func (g *Group) Procs() ([]int, error) { return g.m.b.procs(g.id) }

// Limits reads back the limits in force (weights as effective values, a
// default weight as 100).
func (g *Group) Limits() (Limits, error) { return g.m.b.limits(g.id) }

// Stats reads the group's counters.
func (g *Group) Stats() (Stats, error) { return g.m.b.stats(g.id) }

// OOMKills is how many processes the group's OOM killer killed. The kernel
// counts a kill before sending the SIGKILL, so after Wait reports a
// SIGKILL the count already includes it.
func (g *Group) OOMKills() (uint64, error) { return g.m.b.oomKills(g.id) }

// OOMKilled says whether the group's OOM killer killed anything.
func (g *Group) OOMKilled() (bool, error) {
	n, err := g.OOMKills()
	return n > 0, err
}

// WatchOOM sends the group's OOM-kill count each time it rises, until ctx
// ends (then the channel is closed). v1 uses an eventfd on
// memory.oom_control, v2 inotify on memory.events.
func (g *Group) WatchOOM(ctx context.Context) (<-chan uint64, error) {
	return g.m.b.watchOOM(ctx, g.id)
}

// Kill sends SIGKILL to every process in the group (v2: cgroup.kill).
// It does not wait: Delete(ctx, true) does.
func (g *Group) Kill() error { return g.m.b.kill(g.id) }

// Delete removes the group. With kill, it first kills what is left and
// waits until the group is empty; without, a group that still has
// processes is an errdefs.ErrFailedPrecondition. Deleting a group that
// is gone is not an error.
func (g *Group) Delete(ctx context.Context, kill bool) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		procs, err := g.Procs()
		if err != nil {
			return err
		}
		if len(procs) == 0 {
			break
		}
		if !kill {
			return fmt.Errorf("cgroup %q: still has processes %v: %w", g.id, procs, errdefs.ErrFailedPrecondition)
		}
		if err := g.Kill(); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cgroup %q: processes %v outlived SIGKILL: %w", g.id, procs, context.Cause(ctx))
		case <-tick.C:
		}
	}
	for _, d := range g.Dirs() {
		for {
			err := g.m.ops.rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) {
				return fmt.Errorf("cgroup %q: remove %s: %w", g.id, d, err)
			}
			// Exiting tasks still leave the group busy for a moment.
			select {
			case <-ctx.Done():
				return fmt.Errorf("cgroup %q: remove %s: %w (%w)", g.id, d, err, context.Cause(ctx))
			case <-tick.C:
			}
		}
	}
	return nil
}
