package main

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/apisock"
	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/image"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// hostChecks are the prerequisites outside the VMM driver: privileges, the
// image builder's tools and kernel, cgroups and disk. The driver adds its
// own (VMM binary, /dev/kvm, tun, userfaultfd).
func hostChecks(ctx context.Context, g *globals) []apiv1.Check {
	var out []apiv1.Check
	add := func(name string, ok bool, detail, fix string) {
		c := apiv1.Check{Name: name, OK: ok, Detail: detail}
		if !ok {
			c.Fix = fix
		}
		out = append(out, c)
	}
	add("root", os.Geteuid() == 0, fmt.Sprintf("running as uid %d", os.Geteuid()),
		"run forkd as root (sudo): it creates network namespaces and tap devices")
	// Every command the image builder runs, from its own table, so a tool
	// it gains is checked here too.
	for _, t := range image.Tools() {
		p, err := image.LookTool(t.Name)
		add("tool "+t.Name, err == nil, orElse(p, "not found")+": "+t.Why, "apt-get install -y "+t.Package)
	}
	p, err := image.LookTool("ip") // /usr/sbin is searched too, as for mkfs.ext4
	add("tool ip", err == nil, orElse(p, "not found")+": lets operators inspect sandbox namespaces (ip netns)", "apt-get install -y iproute2")
	lists, _ := filepath.Glob("/var/lib/apt/lists/*_Packages*")
	add("apt package lists", len(lists) > 0, fmt.Sprintf("%d package lists", len(lists)), "apt-get update")
	out = append(out, kernelCheck(ctx, g.dataDir))
	agent, err := agentBinary()
	add("forkd-agent", err == nil, orElse(agent, fmt.Sprint(err)), "make build (puts bin/forkd-agent next to bin/forkd), or set FORKD_AGENT")
	out = append(out, cgroupCheck(), socketCheck(g))
	out = append(out, networkChecks(g)...)
	if c, ok := memoryDirCheck(g); ok {
		out = append(out, c)
	}
	var st unix.Statfs_t
	dir := existingDir(g.dataDir)
	if unix.Statfs(dir, &st) == nil {
		free := int64(st.Bavail) * st.Bsize
		add("disk space", free > 4<<30, fmt.Sprintf("%s free under %s", human(free), dir),
			"free space or point --data-dir/FORKD_DATA_DIR at a larger disk: images and snapshots need a few GiB")
	}
	return out
}

// memoryDirCheck reports the file system of --memory-dir (when one is
// set, or --live-branch picks one): live branches need tmpfs or hugetlbfs,
// and on hugetlbfs every image and sandbox takes huge pages from the
// host's pool, which must not be empty.
func memoryDirCheck(g *globals) (apiv1.Check, bool) {
	dir := g.memoryDir
	if dir == "" {
		if !g.liveBranch {
			return apiv1.Check{}, false
		}
		dir = "/dev/shm"
	}
	c := apiv1.Check{Name: "memory dir"}
	dir = existingDir(dir)
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		c.Detail, c.Fix = err.Error(), "create the --memory-dir on tmpfs or hugetlbfs"
		return c, true
	}
	switch st.Type {
	case unix.TMPFS_MAGIC:
		c.OK, c.Detail = true, dir+" on tmpfs: live branches pause longer as guest memory grows (hugetlbfs does not)"
	case unix.HUGETLBFS_MAGIC:
		total, free := hugePages()
		c.OK = free > 0
		c.Detail = fmt.Sprintf("%s on hugetlbfs (%d KiB pages): %d of %d huge pages free; each image and each running or pooled sandbox takes its guest memory from them", dir, st.Bsize>>10, free, total)
		c.Fix = "raise /proc/sys/vm/nr_hugepages (e.g. sysctl vm.nr_hugepages=2048 for 4 GiB of 2 MiB pages)"
	default:
		c.OK = !g.liveBranch // serve --live-branch refuses such a dir
		c.Detail = fmt.Sprintf("%s is on neither tmpfs nor hugetlbfs (file system magic %#x): live branches are refused", dir, st.Type)
		c.Fix = "point --memory-dir at a tmpfs (/dev/shm) or a hugetlbfs mount"
	}
	return c, true
}

