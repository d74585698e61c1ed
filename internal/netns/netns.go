// Package netns gives every sandbox its own network namespace with one tap
// device for its VMM.
//
// A namespace is made exactly as `ip netns add` makes it: a bind mount of
// the namespace at /run/netns/<name>, so operators can `ip netns exec
// forkd-<id> ...` into it. Inside it, lo is up and a persistent tap device
// (default "tap0") carries HostAddr/30; the guest is GuestAddr in every
// namespace and every clone of a template, with the same GuestMAC, which is
// safe because no two guests share a namespace. Sandbox networking is
// IPv4 only, and IPv6 is off in the namespace (see disableIPv6).
//
// # Egress
//
// A namespace as Create makes it has no route out. AddUplink adds one: a
// veth pair whose host side lives in the host namespace (the daemon's own,
// or another bind-mounted one), and a default route through it.
// internal/egress numbers uplinks from a pool and sets the rules that
// decide what the guest reaches; Options.Setup runs anything else inside
// the new namespace after the tap is up.
//
// # Lifecycle
//
// Create makes the namespace and its tap; the namespace lives until Remove,
// and after it as long as a process (a VMM) lives in it. Remove unmounts
// and deletes the bind mount; it is idempotent.
//
// A name is a mount, seen only in the mount namespace that made it and in
// those that share mounts with it. A daemon that runs in a mount namespace
// of its own (a systemd service with ProtectSystem=, PrivateTmp=, ...) and
// is restarted comes back in a new one without its predecessor's names, so
// nothing relies on a name outliving the daemon that made it: the VMM of
// each sandbox lives in the sandbox's namespace, and OpenProcess names the
// namespace again from the VMM process (checked by its start time and the
// namespace's recorded inode). List finds the leftovers of a daemon that
// shared this mount namespace.
package netns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// Addresses used inside every namespace.
const (
	// HostAddr is the tap's address: the host side of the guest's link.
	HostAddr = "172.31.0.1"
	// GuestAddr is the guest's address in every namespace.
	GuestAddr = "172.31.0.2"
	// PrefixLen is the length of the link's prefix (a /30).
	PrefixLen = 30
	// GuestMAC is the guest's MAC in every namespace. It must not change
	// between clones, or restored guests keep a stale neighbour entry.
	GuestMAC = "06:00:ac:1f:00:02"
	// TapMAC is the tap's own MAC in every namespace: the guest's
	// neighbour entry for HostAddr, taken over from the template, stays
	// valid in every clone.
	TapMAC = "06:00:ac:1f:00:01"
	// DefaultTap is the tap device's name when Options.TapName is empty.
	DefaultTap = "tap0"
	// NamePrefix starts every forkd namespace name.
	NamePrefix = "forkd-"
)

// TunFix is what to do when /dev/net/tun cannot be opened; `forkd doctor`
// says the same.
const TunFix = "load the tun module (modprobe tun), or create the device node " +
	"(mkdir -p /dev/net && mknod -m 0666 /dev/net/tun c 10 200); in a container, pass --device /dev/net/tun"

// MountDir is where named namespaces are bind-mounted (as iproute2 does).
// A variable so tests could redirect it; forkd never changes it.
var MountDir = "/run/netns"

// Name returns the namespace name of a sandbox.
func Name(sandboxID string) string { return NamePrefix + sandboxID }

// Options configure Create.
type Options struct {
	// TapName is the tap device inside the namespace (default DefaultTap).
	TapName string
	// TapUID and TapGID, when non-zero, restrict the tap to that owner and
	// group (TUNSETOWNER/TUNSETGROUP), for a VMM that opens the tap after
	// dropping root. QEMU's -runas opens the tap before it drops, so it
	// needs neither.
	TapUID, TapGID int
	// Setup, if set, runs inside the new namespace (on a thread switched
	// into it) after lo and the tap are up: the seam for egress policy.
	// An error makes Create fail and remove the namespace.
	Setup func(ns *NS) error
}

// NS is a named network namespace with a tap device.
type NS struct {
	name string
	tap  string
	ino  uint64 // the namespace's inode (see Inode); 0 if unknown
}

