package identity

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkd-dev/forkd/internal/agentapi"
)

// MinEntropy is the least entropy a Hello must carry.
const MinEntropy = 32

// Validate checks an identity before anything is applied, so a bad one
// changes nothing.
func Validate(id agentapi.Identity) error {
	if len(id.Entropy) < MinEntropy {
		return fmt.Errorf("identity carries %d bytes of entropy, want at least %d", len(id.Entropy), MinEntropy)
	}
	if len(id.Hostname) > 64 { // HOST_NAME_MAX
		return fmt.Errorf("hostname %q is longer than 64 bytes", id.Hostname)
	}
	return nil
}

// ApplySystem sets the clock (if UnixNano > 0), reseeds the kernel RNG and
// sets the hostname (if not empty).
func ApplySystem(id agentapi.Identity) error {
	if id.UnixNano > 0 {
		if err := SetClock(time.Unix(0, id.UnixNano)); err != nil {
			return err
		}
	}
	if err := AddEntropy(id.Entropy); err != nil {
		return err
	}
	if id.Hostname != "" {
		if err := SetHostname(id.Hostname); err != nil {
			return err
		}
	}
	return nil
}

// SetClock sets CLOCK_REALTIME.
func SetClock(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("setting the clock: %w", err)
	}
	return nil
}

// AddEntropy mixes b into the kernel's input pool, crediting it in full
// (the host's entropy is trusted: it comes from the host's kernel), then
// forces the CRNG to reseed from the pool now, rather than at its next
// scheduled reseed, so reads right after this see the new state.
func AddEntropy(b []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("opening /dev/urandom: %w", err)
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(b))
	binary.NativeEndian.PutUint32(info[0:4], uint32(len(b)*8)) // bits credited
	binary.NativeEndian.PutUint32(info[4:8], uint32(len(b)))
	copy(info[8:], b)
	if err := ioctlPtr(f, unix.RNDADDENTROPY, unsafe.Pointer(&info[0])); err != nil {
		return fmt.Errorf("RNDADDENTROPY: %w", err)
	}
	if err := ioctlPtr(f, unix.RNDRESEEDCRNG, nil); err != nil {
		return fmt.Errorf("RNDRESEEDCRNG: %w", err)
	}
	return nil
}

func ioctlPtr(f *os.File, req uint, arg unsafe.Pointer) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var errno error
	if err := rc.Control(func(fd uintptr) {
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, fd, uintptr(req), uintptr(arg)); e != 0 {
			errno = e
		}
	}); err != nil {
		return err
	}
	return errno
}

// SetHostname sets the kernel hostname.
func SetHostname(name string) error {
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("setting hostname %q: %w", name, err)
	}
	return nil
}

// PythonSeed derives the seed for user-space generators from the Hello's
// entropy. It is a hash, not the raw bytes: the kernel's input and what user
// code can read back from random's state stay unrelated.
func PythonSeed(entropy []byte) []byte {
	h := sha256.New()
	h.Write([]byte("forkd python seed\x00"))
	h.Write(entropy)
	return h.Sum(nil)
}

// Hostname returns the kernel hostname.
func Hostname() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Nodename[:])
}

// KernelRelease returns the running kernel's release ("6.1.0-28-cloud-amd64").
func KernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// Uptime is the time since boot, including time suspended.
func Uptime() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
