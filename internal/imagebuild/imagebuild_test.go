package imagebuild

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// writeTar writes a tarball of name -> content (a name ending in / is a
// directory) and returns its path.
func writeTar(t *testing.T, dir string, entries map[string]string) string {
	t.Helper()
	p := filepath.Join(dir, "rootfs.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	var names []string
	for n := range entries {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		h := &tar.Header{Name: n, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(entries[n]))}
		if strings.HasSuffix(n, "/") {
			h = &tar.Header{Name: n, Mode: 0o755, Typeflag: tar.TypeDir}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, entries[n])
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return p
}

// flatten reads the image's filesystem as a container runtime lays it
// out: name (no trailing slash) -> header and content, later layers over
// earlier ones.
func flatten(t *testing.T, archive, tag string) (map[string]*tar.Header, map[string]string) {
	t.Helper()
	ref, err := name.NewTag(tag)
	if err != nil {
		t.Fatal(err)
	}
	img, err := tarball.ImageFromPath(archive, &ref)
	if err != nil {
		t.Fatalf("reading the archive back as %s: %v", tag, err)
	}
	hdrs, data := map[string]*tar.Header{}, map[string]string{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		n := strings.TrimSuffix(h.Name, "/")
		hdrs[n], data[n] = h, string(b)
	}
	return hdrs, data
}

func TestBuildLayersConfigAndDigest(t *testing.T) {
	dir := t.TempDir()
	rootfs := writeTar(t, dir, map[string]string{"etc/": "", "etc/os-release": "ID=debian\n", "usr/bin/": ""})
	bin := filepath.Join(dir, "forkd")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho forkd\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	created := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	spec := Spec{
		RootFS: rootfs,
		Files: []File{
			{Src: bin, Dst: "/usr/bin/forkd", Mode: 0o755},
			{Src: bin, Dst: "/usr/lib/forkd/forkd-agent"},
		},
		Entrypoint: []string{"forkd"}, Cmd: []string{"serve"}, Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"},
		User: "0", WorkingDir: "/var/lib/forkd", Labels: map[string]string{"org.opencontainers.image.version": "1.2.3"},
		Created: created,
	}
	img, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "forkd.tar")
	if err := WriteArchive(img, out, "ghcr.io/forkd-dev/forkd:1.2.3", "ghcr.io/forkd-dev/forkd:latest"); err != nil {
		t.Fatal(err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".forkd.tar.tmp-*")); len(left) != 0 {
		t.Errorf("staging files left: %v", left)
	}

	hdrs, data := flatten(t, out, "ghcr.io/forkd-dev/forkd:latest")
	if data["etc/os-release"] != "ID=debian\n" {
		t.Errorf("the root filesystem layer: os-release %q", data["etc/os-release"])
	}
	if h := hdrs["usr/bin/forkd"]; h == nil || h.Mode != 0o755 || h.Uid != 0 || !h.ModTime.Equal(created) || data["usr/bin/forkd"] != "#!/bin/sh\necho forkd\n" {
		t.Errorf("usr/bin/forkd: %+v %q; want mode 0755, root's, mtime %v, the file's content", h, data["usr/bin/forkd"], created)
	}
	if h := hdrs["usr/lib/forkd/forkd-agent"]; h == nil || h.Mode != 0o700 {
		t.Errorf("usr/lib/forkd/forkd-agent: %+v; want the source's mode 0700", h)
	}
	if h := hdrs["usr/lib/forkd"]; h == nil || h.Typeflag != tar.TypeDir || h.Mode != 0o755 {
		t.Errorf("usr/lib/forkd: %+v; want a directory 0755 made for the file", h)
	}

	ref, _ := name.NewTag("ghcr.io/forkd-dev/forkd:1.2.3")
	back, err := tarball.ImageFromPath(out, &ref)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := back.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if cf.OS != "linux" || cf.Architecture != "amd64" || !cf.Created.Time.Equal(created) ||
		!slices.Equal(c.Entrypoint, []string{"forkd"}) || !slices.Equal(c.Cmd, []string{"serve"}) || c.User != "0" ||
		c.WorkingDir != "/var/lib/forkd" || c.Labels["org.opencontainers.image.version"] != "1.2.3" || len(cf.RootFS.DiffIDs) != 2 {
		t.Errorf("config %+v", cf)
	}

	// The same inputs, the same digest.
	again, err := Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	d1, _ := back.Digest()
	d2, _ := again.Digest()
	if d1 != d2 {
		t.Errorf("rebuilt from the same inputs: digest %s, then %s", d1, d2)
	}
}

func TestBuildRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	os.WriteFile(bin, []byte("x"), 0o755)
	for _, c := range []struct {
		spec Spec
		want string
	}{
		{Spec{}, "no root filesystem and no files"},
		{Spec{RootFS: dir}, "want a tarball"},
		{Spec{Files: []File{{Src: bin, Dst: "usr/bin/x"}}}, "absolute, clean path"},
		{Spec{Files: []File{{Src: bin, Dst: "/usr/../etc/x"}}}, "absolute, clean path"},
		{Spec{Files: []File{{Src: bin, Dst: "/x"}, {Src: bin, Dst: "/x"}}}, "given twice"},
		{Spec{Files: []File{{Src: bin, Dst: "/a"}, {Src: bin, Dst: "/a/b"}}}, "also a directory"},
		{Spec{Files: []File{{Src: dir, Dst: "/d"}}}, "not a regular file"},
		{Spec{Files: []File{{Src: filepath.Join(dir, "missing"), Dst: "/m"}}}, "no such file"},
	} {
		if _, err := Build(c.spec); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Build(%+v) = %v, want an error saying %q", c.spec, err, c.want)
		}
	}
	img, err := Build(Spec{Files: []File{{Src: bin, Dst: "/bin/x"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tags := range [][]string{nil, {"not a tag!"}} {
		if err := WriteArchive(img, filepath.Join(dir, "out.tar"), tags...); err == nil {
			t.Errorf("WriteArchive with tags %q succeeded", tags)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "out.tar")); !os.IsNotExist(err) {
		t.Errorf("a refused archive left out.tar: %v", err)
	}
}
