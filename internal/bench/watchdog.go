package bench

// Why a watchdog process and not the VMMs' parent-death signal (the QEMU
// driver's Config.KillOnParentDeath): QEMU drops to an unprivileged uid
// (-runas) right after it starts, and Linux clears a process's
// parent-death signal when its uids change, so a bench killed with SIGKILL
// would leave every VMM running. The watchdog holds the read end of a pipe
// whose only writer is the bench process; the kernel closes it when the
// bench dies, by any signal.

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// watchdogFD is the descriptor the watchdog reads its owner's pipe from
// (the first of exec.Cmd.ExtraFiles).
const watchdogFD = 3

// startWatchdog starts argv (Config.Watchdog: this program's `bench
// watchdog` for this process) in a session of its own (a signal to the
// terminal's process group does not reach it); it waits until this
// process has exited and then removes what this run owns. The returned
// pipe end must stay open for as long as this process runs; closing it
// ends the watchdog (after it finds nothing left).
func startWatchdog(argv []string) (*os.File, *exec.Cmd, error) {
	if len(argv) == 0 {
		return nil, nil, fmt.Errorf("no watchdog command: %w", errdefs.ErrInvalidArgument)
	}
	r, w, err := os.Pipe() // close-on-exec: no VMM or tool inherits w
	if err != nil {
		return nil, nil, err
	}
	defer r.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.ExtraFiles = []*os.File{r}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, nil, fmt.Errorf("start the bench watchdog: %w", err)
	}
	return w, cmd, nil
}

// Watchdog is the watchdog process of bench run owner (`forkd bench
// watchdog`, started by the run with its pipe on fd 3): it waits until
// the owner has exited, however it exits, then kills its VMMs and removes
// its run dir, namespaces and data-dir files, and only those.
func Watchdog(runDir, dataDir string, owner int) error {
	if owner <= 0 {
		return fmt.Errorf("--owner: the pid of the bench run: %w", errdefs.ErrInvalidArgument)
	}
	// Read returns EOF once the owner's end is closed: when it exits,
	// however it exits. Its signals (SIGINT at a terminal) are not this
	// process's business.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	io.Copy(io.Discard, os.NewFile(watchdogFD, "bench-owner"))
	reap(runDir, dataDir, func(pid int) bool { return pid == owner }, false, func(string, ...any) {})
	return nil
}
