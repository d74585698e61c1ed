package uffd

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// maxFDs is how many descriptors one handshake may carry before it is
// refused as truncated; exactly one is expected.
const maxFDs = 8

// receive reads the VMM's one message on conn: the userfaultfd and the
// regions, checked against memory of memSize bytes. On any error every
// descriptor received is closed.
func receive(conn *net.UnixConn, memSize uint64, timeout time.Duration) (int, []Mapping, error) {
	if err := conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return -1, nil, err
	}
	defer conn.SetReadDeadline(time.Time{})
	buf := make([]byte, maxHandshake+1)
	oob := make([]byte, unix.CmsgSpace(4*maxFDs))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	fds, perr := parseRights(oob[:oobn])
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	switch {
	case err != nil:
		closeAll()
		return -1, nil, fmt.Errorf("uffd: receive the VMM's userfaultfd and regions within %v: %w", timeout, err)
	case perr != nil:
		closeAll()
		return -1, nil, invalid("control message: %v", perr)
	case flags&unix.MSG_CTRUNC != 0:
		closeAll()
		return -1, nil, invalid("more than %d descriptors sent; one userfaultfd expected", maxFDs)
	case n == 0 && len(fds) == 0:
		return -1, nil, fmt.Errorf("uffd: the VMM closed the connection before sending its userfaultfd: %w", errdefs.ErrUnavailable)
	case len(fds) != 1:
		closeAll()
		return -1, nil, invalid("%d descriptors sent with the regions; exactly one userfaultfd expected", len(fds))
	}
	if err := checkUserfaultfd(fds[0]); err != nil {
		closeAll()
		return -1, nil, err
	}
	ms, err := ParseMappings(buf[:n], memSize)
	if err != nil {
		closeAll()
		return -1, nil, err
	}
	return fds[0], ms, nil
}

// parseRights returns the descriptors of SCM_RIGHTS messages in oob.
func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			continue
		}
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			return fds, err
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// checkUserfaultfd fails unless fd is a userfaultfd.
func checkUserfaultfd(fd int) error {
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return fmt.Errorf("uffd: inspect the received descriptor: %w", err)
	}
	if link != "anon_inode:[userfaultfd]" {
		return invalid("the descriptor sent is %q, not a userfaultfd", link)
	}
	return nil
}
