package changes

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWriteConvertsOverlayWhiteouts builds an upper directory as
// overlayfs leaves it (a 0/0 character device for a deleted file, the
// opaque xattr on a replaced directory) and checks the OCI whiteouts,
// hard links, symlinks and skipped paths of the stream.
func TestWriteConvertsOverlayWhiteouts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mknod of a whiteout device and trusted.* xattrs")
	}
	up := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(up, "etc"), 0o755))
	must(os.WriteFile(filepath.Join(up, "etc/app.conf"), []byte("x=1\n"), 0o640))
	must(os.Link(filepath.Join(up, "etc/app.conf"), filepath.Join(up, "etc/app.link")))
	must(os.Symlink("app.conf", filepath.Join(up, "etc/current")))
	must(os.WriteFile(filepath.Join(up, "etc/hostname"), []byte("skipped\n"), 0o644))
	must(unix.Mknod(filepath.Join(up, "etc/removed"), unix.S_IFCHR, 0))
	must(os.MkdirAll(filepath.Join(up, "srv/fresh"), 0o755))
	err := unix.Lsetxattr(filepath.Join(up, "srv/fresh"), "trusted.overlay.opaque", []byte("y"), 0)
	if errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EPERM) {
		t.Skipf("trusted xattrs on %s: %v", up, err)
	}
	must(err)
	must(os.WriteFile(filepath.Join(up, "srv/fresh/new"), []byte("new"), 0o644))
	must(unix.Mknod(filepath.Join(up, "srv/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))

	var buf bytes.Buffer
	n, err := Write(&buf, up, func(rel string) bool { return rel == "etc/hostname" })
	must(err)
	if n != int64(len("x=1\n")+len("new")) {
		t.Errorf("content bytes %d", n)
	}
	type ent struct {
		name string
		typ  byte
		link string
		body string
	}
	var got []ent
	tr := tar.NewReader(&buf)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		must(err)
		b, _ := io.ReadAll(tr)
		got = append(got, ent{h.Name, h.Typeflag, h.Linkname, string(b)})
		if _, ok := h.PAXRecords["SCHILY.xattr.trusted.overlay.opaque"]; ok {
			t.Errorf("%s carries overlayfs's own xattr", h.Name)
		}
	}
	want := []ent{
		{"etc/", tar.TypeDir, "", ""},
		{"etc/app.conf", tar.TypeReg, "", "x=1\n"},
		{"etc/app.link", tar.TypeLink, "etc/app.conf", ""},
		{"etc/current", tar.TypeSymlink, "app.conf", ""},
		{"etc/.wh.removed", tar.TypeReg, "", ""},
		{"srv/", tar.TypeDir, "", ""},
		{"srv/fresh/", tar.TypeDir, "", ""},
		{"srv/fresh/.wh..wh..opq", tar.TypeReg, "", ""},
		{"srv/fresh/new", tar.TypeReg, "", "new"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("entries:\n got %q\nwant %q", got, want)
	}
}
