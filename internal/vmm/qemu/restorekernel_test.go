package qemu

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func fakeBzImage(t *testing.T, setupSects byte, size int) string {
	t.Helper()
	img := make([]byte, size)
	for i := range img {
		img[i] = byte(i)
	}
	img[0x1f1] = setupSects
	copy(img[0x202:], "HdrS")
	p := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(p, img, 0o444); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRestoreKernelKeepsHeaderOnly(t *testing.T) {
	kernel := fakeBzImage(t, 27, 1<<20)
	dir := t.TempDir()
	stub, err := restoreKernel(dir, kernel)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(stub)
	orig, _ := os.ReadFile(kernel)
	setup := (27 + 1) * 512
	if len(data) != setup+restoreKernelTail {
		t.Fatalf("stub is %d bytes, want %d", len(data), setup+restoreKernelTail)
	}
	if !bytes.Equal(data[:0x1f4], orig[:0x1f4]) || !bytes.Equal(data[0x1f8:setup], orig[0x1f8:setup]) {
		t.Fatal("setup code changed beyond syssize")
	}
	if got := binary.LittleEndian.Uint32(data[0x1f4:]); got != restoreKernelTail/16 {
		t.Fatalf("syssize %d", got)
	}
	again, err := restoreKernel(dir, kernel)
	if err != nil || again != stub {
		t.Fatalf("second call %q %v, want cached %q", again, err, stub)
	}
}

func TestRestoreKernelRejectsNonBzImage(t *testing.T) {
	p := filepath.Join(t.TempDir(), "not-a-kernel")
	os.WriteFile(p, make([]byte, 4096), 0o444)
	if _, err := restoreKernel(t.TempDir(), p); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("got %v", err)
	}
}
