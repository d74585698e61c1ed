package cgroup

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Mode is a host's cgroup layout.
type Mode int

const (
	ModeUnknown Mode = iota
	// ModeV1: the controllers live in legacy per-controller hierarchies.
	ModeV1
	// ModeHybrid: as ModeV1, plus a cgroup2 mount that holds none of
	// forkd's controllers (systemd's /sys/fs/cgroup/unified). Managed as v1.
	ModeHybrid
	// ModeV2: the unified hierarchy.
	ModeV2
)

func (m Mode) String() string {
	switch m {
	case ModeV1:
		return "v1"
	case ModeHybrid:
		return "hybrid"
	case ModeV2:
		return "v2"
	}
	return "unknown"
}

// v1Subsystems are the legacy hierarchies forkd uses: the controllers'
// own, plus cpuacct for CPU usage.
var v1Subsystems = []string{"memory", "cpu", "cpuacct", "pids", "blkio"}

// V1Mount is one legacy hierarchy.
type V1Mount struct {
	// Mountpoint is where the hierarchy is mounted.
	Mountpoint string
	// Root is the mount's root inside the hierarchy (mountinfo field 4),
	// "/" unless a container bind-mounted a sub-tree.
	Root string
	// Self is this process's cgroup in the hierarchy, as in
	// /proc/self/cgroup.
	Self string
}

// Hierarchy says where the cgroup filesystems are and where this process
// sits in them. Detect fills it in; tests and unusual hosts may build one.
type Hierarchy struct {
	Mode Mode
	// Unified is the cgroup2 mount point ("" when none) and UnifiedSelf
	// this process's cgroup in it ("0::" in /proc/self/cgroup).
	Unified     string
	UnifiedSelf string
	// V1 maps a legacy subsystem (memory, cpu, cpuacct, pids, blkio) to
	// its hierarchy; co-mounted subsystems share a Mountpoint.
	V1 map[string]V1Mount
}

// Detect reads /proc/self/mountinfo and /proc/self/cgroup.
func Detect() (*Hierarchy, error) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	cg, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	h, err := parseHierarchy(mi, cg)
	if err != nil {
		return nil, err
	}
	// v1 mounts of some controllers while cgroup2 holds memory: the
	// unified hierarchy is the one in use.
	if h.Mode == ModeHybrid {
		b, err := os.ReadFile(filepath.Join(h.Unified, "cgroup.controllers"))
		if err == nil && slices.Contains(strings.Fields(string(b)), "memory") {
			h.Mode = ModeV2
		}
	}
	return h, nil
}

func parseHierarchy(mountinfo, selfCgroup []byte) (*Hierarchy, error) {
	h := &Hierarchy{V1: map[string]V1Mount{}}
	unifiedRoot := "/"
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		root, mnt := unescape(f[3]), unescape(f[4])
		switch g[0] {
		case "cgroup2":
			// The one at /sys/fs/cgroup wins over others (a hybrid
			// host's at /sys/fs/cgroup/unified, extra mounts).
			if h.Unified == "" || mnt == "/sys/fs/cgroup" {
				h.Unified, unifiedRoot = mnt, root
			}
		case "cgroup":
			for _, opt := range strings.Split(g[2], ",") {
				if isV1Subsystem(opt) {
					if _, dup := h.V1[opt]; !dup {
						h.V1[opt] = V1Mount{Mountpoint: mnt, Root: root}
					}
				}
			}
		}
	}
	sc = bufio.NewScanner(bytes.NewReader(selfCgroup))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			h.UnifiedSelf = inMount(unifiedRoot, parts[2])
			continue
		}
		for _, s := range strings.Split(parts[1], ",") {
			if m, ok := h.V1[s]; ok {
				m.Self = inMount(m.Root, parts[2])
				h.V1[s] = m
			}
		}
	}
	switch {
	case len(h.V1) > 0 && h.Unified != "":
		h.Mode = ModeHybrid
	case len(h.V1) > 0:
		h.Mode = ModeV1
	case h.Unified != "":
		h.Mode = ModeV2
	default:
		return nil, fmt.Errorf("cgroup: no cgroup filesystem is mounted (neither cgroup2 nor a v1 memory/cpu/pids/blkio hierarchy): %w",
			errdefs.ErrFailedPrecondition)
	}
	for s, m := range h.V1 {
		if m.Self == "" {
			m.Self = "/"
			h.V1[s] = m
		}
	}
	if h.Unified != "" && h.UnifiedSelf == "" {
		h.UnifiedSelf = "/"
	}
	return h, nil
}

func isV1Subsystem(s string) bool {
	for _, v := range v1Subsystems {
		if s == v {
			return true
		}
	}
	return false
}

// inMount turns a path of /proc/self/cgroup into one below a mount whose
// root is root (a container's bind-mounted sub-tree).
func inMount(root, p string) string {
	if root != "/" && (p == root || strings.HasPrefix(p, root+"/")) {
		p = strings.TrimPrefix(p, root)
	}
	if p == "" {
		return "/"
	}
	return path.Clean(p)
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// resolve turns the configured parent (absolute inside the hierarchy, or
// relative to this process's cgroup there) into a cgroup path.
func resolve(self, parent string) string {
	if strings.HasPrefix(parent, "/") {
		return path.Clean(parent)
	}
	return path.Join(self, parent)
}

// threadCgroups reads the calling thread's v1 cgroups, keyed by
// subsystem, translated into the hierarchies of h.
func (h *Hierarchy) threadCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, s := range strings.Split(parts[1], ",") {
			if m, ok := h.V1[s]; ok {
				out[s] = filepath.Join(m.Mountpoint, inMount(m.Root, parts[2]))
			}
		}
	}
	return out, nil
}
