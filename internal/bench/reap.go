package bench

// What a bench run owns, and the reaping of what runs that are gone left
// behind.
//
// A bench run owns RUN_DIR/bench-NAME-PID (its VMMs' run files),
// network namespaces named fkbPID-… and DATA_DIR/.bench-*-PID (its state
// store, bench api's audit log, bench image-from's work dir). The pid in
// every name is what lets a later run tell a dead run's leftovers from a
// live concurrent run's.

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/forkd-dev/forkd/internal/egress"
	"github.com/forkd-dev/forkd/internal/netns"
	"github.com/forkd-dev/forkd/internal/procfs"
	"github.com/forkd-dev/forkd/internal/vmm/qemu"
)

var (
	// runDirRe matches a bench run dir in RUN_DIR: bench-PID (older runs
	// of bench spawn) or bench-NAME-PID.
	runDirRe = regexp.MustCompile(`^bench-(?:[a-z]+-)?([0-9]+)$`)
	// netNSRe matches a bench run's namespaces.
	netNSRe = regexp.MustCompile(`^fkb([0-9]+)-`)
	// oldNetNSRe matches namespaces of bench runs from before the pid was
	// in the name.
	oldNetNSRe = regexp.MustCompile(`^fk[ab]-`)
	// tableRe matches a bench engine's host table (egress.Host).
	tableRe = regexp.MustCompile(`^forkd-fkb([0-9]+)$`)
	// dataDirRe matches a bench run's dirs in DATA_DIR.
	dataDirRe = regexp.MustCompile(`^\.bench-[a-z-]+-([0-9]+)$`)
)

// netNSPrefix starts the namespace names of process pid's engine.
func netNSPrefix(pid int) string { return fmt.Sprintf("fkb%d-", pid) }

// runDirOf is the run dir of process pid's run of bench name.
func runDirOf(runDir, name string, pid int) string {
	return filepath.Join(runDir, fmt.Sprintf("bench-%s-%d", name, pid))
}

// dataDirOf is a dir of process pid's run in the data dir; what is one
// of state, api-audit, image-from.
func dataDirOf(dataDir, what string, pid int) string {
	return filepath.Join(dataDir, fmt.Sprintf(".bench-%s-%d", what, pid))
}

// alive reports whether pid is a running forkd bench (or this process).
// A pid that now belongs to another program counts as dead.
func alive(pid int) bool {
	if pid == os.Getpid() {
		return true
	}
	argv, err := procfs.ReadCmdline(pid)
	if err != nil {
		return false
	}
	return strings.HasPrefix(filepath.Base(argv[0]), "forkd") && slices.Contains(argv, "bench")
}

// otherRunning reports whether a forkd bench other than this process runs.
func otherRunning() bool {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		if pid, err := strconv.Atoi(filepath.Base(p)); err == nil && pid != os.Getpid() && alive(pid) {
			return true
		}
	}
	return false
}

// killVMMsUnder sends SIGKILL to every VMM process whose run dir lies
// under dir/vms/ (qemu.VMMsUnder: a process that merely names a path
// there, a `tail -f` of a console log, is left alone), and returns how many
// it signalled. QEMU is the driver bench runs; a Firecracker driver will
// list its own VMMs the same way (vmm.Lister).
func killVMMsUnder(dir string) int {
	n := 0
	for _, v := range qemu.VMMsUnder(filepath.Join(dir, "vms")) {
		if syscall.Kill(v.PID, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// reapStale removes what bench runs that are gone left behind: it kills
// their VMMs, then removes their run dirs, network namespaces and data-dir
// files. Runs still alive (another bench at the same time) are left
// alone. say reports each removal.
func reapStale(runDir, dataDir string, say sayFunc) {
	reap(runDir, dataDir, func(pid int) bool { return !alive(pid) }, true, say)
}

// reap removes the VMMs, run dirs, namespaces and data-dir files of the
// bench runs whose pid gone reports as gone; namespaces named without a
// pid (older runs) too when oldStyle is set and no other bench runs.
func reap(runDir, dataDir string, gone func(pid int) bool, oldStyle bool, say sayFunc) {
	goneName := func(re *regexp.Regexp, name string) bool {
		m := re.FindStringSubmatch(name)
		if m == nil {
			return false
		}
		pid, _ := strconv.Atoi(m[1])
		return gone(pid)
	}
	entries, _ := os.ReadDir(runDir)
	for _, ent := range entries {
		if !ent.IsDir() || !goneName(runDirRe, ent.Name()) {
			continue
		}
		dir := filepath.Join(runDir, ent.Name())
		killed := killVMMsUnder(dir)
		if err := os.RemoveAll(dir); err != nil {
			say("could not remove %s, left by a bench run that is gone: %v", dir, err)
			continue
		}
		say("removed %s and killed its %d VMM(s), left by a bench run that is gone", dir, killed)
	}
	names, _ := netns.List("fk")
	others := -1 // unknown until an old-style name needs it
	for _, n := range names {
		if netNSRe.MatchString(n) {
			if !goneName(netNSRe, n) {
				continue
			}
		} else if oldStyle && oldNetNSRe.MatchString(n) {
			// No pid in the name: only safe when no other bench runs.
			if others < 0 {
				others = 0
				if otherRunning() {
					others = 1
				}
			}
			if others == 1 {
				continue
			}
		} else {
			continue
		}
		ns, err := netns.Open(n, netns.DefaultTap)
		if err == nil {
			err = ns.Remove()
		}
		if err != nil {
			say("could not remove network namespace %s, left by a bench run that is gone: %v", n, err)
			continue
		}
		say("removed network namespace %s, left by a bench run that is gone", n)
	}
	// Host tables in this namespace (a run given --network-host-netns left
	// its table there, with the namespace it was given).
	tables, _ := egress.HostTables("")
	for _, name := range tables {
		if !goneName(tableRe, name) {
			continue
		}
		if err := egress.RemoveHostTable("", name); err == nil {
			say("removed nftables table %s, left by a bench run that is gone", name)
		}
	}
	entries, _ = os.ReadDir(dataDir)
	for _, ent := range entries {
		if !goneName(dataDirRe, ent.Name()) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dataDir, ent.Name())); err == nil {
			say("removed %s, left by a bench run that is gone", filepath.Join(dataDir, ent.Name()))
		}
	}
}