// Create makes the named namespace with lo and a tap carrying HostAddr/30.
// It fails with errdefs.ErrAlreadyExists if the name is taken. ctx bounds
// the call only; the namespace lives until Remove.
func Create(ctx context.Context, name string, opts Options) (*NS, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if opts.TapName == "" {
		opts.TapName = DefaultTap
	}
	if len(opts.TapName) >= 16 {
		return nil, fmt.Errorf("netns %s: tap name %q longer than 15 bytes: %w", name, opts.TapName, errdefs.ErrInvalidArgument)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ns := &NS{name: name, tap: opts.TapName}
	// One thread makes the namespace and sets it up from inside.
	if err := createNamed(name, func() error {
		if err := disableIPv6(); err != nil {
			return err
		}
		if err := createTap(opts.TapName, opts.TapUID, opts.TapGID); err != nil {
			return err
		}
		if err := configureLinks(opts.TapName); err != nil {
			return err
		}
		if opts.Setup != nil {
			if err := opts.Setup(ns); err != nil {
				return fmt.Errorf("setup: %w", err)
			}
		}
		return nil
	}); err != nil {
		return nil, err
	}
	ns.ino, _ = pathInode(ns.Path()) // just made: the stat cannot fail
	return ns, nil
}

// Open returns the existing namespace name, as named in this process's
// mount namespace (for Remove). The tap name is assumed to be DefaultTap
// unless given. A daemon coming back to a sandbox's namespace after a
// restart uses OpenProcess: the name may be gone with the mount namespace
// that made it.
func Open(name string, tapName string) (*NS, error) {
	if err := validName(name); err != nil {
		return nil, err
	}
	if tapName == "" {
		tapName = DefaultTap
	}
	ns := &NS{name: name, tap: tapName}
	ino, err := pathInode(ns.Path())
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("netns %s: %w", name, errdefs.ErrNotFound)
		}
		return nil, fmt.Errorf("netns %s: %w", name, err)
	}
	ns.ino = ino
	return ns, nil
}

// Name is the namespace's name (e.g. "forkd-abc").
func (ns *NS) Name() string { return ns.name }

// Path is the namespace's bind mount, for vmm.Network.NetNSPath and
// setns(2).
func (ns *NS) Path() string { return filepath.Join(MountDir, ns.name) }

// TapName is the tap device inside the namespace.
func (ns *NS) TapName() string { return ns.tap }

// Do runs fn on a goroutine whose OS thread is switched into the
// namespace, e.g. to listen on HostAddr in a test. Sockets fn creates stay
// in the namespace; goroutines fn starts do not run in it.
func (ns *NS) Do(fn func() error) error { return DoPath(ns.Path(), fn) }

// Remove deletes the namespace's bind mount. Removing a namespace that
// does not exist (any more) succeeds.
//
// Its devices (the tap, the uplink's inner end) go when the namespace's
// last holder does: the kernel then unregisters the devices of every
// dying namespace in one batch, behind one RCU grace period. Deleting the
// tap here first cost a grace period of its own (33 ms a sandbox on a
// loaded 2-core host), held under the host-wide RTNL lock.
func (ns *NS) Remove() error {
	path := ns.Path()
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	if err := unmountNamed(path); err != nil {
		errs = append(errs, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("netns %s: remove: %w", ns.name, err)
	}
	return nil
}

// List returns the names of the namespaces under MountDir that start with
// prefix, e.g. NamePrefix to find leftovers of a crashed daemon.
func List(prefix string) ([]string, error) {
	entries, err := os.ReadDir(MountDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

func validName(name string) error {
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\x00") || len(name) > 200 {
		return fmt.Errorf("netns name %q: %w", name, errdefs.ErrInvalidArgument)
	}
	return nil
}

// HostIPNet is the tap's address with its prefix.
func HostIPNet() *net.IPNet {
	return &net.IPNet{IP: net.ParseIP(HostAddr).To4(), Mask: net.CIDRMask(PrefixLen, 32)}
}
