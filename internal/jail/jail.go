// Package jail confines a VMM process, as Firecracker's jailer does: its
// own mount namespace whose root (pivot_root) is a small tmpfs holding only
// what that VMM needs, its own PID, IPC and UTS namespaces, a fresh /proc
// that shows only itself, rlimits, a reduced capability bounding set and
// no_new_privs, all set before the VMM's first instruction.
//
// The daemon cannot run code between fork and exec in Go, so the jail is
// set up by a helper: the daemon's own executable, started under the name
// Arg0 (Wrap) with the spec in its environment. The helper is born in the
// new namespaces (clone flags), builds the root, confines itself and
// execs the VMM, which keeps the helper's PID (so the daemon's handle,
// start time and pidfd stay valid). Every program that wraps commands
// must call Main first thing in main (and TestMain).
//
// Paths inside the jail are the host's: a file is bound at the path it
// has outside, so the VMM's command line is unchanged. Everything not
// bound is absent: other sandboxes' run directories, snapshots and memory
// files, the host's /tmp, /dev/shm, /home and /etc.
package jail

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
)

// Arg0 is the helper's argv[0], by which Main recognises it.
const Arg0 = "forkd-jail"

// specEnv carries the Spec (JSON) to the helper; the VMM does not see it.
const specEnv = "FORKD_JAIL_SPEC"

// Spec says what one jailed process may see and do.
type Spec struct {
	// Root is an empty host directory the jail's root tmpfs is mounted on
	// inside the jail's own mount namespace: the host never sees that
	// mount, so one directory serves every jail.
	Root string `json:"root"`
	// Binds are host paths (files or directories) made visible at the
	// same path, read-only unless Writable.
	Binds []Bind `json:"binds"`
	// Devices are device nodes made visible (e.g. /dev/kvm, /dev/net/tun).
	Devices []string `json:"devices"`
	// OwnedDevices are character devices made anew inside the jail with
	// an owner of their own (mode 0600), for a device the jailed user may
	// open there and nowhere else: /dev/userfaultfd for one VMM's uid,
	// while the host's node stays root's.
	OwnedDevices []OwnedDevice `json:"owned_devices,omitempty"`
	// Dir is the working directory inside the jail.
	Dir string `json:"dir"`
	// RLimits are set before the exec.
	RLimits []RLimit `json:"rlimits"`
	// KeepCaps are the capabilities left in the bounding set; every other
	// one is dropped, for the process and whatever it execs.
	KeepCaps []int `json:"keep_caps"`
	// Hostname is the UTS namespace's host name.
	Hostname string `json:"hostname"`
	// TmpBytes sizes the jail's private /tmp (a tmpfs; 0: none).
	TmpBytes int64 `json:"tmp_bytes"`
	// Cgroups are the directories of the cgroups (one per v1 hierarchy,
	// or the v2 one) the process joins first, before any other step: the
	// VMM never runs outside them.
	Cgroups []string `json:"cgroups,omitempty"`
}

// Bind is one host path visible in the jail.
type Bind struct {
	Path     string `json:"path"`
	Writable bool   `json:"writable,omitempty"`
	// Exec allows executing files under it (the VMM's binary and
	// libraries); data is mounted noexec.
	Exec bool `json:"exec,omitempty"`
}

// OwnedDevice is a character device node made inside the jail at Path,
// with the host node's device number, owned by UID and GID.
type OwnedDevice struct {
	Path string `json:"path"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
}

// RLimit is one resource limit (unix.RLIMIT_*).
type RLimit struct {
	Resource int    `json:"resource"`
	Cur      uint64 `json:"cur"`
	Max      uint64 `json:"max"`
}

// Namespaces are the clone flags of a jailed process.
const Namespaces = syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS

// Wrap turns cmd (not started) into the same command run in a jail:
// helper (the daemon's executable, os.Executable) is started as Arg0 in
// new namespaces and execs cmd.Path with cmd.Args once confined. cmd's
// SysProcAttr, files, directory and environment are kept; Dir must be
// bound (it is the working directory inside too).
func Wrap(cmd *exec.Cmd, spec Spec, helper string) error {
	if spec.Root == "" || !filepath.IsAbs(spec.Root) {
		return fmt.Errorf("jail: root %q is not an absolute path", spec.Root)
	}
	if cmd.Dir != "" {
		spec.Dir = cmd.Dir
	}
	b, err := json.Marshal(struct {
		Spec
		Path string   `json:"path"`
		Args []string `json:"args"`
	}{spec, cmd.Path, cmd.Args})
	if err != nil {
		return err
	}
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	cmd.Env = append(slices.DeleteFunc(slices.Clone(env), func(e string) bool { return strings.HasPrefix(e, specEnv+"=") }),
		specEnv+"="+string(b))
	cmd.Path = helper
	cmd.Args = []string{Arg0}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Cloneflags |= Namespaces
	return nil
}

// mainCalled records that this program calls Main (MainCalled).
var mainCalled atomic.Bool

// MainCalled says whether this program has called Main, so that it can
// serve as its own jail helper: one that does not would, started as the
// helper, run as itself (a test binary: all its tests).
func MainCalled() bool { return mainCalled.Load() }

// Main runs the helper when this process is one (argv[0] is Arg0 and a
// spec is in the environment): it sets the jail up and execs the VMM, and
// never returns; on failure it says why on stderr (the VMM's log) and
// exits with status 126. In any other process it returns at once.
func Main() {
	if len(os.Args) == 0 || os.Args[0] != Arg0 {
		mainCalled.Store(true)
		return
	}
	raw, ok := os.LookupEnv(specEnv)
	if !ok {
		mainCalled.Store(true)
		return
	}
	err := run(raw)
	fmt.Fprintf(os.Stderr, "forkd-jail: %v\n", err)
	os.Exit(126)
}
