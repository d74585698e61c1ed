package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// v2 manages groups in the unified hierarchy.
type v2 struct {
	m        *Manager
	parent   string // the parent group's directory
	info     []ControllerInfo
	avail    map[Controller]bool
	swapMax  bool     // memory.swap.max exists (swap accounting on)
	oomGroup bool     // memory.oom.group exists (Linux 4.19+)
	ioFiles  []string // io.weight and/or io.bfq.weight
}

const noInternalProcsHint = ` (cgroup v2 forbids enabling controllers for the children of a group that holds processes: ` +
	`give forkd a delegated cgroup (systemd Delegate=yes) and a parent outside its own cgroup, ` +
	`e.g. "../sandboxes" with DelegateSubgroup=daemon, or set MoveSelf)`

func newV2(m *Manager, cfg Config) (*v2, error) {
	h := m.h
	p := resolve(h.UnifiedSelf, cfg.Parent)
	if p == "/" {
		return nil, fmt.Errorf("cgroup: parent %q is the root of the unified hierarchy: %w", cfg.Parent, errdefs.ErrInvalidArgument)
	}
	b := &v2{m: m, parent: filepath.Join(h.Unified, p), avail: map[Controller]bool{}}
	detail := map[Controller]string{}
	wanted := slices.Clone(allControllers)
	// Enable the controllers on the way down: each group's
	// subtree_control gives them to its children, the parent's to the
	// sandboxes' groups.
	comps := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur := "/"
	for i := 0; ; i++ {
		dir := filepath.Join(h.Unified, cur)
		if err := mkdirAll(m.ops.mkdir, dir); err != nil {
			return nil, err
		}
		have, err := read(dir, "cgroup.controllers")
		if err != nil {
			return nil, fmt.Errorf("cgroup: %w", err)
		}
		var todo, kept []Controller
		for _, c := range wanted {
			switch {
			case !slices.Contains(strings.Fields(have), string(c)):
				detail[c] = fmt.Sprintf("not in %s/cgroup.controllers (%q): not delegated", dir, have)
			case !b.enabled(dir, c):
				todo = append(todo, c)
			default:
				kept = append(kept, c)
			}
		}
		if len(todo) > 0 {
			err := b.enable(dir, todo)
			if errors.Is(err, unix.EBUSY) && cfg.MoveSelf && cur == h.UnifiedSelf {
				if err = b.moveSelf(dir); err == nil {
					err = b.enable(dir, todo)
				}
			}
			for _, c := range todo {
				if b.enabled(dir, c) {
					kept = append(kept, c)
					continue
				}
				hint := ""
				if errors.Is(err, unix.EBUSY) {
					hint = noInternalProcsHint
				}
				detail[c] = fmt.Sprintf("cannot enable it in %s/cgroup.subtree_control: %v%s", dir, err, hint)
			}
		}
		wanted = kept
		if i == len(comps) {
			break
		}
		cur = path.Join(cur, comps[i])
	}
	for _, c := range wanted {
		b.avail[c] = true
	}
	b.swapMax = exists(b.parent, "memory.swap.max")
	b.oomGroup = exists(b.parent, "memory.oom.group")
	for _, f := range []string{"io.weight", "io.bfq.weight"} {
		if exists(b.parent, f) {
			b.ioFiles = append(b.ioFiles, f)
		}
	}
	switch {
	case !b.avail[Memory]:
	case !b.swapMax && hostHasSwap():
		b.avail[Memory] = false
		detail[Memory] = "the host has swap but no memory.swap.max (swap accounting off): a limit could not deny swap; " +
			"enable swap accounting (swapaccount=1) or turn swap off"
	case !b.swapMax:
		detail[Memory] = "memory.max; no memory.swap.max (swap accounting off) and the host has no swap"
	default:
		detail[Memory] = "memory.max, memory.swap.max=0"
		if b.oomGroup {
			detail[Memory] += ", memory.oom.group=1"
		}
	}
	if b.avail[IO] {
		if len(b.ioFiles) == 0 {
			b.avail[IO] = false
			detail[IO] = "neither io.weight nor io.bfq.weight in " + b.parent
		} else {
			detail[IO] = strings.Join(b.ioFiles, ", ") + " (io.weight acts only where io.cost is enabled, io.bfq.weight with BFQ)"
		}
	}
	for _, c := range allControllers {
		b.info = append(b.info, ControllerInfo{Controller: c, Available: b.avail[c], Path: b.parent, Detail: detail[c]})
	}
	return b, nil
}

