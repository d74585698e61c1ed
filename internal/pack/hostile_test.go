package pack

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// TestHostileArchives feeds Unpack damaged and malicious archives: each
// must fail with a clear error and leave nothing in the data directory.
func TestHostileArchives(t *testing.T) {
	src, _ := makeDataDir(t, "base", 16*mib)
	archive, _ := packBytes(t, src, "base", PackOptions{})
	valid := decode(t, archive)
	// valid: manifest, then initrd.img, rootfs.ext4, vmlinuz, memory, vmstate.
	const memIdx = 4
	memPath := valid[memIdx].hdr.Name
	if !strings.HasSuffix(memPath, "/memory") || len(valid) != 6 {
		t.Fatalf("unexpected archive layout: %v", names(valid))
	}
	withEntry := func(i int, fn func(e *entry)) []byte {
		es := append([]entry(nil), valid...)
		fn(&es[i])
		return encode(t, es)
	}
	replaceMem := func(e entry) []byte {
		return withEntry(memIdx, func(m *entry) { *m = e })
	}
	editMem := func(fn func(f *File, m *Manifest)) []byte {
		return encode(t, editManifest(t, valid, func(m *Manifest) {
			for i := range m.Files {
				if m.Files[i].Path == memPath {
					fn(&m.Files[i], m)
				}
			}
		}))
	}
	setMemSize := func(size int64) func(f *File, m *Manifest) {
		return func(f *File, m *Manifest) {
			f.Size = size
			fe := m.Snapshots[0].Manifest.Files["memory"]
			fe.Size = size
			m.Snapshots[0].Manifest.Files["memory"] = fe
		}
	}
	passwd, _ := os.ReadFile("/etc/passwd")

	// A tar-level sparse file (GNU PAX 1.0) whose real size is 1 TiB.
	sparseBomb := func() []byte {
		recs := paxRecord("GNU.sparse.major", "1") + paxRecord("GNU.sparse.minor", "0") +
			paxRecord("GNU.sparse.name", memPath) + paxRecord("GNU.sparse.realsize", fmt.Sprint(int64(1)<<40))
		var raw []byte
		raw = append(raw, tarHeaderBlock("PaxHeaders/memory", tar.TypeXHeader, int64(len(recs)))...)
		raw = append(raw, pad512([]byte(recs))...)
		body := pad512([]byte("1\n0\n4096\n"))
		body = append(body, bytes.Repeat([]byte{7}, 4096)...)
		raw = append(raw, tarHeaderBlock("memory", tar.TypeReg, int64(len(body)))...)
		raw = append(raw, pad512(body)...)
		return replaceMem(entry{raw: raw})
	}()

	garbageAfter := func() []byte {
		enc, _ := zstd.NewWriter(nil)
		defer enc.Close()
		return append(encode(t, valid), enc.EncodeAll([]byte("this is not padding"), nil)...)
	}()

	cases := []struct {
		name    string
		archive []byte
		opts    UnpackOptions
		want    string // in the error
		class   error
	}{
		{"empty", nil, UnpackOptions{}, "empty archive", errdefs.ErrInvalidArgument},
		{"not zstd", []byte("hello, this is not an archive at all"), UnpackOptions{}, "not a zstd stream", errdefs.ErrInvalidArgument},
		{"truncated in the manifest", archive[:100], UnpackOptions{}, "truncated", errdefs.ErrInvalidArgument},
		{"truncated in a file", archive[:len(archive)/2], UnpackOptions{}, "", errdefs.ErrInvalidArgument},
		{"truncated at the end", archive[:len(archive)-1], UnpackOptions{}, "", errdefs.ErrInvalidArgument},
		{"truncated before the last entry", encode(t, valid[:5]), UnpackOptions{}, "ends before", errdefs.ErrInvalidArgument},
		{"wrong hash (data)", withEntry(memIdx, func(e *entry) { e.data = bytes.Clone(e.data); e.data[100] ^= 1 }), UnpackOptions{}, "sha256", errdefs.ErrInvalidArgument},
		{"wrong hash (manifest)", editMem(func(f *File, m *Manifest) {
			f.SHA256 = strings.Repeat("0", 64)
			fe := m.Snapshots[0].Manifest.Files["memory"]
			fe.SHA256 = f.SHA256
			m.Snapshots[0].Manifest.Files["memory"] = fe
		}), UnpackOptions{}, "sha256", errdefs.ErrInvalidArgument},
		{"manifest disagrees with snapshot manifest", editMem(func(f *File, _ *Manifest) { f.SHA256 = strings.Repeat("0", 64) }), UnpackOptions{}, "its manifest", errdefs.ErrInvalidArgument},
		{"../ entry", withEntry(memIdx, func(e *entry) { e.hdr.Name = "../x" }), UnpackOptions{}, `"../x" where`, errdefs.ErrInvalidArgument},
		{"../ in the manifest", encode(t, editManifest(t, valid, func(m *Manifest) {
			sm := &m.Snapshots[0].Manifest
			sm.Files["../../x"] = sm.Files["memory"]
			delete(sm.Files, "memory")
			for i := range m.Files {
				if m.Files[i].Path == memPath {
					m.Files[i].Path = strings.TrimSuffix(memPath, "memory") + "../../x"
				}
			}
		})), UnpackOptions{}, "../../x", errdefs.ErrInvalidArgument},
		{"absolute entry", withEntry(memIdx, func(e *entry) { e.hdr.Name = "/tmp/forkd-pwned" }), UnpackOptions{}, "/tmp/forkd-pwned", errdefs.ErrInvalidArgument},
		{"symlink to /etc/passwd", replaceMem(entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: memPath, Linkname: "/etc/passwd"}}), UnpackOptions{}, "symbolic link", errdefs.ErrInvalidArgument},
		{"hard link to /etc/passwd", replaceMem(entry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: memPath, Linkname: "/etc/passwd"}}), UnpackOptions{}, "hard link", errdefs.ErrInvalidArgument},
		{"device node", replaceMem(entry{hdr: tar.Header{Typeflag: tar.TypeChar, Name: memPath, Devmajor: 1, Devminor: 3, Mode: 0o666}}), UnpackOptions{}, "device node", errdefs.ErrInvalidArgument},
		{"directory", replaceMem(entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: memPath, Mode: 0o755}}), UnpackOptions{}, "directory", errdefs.ErrInvalidArgument},
		{"manifest claims a 1 TiB file", editMem(setMemSize(1 << 40)), UnpackOptions{}, "size limit", errdefs.ErrInvalidArgument},
		{"tar sparse file of 1 TiB", sparseBomb, UnpackOptions{}, "sparse", errdefs.ErrInvalidArgument},
		{"unlisted entry at the end", encode(t, append(append([]entry(nil), valid...), entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "snapshots/x/extra", Mode: 0o600}, data: []byte("x")})), UnpackOptions{}, "unlisted entry", errdefs.ErrInvalidArgument},
		{"unlisted entry in the middle", encode(t, append(append(append([]entry(nil), valid[:memIdx]...), entry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "extra", Mode: 0o600}, data: []byte("x")}), valid[memIdx:]...)), UnpackOptions{}, `"extra" where`, errdefs.ErrInvalidArgument},
		{"data after the tar stream", garbageAfter, UnpackOptions{}, "after the end", errdefs.ErrInvalidArgument},
		{"manifest not first", encode(t, append([]entry{valid[memIdx]}, valid...)), UnpackOptions{}, "not a forkd archive", errdefs.ErrInvalidArgument},
		{"huge manifest", compress(append(tarHeaderBlock(ManifestName, tar.TypeReg, 1<<30), make([]byte, 512)...)), UnpackOptions{}, "at most", errdefs.ErrInvalidArgument},
		{"newer format", encode(t, editManifest(t, valid, func(m *Manifest) { m.FormatVersion = FormatVersion + 1 })), UnpackOptions{}, fmt.Sprintf("format version %d", FormatVersion+1), errdefs.ErrInvalidArgument},
		{"copy from a later file", editMem(func(f *File, m *Manifest) { f.Copies = []Copy{{0, pageSize, int64(len(m.Files) - 1), 0}} }), UnpackOptions{}, "not listed before it", errdefs.ErrInvalidArgument},
		{"copy from outside its source", editMem(func(f *File, _ *Manifest) { f.Copies = []Copy{{0, pageSize, 0, 1 << 40}} }), UnpackOptions{}, "outside its source", errdefs.ErrInvalidArgument},
		{"copy from ahead in its own file", editMem(func(f *File, m *Manifest) { f.Copies = []Copy{{0, pageSize, memIdx - 1, pageSize}} }), UnpackOptions{}, "outside its source", errdefs.ErrInvalidArgument},
		{"overlapping extents", editMem(func(f *File, _ *Manifest) { f.Extents = append([]Extent{{0, 2 * pageSize}}, f.Extents...) }), UnpackOptions{}, "overlapping", errdefs.ErrInvalidArgument},
		{"extent past the end", editMem(func(f *File, _ *Manifest) { f.Extents = []Extent{{f.Size - 1, 1 << 62}} }), UnpackOptions{}, "past the size", errdefs.ErrInvalidArgument},
		{"invalid tag", encode(t, editManifest(t, valid, func(m *Manifest) { m.Snapshots[0].Manifest.Tag = "../../etc" })), UnpackOptions{}, `has tag "../../etc"`, errdefs.ErrInvalidArgument},
		{"image path outside its image", encode(t, editManifest(t, valid, func(m *Manifest) { m.Snapshots[0].Manifest.Image.Kernel = "/etc/passwd" })), UnpackOptions{}, "not inside its image", errdefs.ErrInvalidArgument},
		{"QEMU option in the guest MAC", encode(t, editManifest(t, valid, func(m *Manifest) {
			m.Snapshots[0].Manifest.Network.GuestMAC = "06:00:ac:1f:00:02,romfile=/etc/shadow"
		})), UnpackOptions{}, "guest MAC", errdefs.ErrInvalidArgument},
		{"space in a kernel argument", encode(t, editManifest(t, valid, func(m *Manifest) {
			m.Snapshots[0].Manifest.Image.KernelArgs = []string{"init=/bin/sh rw"}
		})), UnpackOptions{}, "kernel argument", errdefs.ErrInvalidArgument},
		{"image digest mismatch", encode(t, editManifest(t, valid, func(m *Manifest) {
			m.Images[0].Manifest = []byte(strings.Replace(string(m.Images[0].Manifest), m.Images[0].Digest, strings.Repeat("a", 64), 1))
		})), UnpackOptions{}, "names digest", errdefs.ErrInvalidArgument},
		{"too many files", archive, UnpackOptions{MaxFiles: 2}, "over the limit", errdefs.ErrInvalidArgument},
		{"over the size limit", archive, UnpackOptions{MaxLogicalBytes: mib}, "size limit", errdefs.ErrInvalidArgument},
		{"two snapshots in a version 1 archive", encode(t, editManifest(t, valid, func(m *Manifest) {
			base := m.Snapshots[0]
			base.ID = "parent"
			base.Manifest.Files = map[string]snapshot.FileEntry{"vmstate": base.Manifest.Files["vmstate"]}
			m.Snapshots[0].Parent = "parent"
			m.Snapshots = append([]Snapshot{base}, m.Snapshots...)
			for _, f := range m.Files {
				if strings.HasSuffix(f.Path, "/vmstate") {
					f.Path = "snapshots/parent/vmstate"
					f.Copies = nil
					m.Files = append(m.Files, f)
				}
			}
		})), UnpackOptions{}, "holds one snapshot", errdefs.ErrInvalidArgument},
		{"a layer without its parent", encode(t, editManifest(t, valid, func(m *Manifest) {
			m.Snapshots[0].Manifest.Parent = &snapshot.ParentRef{Tag: "gone", Digest: "sha256:" + strings.Repeat("0", 64)}
			m.Snapshots[0].Manifest.Depth = 1
		})), UnpackOptions{}, `is a layer on "gone", which the archive does not hold`, errdefs.ErrInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst := t.TempDir()
			_, _, err := Unpack(context.Background(), dst, bytes.NewReader(c.archive), c.opts)
			if err == nil {
				t.Fatal("unpacked")
			}
			if !strings.Contains(err.Error(), c.want) || (c.class != nil && errdefs.Code(err) != errdefs.Code(c.class)) {
				t.Errorf("error %q (class %s), want one containing %q of class %s", err, errdefs.Code(err), c.want, errdefs.Code(c.class))
			}
			t.Log(err)
			assertClean(t, dst, nil, nil)
			if du := diskUsage(t, dst); du > mib {
				t.Errorf("%d bytes left in the data dir", du)
			}
		})
	}
	if after, _ := os.ReadFile("/etc/passwd"); !bytes.Equal(after, passwd) {
		t.Error("/etc/passwd changed")
	}
	if _, err := os.Lstat("/tmp/forkd-pwned"); err == nil {
		t.Error("/tmp/forkd-pwned exists")
	}
}

