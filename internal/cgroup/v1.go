package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// v1 manages groups in the legacy hierarchies (v1 and hybrid hosts).
type v1 struct {
	m *Manager
	// parent maps a subsystem to the parent group's directory in its
	// hierarchy; co-mounted subsystems share it.
	parent map[string]string
	info   []ControllerInfo
	memsw  bool   // swap accounting: memory.memsw.* exist
	weight string // blkio.weight or blkio.bfq.weight, "" when neither
}

func newV1(m *Manager, cfg Config) (*v1, error) {
	b := &v1{m: m, parent: map[string]string{}}
	for s, mnt := range m.h.V1 {
		p := resolve(mnt.Self, cfg.Parent)
		if p == "/" {
			return nil, fmt.Errorf("cgroup: parent %q is the root of the %s hierarchy: %w", cfg.Parent, s, errdefs.ErrInvalidArgument)
		}
		b.parent[s] = filepath.Join(mnt.Mountpoint, p)
	}
	for _, d := range b.uniqueParents() {
		if err := mkdirAll(m.ops.mkdir, d); err != nil {
			return nil, err
		}
	}
	if d, ok := b.parent["memory"]; ok {
		// Limits are hierarchical only with use_hierarchy (always on in
		// recent kernels, where the write fails harmlessly).
		if v, _ := read(d, "memory.use_hierarchy"); v == "0" {
			_ = write(d, "memory.use_hierarchy", "1")
		}
		b.memsw = exists(d, "memory.memsw.limit_in_bytes")
	}
	if d, ok := b.parent["blkio"]; ok {
		for _, f := range []string{"blkio.bfq.weight", "blkio.weight"} {
			if exists(d, f) {
				b.weight = f
				break
			}
		}
	}
	b.info = b.probe()
	return b, nil
}

func (b *v1) probe() []ControllerInfo {
	sub := map[Controller]string{Memory: "memory", CPU: "cpu", Pids: "pids", IO: "blkio"}
	var out []ControllerInfo
	for _, c := range allControllers {
		i := ControllerInfo{Controller: c, Path: b.parent[sub[c]]}
		if i.Path == "" {
			i.Detail = fmt.Sprintf("no cgroup v1 %s hierarchy is mounted", sub[c])
			out = append(out, i)
			continue
		}
		i.Available = true
		switch c {
		case Memory:
			if b.memsw {
				i.Detail = "memory.limit_in_bytes and memory.memsw.limit_in_bytes (no swap)"
			} else {
				i.Detail = "swap accounting is off (no memory.memsw.limit_in_bytes; boot with swapaccount=1): " +
					"memory.swappiness=0 keeps the groups out of swap instead"
			}
		case CPU:
			if _, ok := b.parent["cpuacct"]; !ok {
				i.Detail = "no cpuacct hierarchy: CPU usage is not reported"
			}
		case IO:
			if b.weight == "" {
				i.Available = false
				i.Detail = "blkio has neither blkio.weight nor blkio.bfq.weight: no proportional-weight I/O scheduler (BFQ)"
			} else {
				i.Detail = b.weight
			}
		}
		out = append(out, i)
	}
	return out
}

func (b *v1) controllers() []ControllerInfo { return slices.Clone(b.info) }

// uniqueParents lists each hierarchy's parent directory once, in a fixed
// order.
func (b *v1) uniqueParents() []string {
	var out []string
	for _, s := range v1Subsystems {
		if d, ok := b.parent[s]; ok && !slices.Contains(out, d) {
			out = append(out, d)
		}
	}
	return out
}

func (b *v1) parents() []string { return b.uniqueParents() }

func (b *v1) dirs(id string) []string {
	ps := b.uniqueParents()
	for i := range ps {
		ps[i] = filepath.Join(ps[i], id)
	}
	return ps
}

// dir is the group's directory in subsystem s's hierarchy, "" if none.
func (b *v1) dir(id, s string) string {
	if p, ok := b.parent[s]; ok {
		return filepath.Join(p, id)
	}
	return ""
}

func (b *v1) list() ([]string, error) {
	var ids []string
	for _, p := range b.uniqueParents() {
		names, err := subdirs(p)
		if err != nil {
			return nil, err
		}
		ids = append(ids, names...)
	}
	slices.Sort(ids)
	return slices.Compact(ids), nil
}

