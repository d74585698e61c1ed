package cgroup

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// write writes val into a control file in one write(2). It never creates
// the file: a missing one is an error, as on cgroupfs.
func write(dir, file, val string) error {
	p := filepath.Join(dir, file)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return fmt.Errorf("cgroup: write %q to %s: %w", val, p, err)
	}
	_, err = f.WriteString(val)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("cgroup: write %q to %s: %w", val, p, err)
	}
	return nil
}

func read(dir, file string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, file))
	return strings.TrimSpace(string(b)), err
}

// readUint reads a one-number file; "max" (v2) and v1's "unlimited"
// values read as 0.
func readUint(dir, file string) (uint64, error) {
	s, err := read(dir, file)
	if err != nil {
		return 0, err
	}
	if s == "max" || s == "-1" {
		return 0, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroup: %s: %w", filepath.Join(dir, file), err)
	}
	if n >= 1<<62 { // v1's "no limit" is PAGE_COUNTER_MAX pages
		return 0, nil
	}
	return n, nil
}

// readKeyed reads a "key value" per line file (memory.events, cpu.stat,
// memory.oom_control). Values that are not numbers are skipped.
func readKeyed(dir, file string) (map[string]uint64, error) {
	s, err := read(dir, file)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if n, err := strconv.ParseUint(f[1], 10, 64); err == nil {
			out[f[0]] = n
		}
	}
	return out, nil
}

// readPids reads a cgroup.procs file; a missing group is empty.
func readPids(dir string) ([]int, error) {
	s, err := read(dir, "cgroup.procs")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	var pids []int
	for _, f := range strings.Fields(s) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids, nil
}

func unionPids(dirs []string) ([]int, error) {
	var all []int
	for _, d := range dirs {
		p, err := readPids(d)
		if err != nil {
			return nil, err
		}
		all = append(all, p...)
	}
	slices.Sort(all)
	return slices.Compact(all), nil
}

func exists(dir, file string) bool {
	_, err := os.Stat(filepath.Join(dir, file))
	return err == nil
}

// mkdirAll makes dir and its missing parents with mkdir.
func mkdirAll(mkdir func(string) error, dir string) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("cgroup: %s is not a directory", dir)
		}
		return nil
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAll(mkdir, parent); err != nil {
			return err
		}
	}
	if err := mkdir(dir); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("cgroup: create %s: %w", dir, err)
	}
	return nil
}

// subdirs lists the directories in dir.
func subdirs(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// killAll sends SIGKILL to each pid; ones already gone are fine.
func killAll(pids []int) error {
	var errs []error
	for _, p := range pids {
		if err := unix.Kill(p, syscall.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("cgroup: kill %d: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// hostHasSwap says whether /proc/swaps lists a swap area.
func hostHasSwap() bool {
	b, err := os.ReadFile("/proc/swaps")
	return err == nil && len(strings.Split(strings.TrimSpace(string(b)), "\n")) > 1
}