// TestHostileArchiveKeepsExistingData: a bad archive does not disturb
// the tag or image it collides with, even with force.
func TestHostileArchiveKeepsExistingData(t *testing.T) {
	src, _ := makeDataDir(t, "base", 16*mib)
	archive, _ := packBytes(t, src, "base", PackOptions{})
	dst := t.TempDir()
	snap, _, err := Unpack(context.Background(), dst, bytes.NewReader(archive), UnpackOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bad := withData(t, archive, 4, func(d []byte) { d[10] ^= 1 })
	for _, force := range []bool{false, true} {
		_, _, err := Unpack(context.Background(), dst, bytes.NewReader(bad), UnpackOptions{Force: force})
		if err == nil {
			t.Fatal("unpacked a corrupt archive")
		}
		assertClean(t, dst, []string{"base"}, []string{snap.Image.Digest})
		if got := mustGet(t, dst, "base"); got.ID != snap.ID || got.Verify() != nil {
			t.Errorf("force=%v: the existing snapshot changed", force)
		}
	}
	// A corrupt image file is caught even though the image is here
	// already and only verified.
	bad = withData(t, archive, 2, func(d []byte) { d[10] ^= 1 })
	if _, _, err := Unpack(context.Background(), dst, bytes.NewReader(bad), UnpackOptions{Tag: "other"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("corrupt image file of a reused image: %v", err)
	}
	assertClean(t, dst, []string{"base"}, []string{snap.Image.Digest})
}

func withData(t *testing.T, archive []byte, i int, fn func([]byte)) []byte {
	es := decode(t, archive)
	es[i].data = bytes.Clone(es[i].data)
	fn(es[i].data)
	return encode(t, es)
}

func compress(b []byte) []byte {
	enc, _ := zstd.NewWriter(nil)
	defer enc.Close()
	return enc.EncodeAll(b, nil)
}

func names(es []entry) []string {
	var out []string
	for _, e := range es {
		out = append(out, e.hdr.Name)
	}
	return out
}

func diskUsage(t *testing.T, dir string) int64 {
	var n int64
	filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil {
			n += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	return n
}
