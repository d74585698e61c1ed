package qemu

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/forkd-dev/forkd/internal/procfs"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// VMMsUnder implements vmm.Lister.
func (d *Driver) VMMsUnder(dir string) []vmm.LeftoverVMM { return VMMsUnder(dir) }

// VMMsUnder returns the QEMU processes this driver starts (named
// forkd-ID, see start) whose QMP socket, and so whose run dir, lies under
// dir. A process that only names a path under dir in its arguments is not
// one of them.
func VMMsUnder(dir string) []vmm.LeftoverVMM {
	dir = filepath.Clean(dir) + "/"
	var out []vmm.LeftoverVMM
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(data), dir) {
			continue
		}
		args, err := procfs.ParseCmdline(data)
		if err != nil {
			continue
		}
		runDir, ok := vmmRunDir(args)
		if !ok || !strings.HasPrefix(runDir, dir) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err != nil || pid == os.Getpid() {
			continue
		}
		out = append(out, vmm.LeftoverVMM{PID: pid, RunDir: runDir})
	}
	return out
}

// vmmRunDir reads the run dir from a command line start builds: -name
// forkd-ID and -qmp unix:RUNDIR/qmp.sock,…. ok is false for any other
// command line.
func vmmRunDir(args []string) (string, bool) {
	i := slices.Index(args, "-name")
	if i < 0 || i+1 >= len(args) || !strings.HasPrefix(args[i+1], "forkd-") {
		return "", false
	}
	j := slices.Index(args, "-qmp")
	if j < 0 || j+1 >= len(args) || !strings.HasPrefix(args[j+1], "unix:") {
		return "", false
	}
	// The path ends at the first comma that is not doubled (optEscape).
	spec := strings.TrimPrefix(args[j+1], "unix:")
	var path strings.Builder
	for k := 0; k < len(spec); k++ {
		if spec[k] == ',' {
			if k+1 < len(spec) && spec[k+1] == ',' {
				path.WriteByte(',')
				k++
				continue
			}
			break
		}
		path.WriteByte(spec[k])
	}
	if filepath.Base(path.String()) != qmpSocket {
		return "", false
	}
	return filepath.Dir(path.String()), true
}
