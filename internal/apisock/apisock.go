// Package apisock creates the daemon's API Unix socket with the access the
// operator chose: owner root, group G and mode 0660 when the group G
// exists (its members use the CLI and SDKs without sudo), else mode 0600,
// root only.
//
// Membership of G is root-equivalent on the host: the API starts VMMs,
// writes files the daemon reads and runs code in sandboxes whose images
// anyone in G may build. It is the same trade as the docker group.
//
// The socket never appears under its name with looser access than asked:
// it is bound under a temporary name in the same directory, given its
// owner and mode, then renamed into place. The run directory that holds it
// (when the socket is in it) is made root:G 0750 so members can reach the
// socket and nobody else can list it; without the group it is left as it
// is (0700 when forkd created it).
package apisock

import (
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
)

// DefaultGroup is the group whose members may use the API socket.
const DefaultGroup = "forkd"

// Modes of the socket and of its run directory.
const (
	GroupMode   os.FileMode = 0o660
	RootMode    os.FileMode = 0o600
	GroupDirMod os.FileMode = 0o750
)

// Access is who may connect to the socket.
type Access struct {
	Group string      // the group asked for ("" for root only)
	GID   int         // its gid; -1 when the socket is root only
	Mode  os.FileMode // of the socket
	// RootOnly, when set, says why the socket is root only although a
	// group was asked for (it does not exist, or cannot be read).
	RootOnly string
}

// Resolve finds group and returns the access it gives: group-readable when
// it exists, root only (with the reason) when it does not.
func Resolve(group string) Access {
	a := Access{Group: group, GID: -1, Mode: RootMode}
	if group == "" {
		a.RootOnly = "no socket group is configured (socket_group = \"\")"
		return a
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		var unknown user.UnknownGroupError
		if errors.As(err, &unknown) {
			a.RootOnly = fmt.Sprintf("group %q does not exist (create it with `groupadd --system %s`, or install the forkd package, then restart the daemon)", group, group)
		} else {
			a.RootOnly = fmt.Sprintf("group %q: %v", group, err)
		}
		return a
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		a.RootOnly = fmt.Sprintf("group %q has gid %q, not a number", group, g.Gid)
		return a
	}
	a.GID, a.Mode = gid, GroupMode
	return a
}

// String says who may connect, for the log and `forkd doctor`.
func (a Access) String() string {
	if a.GID < 0 {
		return fmt.Sprintf("root only (mode %04o): %s", a.Mode, a.RootOnly)
	}
	return fmt.Sprintf("root and members of group %s (gid %d, mode %04o); membership is root-equivalent on this host", a.Group, a.GID, a.Mode)
}

// Listen binds the API socket at sock with access a. When sock is directly
// in runDir, runDir is given to a's group first (root:G 0750). The
// listener does not unlink sock when closed; the caller removes it.
func Listen(sock, runDir string, a Access) (*net.UnixListener, error) {
	if a.GID >= 0 && filepath.Clean(filepath.Dir(sock)) == filepath.Clean(runDir) {
		if err := os.Chown(runDir, 0, a.GID); err != nil {
			return nil, fmt.Errorf("give run dir %s to group %s: %w", runDir, a.Group, err)
		}
		if err := os.Chmod(runDir, GroupDirMod); err != nil {
			return nil, fmt.Errorf("run dir %s: %w", runDir, err)
		}
	}
	tmp := filepath.Join(filepath.Dir(sock), "."+filepath.Base(sock)+"."+rand.Text()[:8])
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	ln.SetUnlinkOnClose(false)
	fail := func(err error) (*net.UnixListener, error) {
		ln.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("listen on %s: %w", sock, err)
	}
	if a.GID >= 0 {
		if err := os.Chown(tmp, 0, a.GID); err != nil {
			return fail(err)
		}
	}
	if err := os.Chmod(tmp, a.Mode); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp, sock); err != nil {
		return fail(err)
	}
	return ln, nil
}
