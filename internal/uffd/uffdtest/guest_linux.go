// Package uffdtest stands in for the VMM side of Firecracker's Uffd memory
// backend, for tests of the code that serves it: a Guest maps anonymous
// memory, registers it with a userfaultfd of its own, and sends the
// userfaultfd and the region to a page server's socket in one message, as
// Firecracker does at snapshot/load. Reading the Guest's memory then
// faults every page through the page server.
//
// A Guest must not live in the process that runs the page server: a
// goroutine blocked on a missing page holds its thread and its P, and the
// page server's thread may need one to answer. Tests run it in a child
// process (RunChild from TestMain, StartChild) or in a fake VMM's own.
package uffdtest

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The userfaultfd ABI that golang.org/x/sys does not carry (see
// internal/uffd/abi_linux.go).
const (
	uffdAPI             = 0xAA
	ioctlAPI            = 0xC018AA3F
	ioctlRegister       = 0xC020AA00
	devIOCNew           = 0xAA00
	featureEventRemove  = 1 << 3
	featureEventUnmap   = 1 << 6
	registerModeMissing = 1
)

type uffdioAPI struct{ API, Features, Ioctls uint64 }

type uffdioRegister struct{ Start, Len, Mode, Ioctls uint64 }

// Region is how Firecracker describes a guest memory region to a page
// server (GuestRegionUffdMapping).
type Region struct {
	BaseHostVirtAddr uint64 `json:"base_host_virt_addr"`
	Size             uint64 `json:"size"`
	Offset           uint64 `json:"offset"`
	PageSize         uint64 `json:"page_size"`
	PageSizeKiB      uint64 `json:"page_size_kib"` // deprecated, in bytes too
}

// Guest is memory served by a page server.
type Guest struct {
	mem []byte
}

// Attach maps size bytes (a multiple of the page size), registers them
// for missing-page faults and hands them to the page server listening on
// socket, as one region at memory offset 0.
func Attach(socket string, size int) (*Guest, error) {
	ps := os.Getpagesize()
	if size <= 0 || size%ps != 0 {
		return nil, fmt.Errorf("uffdtest: size %d is not a positive multiple of the page size", size)
	}
	fd, err := NewUserfaultfd()
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, err
	}
	addr := uint64(uintptr(unsafe.Pointer(&mem[0])))
	if err := Register(fd, mem); err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	body, _ := json.Marshal([]Region{{BaseHostVirtAddr: addr, Size: uint64(size), PageSize: uint64(ps), PageSizeKiB: uint64(ps)}})
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	defer c.Close()
	if _, _, err := c.WriteMsgUnix(body, unix.UnixRights(fd), nil); err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	return &Guest{mem: mem}, nil
}

// Register registers mem with the userfaultfd fd for missing-page faults.
func Register(fd int, mem []byte) error {
	reg := uffdioRegister{Start: uint64(uintptr(unsafe.Pointer(&mem[0]))), Len: uint64(len(mem)), Mode: registerModeMissing}
	if err := ioctl(fd, ioctlRegister, unsafe.Pointer(&reg)); err != nil {
		return fmt.Errorf("UFFDIO_REGISTER: %w", err)
	}
	return nil
}

// Digest reads every page (each first read is a fault the page server
// answers) and returns the SHA-256 of the memory, in hex.
func (g *Guest) Digest() string {
	sum := sha256.Sum256(g.mem)
	return hex.EncodeToString(sum[:])
}

// Close unmaps the memory.
func (g *Guest) Close() error { return unix.Munmap(g.mem) }

// NewUserfaultfd creates a non-blocking userfaultfd with remove and unmap
// events, as Firecracker does: with userfaultfd(2), or through
// /dev/userfaultfd where the syscall is refused.
func NewUserfaultfd() (int, error) {
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if errno != 0 {
		dev, err := unix.Open("/dev/userfaultfd", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("userfaultfd(2): %v; /dev/userfaultfd: %v", errno, err)
		}
		defer unix.Close(dev)
		fd, _, errno = unix.Syscall(unix.SYS_IOCTL, uintptr(dev), devIOCNew, unix.O_CLOEXEC|unix.O_NONBLOCK)
		if errno != 0 {
			return -1, fmt.Errorf("USERFAULTFD_IOC_NEW: %v", errno)
		}
	}
	api := uffdioAPI{API: uffdAPI, Features: featureEventRemove | featureEventUnmap}
	if err := ioctl(int(fd), ioctlAPI, unsafe.Pointer(&api)); err != nil {
		unix.Close(int(fd))
		return -1, fmt.Errorf("UFFDIO_API: %w", err)
	}
	return int(fd), nil
}

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}