func (b *v1) create(id string, l Limits) (err error) {
	var made []string
	defer func() {
		if err != nil {
			for _, d := range made {
				_ = b.m.ops.rmdir(d)
			}
		}
	}()
	for _, d := range b.dirs(id) {
		if err := b.m.ops.mkdir(d); err != nil {
			if errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("cgroup %q: %s exists: %w", id, d, errdefs.ErrAlreadyExists)
			}
			return fmt.Errorf("cgroup %q: create %s: %w", id, d, err)
		}
		made = append(made, d)
	}
	if d := b.dir(id, "memory"); d != "" {
		// The OOM killer must act (a disabled one, inherited from the
		// parent, would freeze the guest instead of killing it).
		if err := write(d, "memory.oom_control", "0"); err != nil {
			return err
		}
		if l.MemoryBytes != 0 {
			v := strconv.FormatInt(l.MemoryBytes, 10)
			if err := write(d, "memory.limit_in_bytes", v); err != nil {
				return err
			}
			// memsw (memory+swap) equal to memory: no swap at all.
			if b.memsw {
				err = write(d, "memory.memsw.limit_in_bytes", v)
			} else {
				err = write(d, "memory.swappiness", "0")
			}
			if err != nil {
				return err
			}
		}
	}
	if d := b.dir(id, "cpu"); d != "" {
		if l.CPUMillicores != 0 {
			if err := b.setCPU(id, l.CPUMillicores); err != nil {
				return err
			}
		}
		if l.CPUWeight != 0 {
			if err := write(d, "cpu.shares", strconv.FormatInt(cpuShares(l.CPUWeight), 10)); err != nil {
				return err
			}
		}
	}
	if d := b.dir(id, "pids"); d != "" && l.Pids != 0 {
		if err := write(d, "pids.max", strconv.FormatInt(l.Pids, 10)); err != nil {
			return err
		}
	}
	if d := b.dir(id, "blkio"); d != "" && l.IOWeight != 0 {
		w := blkioWeight(l.IOWeight)
		if b.weight == "blkio.bfq.weight" {
			w = bfqWeight(l.IOWeight)
		}
		if err := write(d, b.weight, strconv.FormatInt(w, 10)); err != nil {
			return err
		}
	}
	return nil
}

func (b *v1) limits(id string) (Limits, error) {
	var l Limits
	var errs []error
	num := func(s, file string) int64 {
		d := b.dir(id, s)
		if d == "" || !exists(d, file) {
			return 0
		}
		n, err := readUint(d, file)
		errs = append(errs, err)
		return int64(n)
	}
	l.MemoryBytes = num("memory", "memory.limit_in_bytes")
	if q, p := num("cpu", "cpu.cfs_quota_us"), num("cpu", "cpu.cfs_period_us"); q > 0 && p > 0 {
		l.CPUMillicores = q * 1000 / p
	}
	if s := num("cpu", "cpu.shares"); s > 0 {
		l.CPUWeight = cpuWeightFromShares(s)
	}
	l.Pids = num("pids", "pids.max")
	if b.weight != "" {
		if w := num("blkio", b.weight); w > 0 {
			l.IOWeight = w / 5
			if b.weight == "blkio.bfq.weight" {
				l.IOWeight = ioWeightFromBFQ(w)
			}
		}
	}
	return l, errors.Join(errs...)
}

func (b *v1) stats(id string) (Stats, error) {
	var st Stats
	var errs []error
	num := func(s, file string) uint64 {
		d := b.dir(id, s)
		if d == "" || !exists(d, file) {
			return 0
		}
		n, err := readUint(d, file)
		errs = append(errs, err)
		return n
	}
	st.MemoryCurrent = num("memory", "memory.usage_in_bytes")
	st.MemoryPeak = num("memory", "memory.max_usage_in_bytes")
	st.MemoryLimit = num("memory", "memory.limit_in_bytes")
	// With swap accounting the memsw counter (equal limit) is hit first.
	st.MemoryLimitHits = max(num("memory", "memory.failcnt"), num("memory", "memory.memsw.failcnt"))
	st.CPUUsage = time.Duration(num("cpuacct", "cpuacct.usage"))
	st.PidsCurrent = num("pids", "pids.current")
	if d := b.dir(id, "memory"); d != "" {
		n, err := b.oomKills(id)
		st.OOMKills = n
		errs = append(errs, err)
	}
	if d := b.dir(id, "cpu"); d != "" {
		kv, err := readKeyed(d, "cpu.stat")
		st.CPUThrottled, st.CPUThrottledFor = kv["nr_throttled"], time.Duration(kv["throttled_time"])
		errs = append(errs, err)
	}
	if d := b.dir(id, "pids"); d != "" && exists(d, "pids.events") {
		kv, err := readKeyed(d, "pids.events")
		st.PidsLimitHits = kv["max"]
		errs = append(errs, err)
	}
	return st, errors.Join(errs...)
}