func (b *v2) enabled(dir string, c Controller) bool {
	s, _ := read(dir, "cgroup.subtree_control")
	for _, f := range strings.Fields(s) {
		if strings.TrimPrefix(f, "+") == string(c) {
			return true
		}
	}
	return false
}

// enable writes all of cs at once, then, if that fails, one by one, so
// that the ones that can be enabled are.
func (b *v2) enable(dir string, cs []Controller) error {
	line := ""
	for _, c := range cs {
		line += " +" + string(c)
	}
	err := write(dir, "cgroup.subtree_control", strings.TrimSpace(line))
	if err == nil || len(cs) == 1 {
		return err
	}
	var errs []error
	for _, c := range cs {
		errs = append(errs, write(dir, "cgroup.subtree_control", "+"+string(c)))
	}
	return errors.Join(errs...)
}

// moveSelf moves every process of dir (the daemon's cgroup) into a
// "daemon" leaf below it.
func (b *v2) moveSelf(dir string) error {
	leaf := filepath.Join(dir, "daemon")
	if err := mkdirAll(b.m.ops.mkdir, leaf); err != nil {
		return err
	}
	pids, err := readPids(dir)
	if err != nil {
		return err
	}
	for _, p := range pids {
		if err := write(leaf, "cgroup.procs", strconv.Itoa(p)); err != nil && !errors.Is(err, unix.ESRCH) {
			return err
		}
	}
	b.m.log.Info("cgroup: moved the daemon's processes into a leaf group", "from", dir, "to", leaf, "pids", pids)
	return nil
}

func (b *v2) controllers() []ControllerInfo { return slices.Clone(b.info) }

func (b *v2) parents() []string { return []string{b.parent} }

func (b *v2) dirs(id string) []string { return []string{filepath.Join(b.parent, id)} }

func (b *v2) dir(id string) string { return filepath.Join(b.parent, id) }

func (b *v2) list() ([]string, error) { return subdirs(b.parent) }

func (b *v2) create(id string, l Limits) (err error) {
	d := b.dir(id)
	if err := b.m.ops.mkdir(d); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("cgroup %q: %s exists: %w", id, d, errdefs.ErrAlreadyExists)
		}
		return fmt.Errorf("cgroup %q: create %s: %w", id, d, err)
	}
	defer func() {
		if err != nil {
			_ = b.m.ops.rmdir(d)
		}
	}()
	var w []string // file, value pairs
	if b.avail[Memory] {
		if b.oomGroup {
			// Kill the whole group on OOM: a sandbox is whole or dead.
			w = append(w, "memory.oom.group", "1")
		}
		if l.MemoryBytes != 0 {
			w = append(w, "memory.max", strconv.FormatInt(l.MemoryBytes, 10))
			if b.swapMax {
				w = append(w, "memory.swap.max", "0")
			}
		}
	}
	if l.CPUMillicores != 0 {
		w = append(w, "cpu.max", cpuMax(l.CPUMillicores))
	}
	if l.CPUWeight != 0 {
		w = append(w, "cpu.weight", strconv.FormatInt(l.CPUWeight, 10))
	}
	if l.Pids != 0 {
		w = append(w, "pids.max", strconv.FormatInt(l.Pids, 10))
	}
	if l.IOWeight != 0 {
		for _, f := range b.ioFiles {
			v := "default " + strconv.FormatInt(l.IOWeight, 10)
			if f == "io.bfq.weight" {
				v = strconv.FormatInt(bfqWeight(l.IOWeight), 10)
			}
			w = append(w, f, v)
		}
	}
	for i := 0; i < len(w); i += 2 {
		if err := write(d, w[i], w[i+1]); err != nil {
			return fmt.Errorf("cgroup %q: %w", id, err)
		}
	}
	return nil
}

