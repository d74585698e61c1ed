package vmlinux

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// anELF is a real x86-64 executable: this test binary (Go links static
// executables as ET_EXEC).
func anELF(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	if err := checkELF(b); err != nil {
		t.Skipf("this test binary is not an x86-64 executable: %v", err)
	}
	return b
}

// bzImage wraps payload in a boot header as the kernel's build does:
// setup_sects 4 (the 0 meaning), protocol 2.15, payload after the setup.
func bzImage(payload []byte) []byte {
	const setup = 5 * 512
	b := make([]byte, setup+64+len(payload))
	copy(b[0x202:], "HdrS")
	binary.LittleEndian.PutUint16(b[0x206:], 0x20f)
	binary.LittleEndian.PutUint32(b[0x248:], 64)
	binary.LittleEndian.PutUint32(b[0x24c:], uint32(len(payload)))
	copy(b[setup+64:], payload)
	return b
}

// lz4LegacyOf compresses as `lz4 -l` and the kernel's size_append do.
func lz4LegacyOf(t *testing.T, data []byte) []byte {
	t.Helper()
	out := append([]byte(nil), magicLZ4Legacy...)
	buf := make([]byte, lz4.CompressBlockBound(lz4LegacyBlock))
	for rest := data; len(rest) > 0; {
		chunk := rest[:min(len(rest), lz4LegacyBlock)]
		rest = rest[len(chunk):]
		n, err := lz4.CompressBlock(chunk, buf, nil)
		if err != nil || n == 0 {
			t.Fatalf("compress: %d %v", n, err)
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(n))
		out = append(out, buf[:n]...)
	}
	return binary.LittleEndian.AppendUint32(out, uint32(len(data)))
}

func TestExtractFormats(t *testing.T) {
	kernel := anELF(t)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(kernel)
	zw.Close()
	enc, _ := zstd.NewWriter(nil)
	zs := binary.LittleEndian.AppendUint32(enc.EncodeAll(kernel, nil), uint32(len(kernel)))
	for name, payload := range map[string][]byte{
		"lz4 legacy": lz4LegacyOf(t, kernel),
		"gzip":       append(gz.Bytes(), 1, 2, 3, 4), // the kernel's appended size
		"zstd":       zs,
	} {
		got, err := Extract(bzImage(payload))
		if err != nil || !bytes.Equal(got, kernel) {
			t.Errorf("%s: %d bytes, %v; want the %d-byte ELF back", name, len(got), err, len(kernel))
		}
	}
}

func TestExtractRefusesBadInput(t *testing.T) {
	kernel := anELF(t)
	good := lz4LegacyOf(t, kernel)
	truncatedSize := bzImage(good)
	binary.LittleEndian.PutUint32(truncatedSize[0x24c:], uint32(len(good)+1<<20))
	wrongSize := bzImage(append(good[:len(good)-4:len(good)-4], 1, 0, 0, 0))
	notELF := bzImage(lz4LegacyOf(t, bytes.Repeat([]byte("not a kernel "), 1000)))
	for name, c := range map[string]struct {
		in   []byte
		says string
	}{
		"short":               {[]byte("MZ"), "no HdrS"},
		"payload past end":    {truncatedSize, "payload"},
		"unknown compression": {bzImage([]byte{0xfd, '7', 'z', 'X', 'Z', 0, 1, 2}), "unsupported format"},
		"lz4 size mismatch":   {wrongSize, "the image says 1"},
		"corrupt lz4 block":   {bzImage(append(append([]byte(nil), good[:12]...), bytes.Repeat([]byte{0xff}, 64)...)), "lz4"},
		"not an ELF":          {notELF, "not an ELF"},
	} {
		_, err := Extract(c.in)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want invalid argument saying %q", name, err, c.says)
		}
	}
}

// Ensure extracts once, beside the kernel, and passes an ELF through.
func TestEnsure(t *testing.T) {
	kernel := anELF(t)
	dir := t.TempDir()
	vmlinuz := filepath.Join(dir, "vmlinuz")
	os.WriteFile(vmlinuz, bzImage(lz4LegacyOf(t, kernel)), 0o444)
	out, err := Ensure(vmlinuz)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, kernel) || filepath.Dir(out) != dir {
		t.Fatalf("Ensure wrote %s (%d bytes), want the ELF beside the kernel", out, len(got))
	}
	st1, _ := os.Stat(out)
	if again, err := Ensure(vmlinuz); err != nil || again != out {
		t.Fatalf("second Ensure: %s %v", again, err)
	}
	if st2, _ := os.Stat(out); !st2.ModTime().Equal(st1.ModTime()) {
		t.Error("the second Ensure extracted again")
	}
	if same, err := Ensure(out); err != nil || same != out {
		t.Errorf("Ensure of an ELF: %s %v, want it unchanged", same, err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*")); len(left) != 0 {
		t.Errorf("staging files left: %v", left)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// A payload that decompresses past MaxELF is refused, and the size the
// payload claims never sizes an allocation past it.
func TestDecompressBounded(t *testing.T) {
	defer func(l int) { elfLimit = l }(elfLimit)
	elfLimit = 4 << 20
	if _, err := readBounded(zeros{}, 0); err == nil || !strings.Contains(err.Error(), "past 4 MiB") {
		t.Fatalf("an endless payload: %v", err)
	}
	claim := func(n uint32) []byte {
		b := make([]byte, 16)
		binary.LittleEndian.PutUint32(b[12:], n)
		return b
	}
	if got := sizeHint(claim(4<<20 + 1)); got != 0 {
		t.Errorf("a claimed size past the limit gave a hint of %d", got)
	}
	if got := sizeHint(claim(3 << 20)); got != 3<<20 {
		t.Errorf("hint %d, want 3 MiB", got)
	}
}
