package netns

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// createTap makes a persistent tap device in the calling thread's network
// namespace (the namespace /dev/net/tun is opened in owns the device).
func createTap(name string, uid, gid int) error {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENXIO) {
			// No device node, or no driver behind it: a host
			// precondition, with the fix forkd doctor gives.
			return fmt.Errorf("open /dev/net/tun: %w; %s: %w", err, TunFix, errdefs.ErrFailedPrecondition)
		}
		return fmt.Errorf("open /dev/net/tun: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	// The flags match what QEMU asks for when it attaches (tap, no packet
	// information, virtio-net header), single queue.
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fmt.Errorf("create tap %s: %w", name, err)
	}
	if uid != 0 {
		if err := unix.IoctlSetInt(fd, unix.TUNSETOWNER, uid); err != nil {
			return fmt.Errorf("tap %s owner: %w", name, err)
		}
	}
	if gid != 0 {
		if err := unix.IoctlSetInt(fd, unix.TUNSETGROUP, gid); err != nil {
			return fmt.Errorf("tap %s group: %w", name, err)
		}
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
		return fmt.Errorf("tap %s persist: %w", name, err)
	}
	return nil
}

// configureLinks brings lo up and gives the tap its MAC and HostAddr/30, in
// the calling thread's namespace, over one netlink socket.
func configureLinks(tap string) error {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	link, err := h.LinkByName(tap)
	if err != nil {
		return fmt.Errorf("%s: %w", tap, err)
	}
	mac, _ := net.ParseMAC(TapMAC)
	if err := h.LinkSetHardwareAddr(link, mac); err != nil {
		return fmt.Errorf("%s mac: %w", tap, err)
	}
	if err := h.AddrAdd(link, &netlink.Addr{IPNet: HostIPNet()}); err != nil {
		return fmt.Errorf("%s address: %w", tap, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("%s up: %w", tap, err)
	}
	return nil
}