// existingDir is dir, or its nearest ancestor that exists: the file system
// a directory not yet created will be made on.
func existingDir(dir string) string {
	for dir != "/" {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		dir = filepath.Dir(dir)
	}
	return dir
}

// hugePages reads HugePages_Total and HugePages_Free (less the pages
// already reserved) from /proc/meminfo.
func hugePages() (total, free int) {
	data, _ := os.ReadFile("/proc/meminfo")
	var rsvd int
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, _ := strconv.Atoi(strings.TrimSpace(v))
		switch k {
		case "HugePages_Total":
			total = n
		case "HugePages_Free":
			free = n
		case "HugePages_Rsvd":
			rsvd = n
		}
	}
	return total, free - rsvd
}

// kernelCheck: every image boots Debian's cloud kernel, taken from the data
// dir's cache or, on the first build, downloaded with the host's apt.
func kernelCheck(ctx context.Context, dataDir string) apiv1.Check {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c := apiv1.Check{Name: "guest kernel"}
	detail, err := image.GuestKernel(ctx, dataDir)
	if err != nil {
		c.Detail = err.Error()
		c.Fix = "apt-get update with Debian's main archive in the apt sources (the image builder downloads the cloud kernel package, linux-image-cloud-*, through the host's apt)"
		return c
	}
	c.OK, c.Detail = true, detail
	return c
}

func orElse(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// cgroupControllers are the controllers forkd's per-sandbox limits use
// (memory, CPU share, process count).
var cgroupControllers = []string{"memory", "cpu", "pids"}

// cgroupLayout is what /proc/self/mountinfo says about the host's cgroups.
type cgroupLayout struct {
	v2Mount string            // where the cgroup2 hierarchy is mounted; "" if nowhere
	v2      []string          // controllers the v2 root offers (its cgroup.controllers)
	v1      map[string]string // v1 controller -> its mount point
}

// v1Controllers are the controllers a v1 cgroup mount can carry; its other
// options (rw, name=systemd, clone_children...) are not controllers.
var v1Controllers = map[string]bool{
	"blkio": true, "cpu": true, "cpuacct": true, "cpuset": true, "devices": true, "freezer": true,
	"hugetlb": true, "memory": true, "misc": true, "net_cls": true, "net_prio": true,
	"perf_event": true, "pids": true, "rdma": true,
}

// parseCgroupMounts reads the cgroup mounts out of a mountinfo file. A
// cgroup2 mount at /sys/fs/cgroup wins over one elsewhere (a hybrid host
// mounts it at /sys/fs/cgroup/unified).
func parseCgroupMounts(mountinfo string) cgroupLayout {
	l := cgroupLayout{v1: map[string]string{}}
	for _, line := range strings.Split(mountinfo, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 {
			continue
		}
		mnt := f[4]
		switch g[0] {
		case "cgroup2":
			if l.v2Mount == "" || mnt == "/sys/fs/cgroup" {
				l.v2Mount = mnt
			}
		case "cgroup":
			for _, opt := range strings.Split(g[2], ",") {
				if v1Controllers[opt] {
					l.v1[opt] = mnt
				}
			}
		}
	}
	return l
}

// describe says which layout the host has and what forkd can use of it;
// ok is false only when no cgroup hierarchy is mounted at all.
func (l cgroupLayout) describe() (ok bool, detail string) {
	var mode string
	switch {
	case l.v2Mount != "" && len(l.v1) == 0:
		mode = "cgroup v2 (unified) at " + l.v2Mount
	case l.v2Mount != "":
		mode = fmt.Sprintf("hybrid: cgroup v1 controllers, cgroup v2 at %s (controllers: %s)", l.v2Mount, orElse(strings.Join(l.v2, " "), "none"))
	case len(l.v1) > 0:
		mode = "cgroup v1 (legacy)"
	default:
		return false, "no cgroup hierarchy mounted (neither cgroup2 nor cgroup v1 controllers in /proc/self/mountinfo)"
	}
	var usable, missing []string
	for _, c := range cgroupControllers {
		switch {
		case slices.Contains(l.v2, c):
			usable = append(usable, c+" (v2)")
		case l.v1[c] != "":
			usable = append(usable, c+" (v1 at "+l.v1[c]+")")
		default:
			missing = append(missing, c)
		}
	}
	detail = mode + "; forkd can use " + orElse(strings.Join(usable, ", "), "no controller")
	if len(missing) > 0 {
		detail += "; missing: " + strings.Join(missing, ", ") + " (per-sandbox limits on them unavailable)"
	}
	return true, detail
}

// cgroupCheck detects the host's cgroup layout (v2 unified, v1, or hybrid).
func cgroupCheck() apiv1.Check {
	c := apiv1.Check{Name: "cgroups"}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		c.Detail = err.Error()
		c.Fix = "mount /proc"
		return c
	}
	l := parseCgroupMounts(string(data))
	if l.v2Mount != "" {
		if b, err := os.ReadFile(filepath.Join(l.v2Mount, "cgroup.controllers")); err == nil {
			l.v2 = strings.Fields(string(b))
		}
	}
	c.OK, c.Detail = l.describe()
	if !c.OK {
		c.Fix = "mount the cgroup2 hierarchy: mount -t cgroup2 cgroup2 /sys/fs/cgroup (systemd does at boot; a container needs the host's /sys/fs/cgroup)"
	}
	return c
}

