package image

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStaleStagingRemoved: staging directories of dead processes are
// cleaned up by the next build; live ones are left alone.
func TestStaleStagingRemoved(t *testing.T) {
	parent := t.TempDir()
	dead := filepath.Join(parent, stagingPrefix+"2147483646-abc") // no such pid
	live := filepath.Join(parent, stagingPrefix+"1-abc")          // init is alive
	for _, d := range []string{dead, live} {
		if err := os.MkdirAll(filepath.Join(d, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	s, err := newStaging(parent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Error("stale staging dir of a dead process was kept")
	}
	if _, err := os.Stat(live); err != nil {
		t.Error("staging dir of a live process was removed")
	}
	if !strings.HasPrefix(filepath.Base(s), stagingPrefix) {
		t.Errorf("staging dir %s", s)
	}
}

func TestCopySparse(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, _ := os.Create(src)
	f.WriteAt([]byte("head"), 0)
	f.WriteAt([]byte("tail"), 64<<20)
	f.Close()
	dst := filepath.Join(dir, "dst")
	if err := copySparse(src, dst); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Fatal("copy differs")
	}
	if alloc := allocated(dst); alloc > 1<<20 {
		t.Errorf("copy of a 64 MiB sparse file allocates %d bytes", alloc)
	}
}
