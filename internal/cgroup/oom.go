package cgroup

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// watchEventfd (v1) registers an eventfd for memory.oom_control through
// cgroup.event_control; the kernel signals it when the group goes out of
// memory and when the group is removed.
func watchEventfd(ctx context.Context, dir string, count func() (uint64, error)) (<-chan uint64, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("cgroup: eventfd: %w", err)
	}
	ev := os.NewFile(uintptr(efd), "oom-eventfd") // non-blocking: the poller serves Read, Close ends it
	oc, err := os.Open(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		ev.Close()
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	// The kernel keeps what it needs once registered; both fds of the
	// line are resolved during the write.
	err = write(dir, "cgroup.event_control", fmt.Sprintf("%d %d", efd, oc.Fd()))
	oc.Close()
	if err != nil {
		ev.Close()
		return nil, err
	}
	return watch(ctx, ev, 8, count, nil), nil
}

// watchInotify (v2) watches memory.events, which the kernel marks
// modified whenever one of its counters changes.
func watchInotify(ctx context.Context, dir string, count func() (uint64, error)) (<-chan uint64, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("cgroup: inotify: %w", err)
	}
	in := os.NewFile(uintptr(fd), "oom-inotify")
	if _, err := unix.InotifyAddWatch(fd, filepath.Join(dir, "memory.events"), unix.IN_MODIFY); err != nil {
		in.Close()
		return nil, fmt.Errorf("cgroup: watch %s: %w", filepath.Join(dir, "memory.events"), err)
	}
	gone := func(b []byte) bool { // IN_IGNORED: the watch went with the file
		for len(b) >= unix.SizeofInotifyEvent {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&b[0]))
			if ev.Mask&unix.IN_IGNORED != 0 {
				return true
			}
			b = b[unix.SizeofInotifyEvent+int(ev.Len):]
		}
		return false
	}
	return watch(ctx, in, 4096, count, gone), nil
}

// watch reads wake-ups from f and sends count's value whenever it rose.
// A wake-up can precede the kill being counted (v1 signals when the group
// goes out of memory), so a wake-up that finds no rise re-reads the count
// for up to a second.
func watch(ctx context.Context, f *os.File, size int, count func() (uint64, error), gone func([]byte) bool) <-chan uint64 {
	ch := make(chan uint64, 1)
	last, _ := count()
	stop := context.AfterFunc(ctx, func() { f.Close() })
	go func() {
		defer close(ch)
		defer stop()
		defer f.Close()
		buf := make([]byte, size)
		for {
			n, err := f.Read(buf)
			if err != nil {
				return
			}
			for try := 0; try < 100; try++ {
				c, err := count()
				if err != nil {
					return // the group is gone
				}
				if c > last {
					last = c
					select {
					case ch <- c:
					case <-ctx.Done():
						return
					}
					break
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
			if gone != nil && gone(buf[:n]) {
				return
			}
		}
	}()
	return ch
}