func (b *v1) oomKills(id string) (uint64, error) {
	d := b.dir(id, "memory")
	if d == "" {
		return 0, fmt.Errorf("cgroup %q: no memory hierarchy: %w", id, errdefs.ErrFailedPrecondition)
	}
	kv, err := readKeyed(d, "memory.oom_control")
	if err != nil {
		return 0, fmt.Errorf("cgroup %q: %w", id, err)
	}
	n, ok := kv["oom_kill"]
	if !ok { // Linux < 4.13
		return 0, fmt.Errorf("cgroup %q: memory.oom_control has no oom_kill count: %w", id, errdefs.ErrNotImplemented)
	}
	return n, nil
}

func (b *v1) procs(id string) ([]int, error) { return unionPids(b.dirs(id)) }

func (b *v1) add(id string, pid int) error {
	for _, d := range b.dirs(id) {
		if err := write(d, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

func (b *v1) kill(id string) error {
	pids, err := b.procs(id)
	if err != nil {
		return err
	}
	return killAll(pids)
}

// start forks cmd from an OS thread moved into the group: a child is born
// in its parent thread's cgroups (v1 moves threads one by one through
// "tasks"), so the VMM never runs outside. The Go runtime creates no
// threads from a locked one (it hands that to its template thread), and
// the memory cgroup charges the daemon's pages to its thread-group leader,
// so nothing but this fork lands in the group.
func (b *v1) start(id string, cmd *exec.Cmd, via func(func() error) error) error {
	return via(func() error {
		runtime.LockOSThread()
		orig, err := b.m.h.threadCgroups()
		if err != nil {
			runtime.UnlockOSThread()
			return fmt.Errorf("cgroup %q: %w", id, err)
		}
		tid := strconv.Itoa(unix.Gettid())
		var moved []string
		restore := func() error {
			var errs []error
			for _, s := range moved {
				errs = append(errs, write(orig[s], "tasks", tid))
			}
			return errors.Join(errs...)
		}
		var serr error
		for _, s := range v1Subsystems {
			d := b.dir(id, s)
			if d == "" || slices.ContainsFunc(moved, func(m string) bool { return b.parent[m] == b.parent[s] }) {
				continue
			}
			if orig[s] == "" {
				serr = fmt.Errorf("cgroup %q: /proc/thread-self/cgroup has no %s line", id, s)
				break
			}
			if serr = write(d, "tasks", tid); serr != nil {
				break
			}
			moved = append(moved, s)
		}
		if serr == nil {
			serr = cmd.Start()
		}
		if err := restore(); err != nil {
			b.m.log.Error("cgroup: forking thread could not return to the daemon's cgroups; it stays locked and ends with its goroutine",
				"group", id, "err", err)
			return serr
		}
		runtime.UnlockOSThread()
		return serr
	})
}

func (b *v1) watchOOM(ctx context.Context, id string) (<-chan uint64, error) {
	d := b.dir(id, "memory")
	if d == "" {
		return nil, fmt.Errorf("cgroup %q: no memory hierarchy: %w", id, errdefs.ErrFailedPrecondition)
	}
	return watchEventfd(ctx, d, func() (uint64, error) { return b.oomKills(id) })
}

// setCPU writes a CPU quota over a 100 ms period.
func (b *v1) setCPU(id string, millicores int64) error {
	d := b.dir(id, "cpu")
	if d == "" {
		return fmt.Errorf("cgroup %q: no cpu hierarchy: %w", id, errdefs.ErrFailedPrecondition)
	}
	if err := write(d, "cpu.cfs_period_us", strconv.Itoa(cpuPeriodUs)); err != nil {
		return err
	}
	return write(d, "cpu.cfs_quota_us", strconv.FormatInt(millicores*cpuPeriodUs/1000, 10))
}