// doctorChecks runs the host's checks and the VMM driver's.
func doctorChecks(ctx context.Context, g *globals) []apiv1.Check {
	checks := hostChecks(ctx, g)
	ctor, err := vmm.Lookup(g.vmmName)
	if err != nil {
		return append(checks, apiv1.Check{Name: "vmm driver", Detail: err.Error(), Fix: "use --vmm " + strings.Join(vmm.List(), " or ")})
	}
	for _, c := range ctor.Checks(ctx, vmm.Options{Accel: vmm.Accel(g.accel)}) {
		checks = append(checks, apiv1.Check{Name: c.Name, OK: c.OK, Detail: c.Detail, Fix: c.Fix})
	}
	return checks
}

func doctorCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check this host for what forkd needs and say how to fix what is missing",
		Long: "Check this host for what forkd needs and say how to fix what is missing.\n" +
			"Exits 1 when a check fails, with --json too (the checks are printed either way).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			checks := doctorChecks(cmd.Context(), g)
			failed := 0
			for _, c := range checks {
				if !c.OK {
					failed++
				}
			}
			if g.jsonOut {
				if err := printJSON(checks); err != nil {
					return err
				}
			} else {
				for _, c := range checks {
					mark := "ok  "
					if !c.OK {
						mark = "FAIL"
					}
					fmt.Printf("%s %-22s %s\n", mark, c.Name, c.Detail)
					if !c.OK && c.Fix != "" {
						fmt.Printf("     %-22s fix: %s\n", "", c.Fix)
					}
				}
				if failed > 0 {
					fmt.Printf("\n%d check(s) failed\n", failed)
				} else {
					fmt.Println("\nall checks passed")
				}
			}
			if failed > 0 {
				return exitError{1}
			}
			return nil
		},
	}
	addDriverFlags(cmd.Flags(), g, "to check")
	return cmd
}

// socketCheck says who may use the API socket: as the running daemon made
// it when it exists, else as a daemon started now would (its default
// group, or FORKD_SOCKET_GROUP). Root only is not a failure: users then
// need sudo.
func socketCheck(g *globals) apiv1.Check {
	c := apiv1.Check{Name: "socket access", OK: true}
	var st unix.Stat_t
	if err := unix.Stat(g.socketPath(), &st); err == nil {
		mode := st.Mode & 0o777
		who := "root only: users need sudo"
		if why := apisock.Resolve(envOr("FORKD_SOCKET_GROUP", apisock.DefaultGroup)).RootOnly; why != "" {
			who += "; " + why
		}
		if mode&0o060 == 0o060 {
			name := strconv.Itoa(int(st.Gid))
			if grp, err := user.LookupGroupId(name); err == nil {
				name = grp.Name
			}
			who = "group " + name + " may use the API without sudo (membership is root-equivalent on this host)"
		}
		c.Detail = fmt.Sprintf("%s: mode %04o, gid %d: %s", g.socketPath(), mode, st.Gid, who)
		return c
	}
	c.Detail = "no daemon socket yet; a daemon started now allows " + apisock.Resolve(envOr("FORKD_SOCKET_GROUP", apisock.DefaultGroup)).String()
	return c
}
