package qemu

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
)

// restoreKernelTail is how much of the protected-mode kernel a restore stub
// keeps after the setup sectors: QEMU only needs a well-formed bzImage.
const restoreKernelTail = 4096

// restoreKernel returns a stub of kernel for clones: the bzImage boot header
// and setup code plus a few bytes of the kernel proper.
//
// Why: with -kernel, QEMU reads the whole bzImage into a heap buffer for
// fw_cfg (14 MB for Debian's cloud kernel) and keeps it for the life of the
// process. A clone restored from a snapshot never boots, so the buffer is
// dead weight in every child (~25 % of a minimal clone's PSS). The kernel
// data is not part of the migrated state (fw_cfg migrates only its cursor;
// the option ROM is the same), so the stub restores identically. Stubs are
// cached by the kernel's content digest in dir.
func restoreKernel(dir, kernel string) (string, error) {
	f, err := os.Open(kernel)
	if err != nil {
		return "", fmt.Errorf("kernel %s: %w", kernel, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", err
	}
	// The stub's name is derived from the file's identity and size; the
	// image store never rewrites a kernel in place.
	key := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%d\x00%d", kernel, st.Size(), st.ModTime().UnixNano())))
	stub := filepath.Join(dir, "vmlinuz-restore-"+hex.EncodeToString(key[:8]))
	if _, err := os.Stat(stub); err == nil {
		return stub, nil
	}
	hdr := make([]byte, 0x202+4)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return "", fmt.Errorf("kernel %s: short header: %w", kernel, errdefs.ErrInvalidArgument)
	}
	if string(hdr[0x202:0x206]) != "HdrS" {
		return "", fmt.Errorf("kernel %s is not a bzImage (no HdrS magic): %w", kernel, errdefs.ErrInvalidArgument)
	}
	setupSects := int64(hdr[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	size := (setupSects+1)*512 + restoreKernelTail
	if size > st.Size() {
		return kernel, nil
	}
	buf := make([]byte, size)
	if _, err := f.ReadAt(buf, 0); err != nil {
		return "", fmt.Errorf("kernel %s: %w", kernel, err)
	}
	// syssize (in 16-byte paragraphs) must describe what is there.
	binary.LittleEndian.PutUint32(buf[0x1f4:], uint32(restoreKernelTail/16))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if err := fsutil.WriteFileAtomic(stub, buf, 0o444); err != nil {
		return "", fmt.Errorf("restore kernel stub: %w", err)
	}
	return stub, nil
}
