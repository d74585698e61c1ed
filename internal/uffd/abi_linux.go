package uffd

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The userfaultfd ABI (linux/userfaultfd.h) that golang.org/x/sys does not
// carry, as far as the server uses it (creating and registering one is the
// VMM's: package uffdtest does it for tests). The ioctl numbers are the
// generic _IOR/_IOWR encodings, the same on amd64 and arm64.
const (
	ioctlWake     = 0x8010AA02 // _IOR(0xAA, 0x02, struct uffdio_range)
	ioctlCopy     = 0xC028AA03 // _IOWR(0xAA, 0x03, struct uffdio_copy)
	ioctlZeropage = 0xC020AA04 // _IOWR(0xAA, 0x04, struct uffdio_zeropage)

	eventPagefault = 0x12
	eventFork      = 0x13
	eventRemap     = 0x14
	eventRemove    = 0x15
	eventUnmap     = 0x16

	// msgSize is sizeof(struct uffd_msg).
	msgSize = 32
)

type uffdioRange struct {
	Start uint64
	Len   uint64
}

type uffdioCopy struct {
	Dst  uint64
	Src  uint64
	Len  uint64
	Mode uint64
	Copy int64
}

type uffdioZeropage struct {
	Range    uffdioRange
	Mode     uint64
	Zeropage int64
}

// msg is a decoded struct uffd_msg: the event and, for a page fault, the
// address; for remove and unmap, the range [start, end).
type msg struct {
	event      uint8
	addr       uint64 // pagefault.address, remove/unmap start
	end        uint64 // remove/unmap end
	faultFlags uint64
}

func decodeMsg(b []byte) msg {
	m := msg{event: b[0]}
	arg := b[8:]
	switch m.event {
	case eventPagefault:
		m.faultFlags = le64(arg[0:])
		m.addr = le64(arg[8:])
	case eventRemove, eventUnmap:
		m.addr = le64(arg[0:])
		m.end = le64(arg[8:])
	}
	return m
}

func le64(b []byte) uint64 {
	return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}

// copyPage installs src at dst (UFFDIO_COPY) and wakes the threads
// waiting on it.
func copyPage(fd int, dst uint64, src []byte) error {
	c := uffdioCopy{Dst: dst, Src: uint64(uintptr(unsafe.Pointer(&src[0]))), Len: uint64(len(src))}
	err := ioctl(fd, ioctlCopy, unsafe.Pointer(&c))
	runtime.KeepAlive(src) // Go memory the kernel reads during the call
	return err
}

// copyRange installs src at dst (UFFDIO_COPY, any number of pages) and
// wakes the threads waiting on what it installed. It returns the bytes
// installed: a copy that stops at a page already present installs those
// before it and fails with EAGAIN.
func copyRange(fd int, dst uint64, src []byte) (int64, error) {
	c := uffdioCopy{Dst: dst, Src: uint64(uintptr(unsafe.Pointer(&src[0]))), Len: uint64(len(src))}
	err := ioctl(fd, ioctlCopy, unsafe.Pointer(&c))
	runtime.KeepAlive(src)
	return c.Copy, err
}

// zeroPage installs a page of zeros at dst (UFFDIO_ZEROPAGE) and wakes
// the threads waiting on it.
func zeroPage(fd int, dst, n uint64) error {
	z := uffdioZeropage{Range: uffdioRange{Start: dst, Len: n}}
	return ioctl(fd, ioctlZeropage, unsafe.Pointer(&z))
}

// wake wakes the threads waiting on [start, start+n) (UFFDIO_WAKE): for a
// fault whose page another copy put in place first (EEXIST).
func wake(fd int, start, n uint64) error {
	r := uffdioRange{Start: start, Len: n}
	return ioctl(fd, ioctlWake, unsafe.Pointer(&r))
}