func (b *v2) limits(id string) (Limits, error) {
	d := b.dir(id)
	var l Limits
	var errs []error
	num := func(file string) int64 {
		if !exists(d, file) {
			return 0
		}
		n, err := readUint(d, file)
		errs = append(errs, err)
		return int64(n)
	}
	l.MemoryBytes = num("memory.max")
	if s, err := read(d, "cpu.max"); err == nil {
		var q, p int64
		if _, err := fmt.Sscanf(s, "%d %d", &q, &p); err == nil && p > 0 {
			l.CPUMillicores = q * 1000 / p
		}
	}
	l.CPUWeight = num("cpu.weight")
	l.Pids = num("pids.max")
	if len(b.ioFiles) > 0 {
		if s, err := read(d, b.ioFiles[0]); err == nil {
			for _, line := range strings.Split(s, "\n") {
				if v, ok := strings.CutPrefix(line, "default "); ok {
					l.IOWeight, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				}
			}
			if b.ioFiles[0] == "io.bfq.weight" {
				l.IOWeight = ioWeightFromBFQ(l.IOWeight)
			}
		}
	}
	return l, errors.Join(errs...)
}

func (b *v2) stats(id string) (Stats, error) {
	d := b.dir(id)
	var st Stats
	var errs []error
	num := func(file string) uint64 {
		if !exists(d, file) {
			return 0
		}
		n, err := readUint(d, file)
		errs = append(errs, err)
		return n
	}
	keyed := func(file string) map[string]uint64 {
		if !exists(d, file) {
			return nil
		}
		kv, err := readKeyed(d, file)
		errs = append(errs, err)
		return kv
	}
	st.MemoryCurrent = num("memory.current")
	st.MemoryPeak = num("memory.peak")
	st.MemoryLimit = num("memory.max")
	ev := keyed("memory.events")
	st.MemoryLimitHits, st.OOMKills = ev["max"], ev["oom_kill"]
	cpu := keyed("cpu.stat")
	st.CPUUsage = time.Duration(cpu["usage_usec"]) * time.Microsecond
	st.CPUThrottled = cpu["nr_throttled"]
	st.CPUThrottledFor = time.Duration(cpu["throttled_usec"]) * time.Microsecond
	st.PidsCurrent = num("pids.current")
	st.PidsLimitHits = keyed("pids.events")["max"]
	return st, errors.Join(errs...)
}

func (b *v2) oomKills(id string) (uint64, error) {
	kv, err := readKeyed(b.dir(id), "memory.events")
	if err != nil {
		return 0, fmt.Errorf("cgroup %q: %w", id, err)
	}
	return kv["oom_kill"], nil
}

func (b *v2) procs(id string) ([]int, error) { return readPids(b.dir(id)) }

func (b *v2) add(id string, pid int) error {
	return write(b.dir(id), "cgroup.procs", strconv.Itoa(pid))
}

func (b *v2) kill(id string) error {
	d := b.dir(id)
	if exists(d, "cgroup.kill") { // Linux 5.14+: the kernel kills all, forks included
		err := write(d, "cgroup.kill", "1")
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	pids, err := readPids(d)
	if err != nil {
		return err
	}
	return killAll(pids)
}

// start forks cmd straight into the group with clone3(CLONE_INTO_CGROUP).
func (b *v2) start(id string, cmd *exec.Cmd, via func(func() error) error) error {
	fd, err := unix.Open(b.dir(id), unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cgroup %q: %w", id, err)
	}
	defer unix.Close(fd)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = fd
	if err := via(cmd.Start); err != nil {
		return fmt.Errorf("cgroup %q: start in group (clone3 CLONE_INTO_CGROUP, Linux 5.7+): %w", id, err)
	}
	return nil
}

func (b *v2) watchOOM(ctx context.Context, id string) (<-chan uint64, error) {
	if !b.avail[Memory] {
		return nil, fmt.Errorf("cgroup %q: no memory controller: %w", id, errdefs.ErrFailedPrecondition)
	}
	return watchInotify(ctx, b.dir(id), func() (uint64, error) { return b.oomKills(id) })
}

// setCPU writes cpu.max: a quota over a 100 ms period.
func (b *v2) setCPU(id string, millicores int64) error {
	return write(b.dir(id), "cpu.max", cpuMax(millicores))
}

// cpuMax is cpu.max's value for a quota of millicores.
func cpuMax(millicores int64) string {
	return fmt.Sprintf("%d %d", millicores*cpuPeriodUs/1000, cpuPeriodUs)
}
