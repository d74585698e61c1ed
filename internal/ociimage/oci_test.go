package ociimage

import (
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustNotExist(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !os.IsNotExist(err) {
		t.Errorf("%s exists (%v), want it removed", p, err)
	}
}

func TestPullAppliesLayersWithWhiteoutsAndLinks(t *testing.T) {
	reg := newRegistry(t)
	lower := layerOf(t,
		dir("etc"), file("etc/keep", "lower"), file("etc/gone", "x"),
		dir("opq"), file("opq/old", "old"), dir("opq/sub"), file("opq/sub/deep", "d"),
		dir("usr"), dir("usr/lib"), file("usr/lib/libx.so", "lib"), symlink("lib", "usr/lib"),
		dir("data"), file("data/orig", "shared"),
		entry{name: "etc/secret", body: "s", typ: '0', mode: 0o4750, uid: 1000, gid: 1000},
	)
	upper := layerOf(t,
		file("etc/.wh.gone", ""),
		dir("opq"), file("opq/.wh..wh..opq", ""), file("opq/new", "new"),
		file("lib/added", "through a relative symlink"),
		hardlink("data/link", "data/orig"),
		hardlink("hl-of-symlink", "lib"),
		symlink("abs", "/usr/lib"), file("abs/via-abs", "through an absolute symlink"),
	)
	cfg := v1.Config{Env: []string{"PATH=/bin", "GREETING=hi"}, WorkingDir: "/opq", User: "1000:1000",
		Entrypoint: []string{"/bin/sh"}, Cmd: []string{"-c", "true"}}
	ref := reg.push(t, "test/app:v1", imageOf(t, cfg, lower, upper))

	p := testPuller(t)
	img, root, err := pull(t, p, ref)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(img.Digest, "sha256:") || img.IndexDigest != "" || img.Platform != "linux/"+wantPlatform.Architecture {
		t.Errorf("identity: digest %q index %q platform %q", img.Digest, img.IndexDigest, img.Platform)
	}
	if !slices.Equal(img.Config.Env, cfg.Env) || img.Config.WorkingDir != "/opq" || img.Config.User != "1000:1000" ||
		!slices.Equal(img.Config.Entrypoint, cfg.Entrypoint) || !slices.Equal(img.Config.Cmd, cfg.Cmd) {
		t.Errorf("config = %+v", img.Config)
	}
	if got := readFile(t, filepath.Join(root, "etc/keep")); got != "lower" {
		t.Errorf("etc/keep = %q", got)
	}
	mustNotExist(t, filepath.Join(root, "etc/gone"))
	mustNotExist(t, filepath.Join(root, "etc/.wh.gone"))
	mustNotExist(t, filepath.Join(root, "opq/old"))
	mustNotExist(t, filepath.Join(root, "opq/sub"))
	mustNotExist(t, filepath.Join(root, "opq/.wh..wh..opq"))
	if got := readFile(t, filepath.Join(root, "opq/new")); got != "new" {
		t.Errorf("opq/new = %q", got)
	}
	// Writes through symlinks land inside the tree, where the link points
	// in the image.
	if got := readFile(t, filepath.Join(root, "usr/lib/added")); got != "through a relative symlink" {
		t.Errorf("usr/lib/added = %q", got)
	}
	if got := readFile(t, filepath.Join(root, "usr/lib/via-abs")); got != "through an absolute symlink" {
		t.Errorf("usr/lib/via-abs = %q", got)
	}
	if st, err := os.Lstat(filepath.Join(root, "lib")); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Errorf("lib is no longer a symlink: %v", err)
	}
	// A hard link across layers shares the lower layer's inode.
	a, _ := os.Stat(filepath.Join(root, "data/orig"))
	b, err := os.Stat(filepath.Join(root, "data/link"))
	if err != nil || !os.SameFile(a, b) {
		t.Errorf("data/link is not a hard link of data/orig: %v", err)
	}
	if st, err := os.Lstat(filepath.Join(root, "hl-of-symlink")); err != nil || st.Mode()&os.ModeSymlink == 0 {
		t.Errorf("a hard link to a symlink must link the symlink itself: %v", err)
	}
	st, err := os.Stat(filepath.Join(root, "etc/secret"))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode()&os.ModeSetuid == 0 || st.Mode().Perm() != 0o750 {
		t.Errorf("etc/secret mode %v, want setuid 0750", st.Mode())
	}
	if os.Geteuid() == 0 {
		if s := st.Sys().(*syscall.Stat_t); s.Uid != 1000 || s.Gid != 1000 {
			t.Errorf("etc/secret owner %d:%d, want 1000:1000", s.Uid, s.Gid)
		}
	}

	// The layers are cached by digest and a second image sharing the
	// lower layer reuses it.
	for _, d := range img.Layers() {
		h, _ := v1.NewHash(d)
		if !(blobCache{p.CacheDir}).has(h, mustSize(t, p.CacheDir, h)) {
			t.Errorf("layer %s not cached", d)
		}
	}
	reg.tamper[hexOf(t, lower)] = func(w http.ResponseWriter, _ []byte) { w.Write([]byte("must not be fetched again")) }
	ref2 := reg.push(t, "test/other:v1", imageOf(t, v1.Config{}, lower))
	if _, _, err := pull(t, p, ref2); err != nil {
		t.Fatalf("second image sharing the cached layer: %v", err)
	}
}

func mustSize(t *testing.T, cache string, h v1.Hash) int64 {
	st, err := os.Stat(filepath.Join(cache, h.Algorithm, h.Hex))
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

func hexOf(t *testing.T, l v1.Layer) string {
	d, err := l.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d.String()
}

func TestPullRefusesHostileLayers(t *testing.T) {
	reg := newRegistry(t)
	outside := t.TempDir() // must stay empty
	for _, tc := range []struct {
		name    string
		layers  [][]entry
		class   func(error) bool
		message string
	}{
		{"dotdot name", [][]entry{{file("../escape", "x")}}, errdefs.IsInvalidArgument, `".." component`},
		{"dotdot inside name", [][]entry{{dir("a"), file("a/../../escape", "x")}}, errdefs.IsInvalidArgument, `".." component`},
		{"relative symlink escape", [][]entry{{symlink("up", "../../../../.."+outside)}, {file("up/pwned", "x")}},
			errdefs.IsInvalidArgument, "above the image root"},
		{"symlink chain escape", [][]entry{{dir("a"), symlink("a/b", ".."), symlink("c", "a/b/..")}, {file("c/pwned", "x")}},
			errdefs.IsInvalidArgument, "above the image root"},
		{"hard link escape", [][]entry{{hardlink("h", "../../etc/passwd")}}, errdefs.IsInvalidArgument, `".." component`},
		{"huge declared size", [][]entry{{{name: "big", body: "x", typ: '0', mode: 0o644, size: 1 << 50}}},
			errdefs.IsResourceExhausted, "above the limit of"},
		{"truncated entry", [][]entry{{{name: "short", body: "0123456789", typ: '0', mode: 0o644, size: 4096}}},
			errdefs.IsInvalidArgument, "truncated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ls []v1.Layer
			for _, es := range tc.layers {
				ls = append(ls, layerOf(t, es...))
			}
			ref := reg.push(t, "hostile/"+strings.ReplaceAll(tc.name, " ", "-"), imageOf(t, v1.Config{}, ls...))
			_, _, err := pull(t, testPuller(t), ref)
			if err == nil || !tc.class(err) || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("err = %v, want class %s mentioning %q", err, tc.name, tc.message)
			}
			if ents, _ := os.ReadDir(outside); len(ents) > 0 {
				t.Fatalf("layer wrote outside the root: %v", ents)
			}
		})
	}
}

func TestPullEnforcesTotals(t *testing.T) {
	reg := newRegistry(t)
	ref := reg.push(t, "big/files", imageOf(t, v1.Config{},
		layerOf(t, file("a", strings.Repeat("a", 600))), layerOf(t, file("b", strings.Repeat("b", 600)))))
	p := testPuller(t)
	p.Limits = Limits{MaxBytes: 1000}
	if _, _, err := pull(t, p, ref); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "limit of 1000") {
		t.Fatalf("bytes over the limit: %v", err)
	}
	ref = reg.push(t, "many/files", imageOf(t, v1.Config{}, layerOf(t, file("a", ""), file("b", ""), file("c", ""))))
	p = testPuller(t)
	p.Limits = Limits{MaxEntries: 2}
	if _, _, err := pull(t, p, ref); !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "more than 2 files") {
		t.Fatalf("entries over the limit: %v", err)
	}
}

func TestPullPicksPlatformFromManifestList(t *testing.T) {
	reg := newRegistry(t)
	mk := func(arch, marker string) mutate.IndexAddendum {
		img := imageOf(t, v1.Config{}, layerOf(t, file("arch", marker)))
		cf, _ := img.ConfigFile()
		cf = cf.DeepCopy()
		cf.Architecture = arch
		img, _ = mutate.ConfigFile(img, cf)
		return mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}}
	}
	other := "arm64"
	if wantPlatform.Architecture == "arm64" {
		other = "amd64"
	}
	multi := mutate.AppendManifests(empty.Index, mk(other, "other"), mk(wantPlatform.Architecture, "mine"), mk("s390x", "s390x"))
	ref := reg.pushIndex(t, "multi/arch", multi)
	img, root, err := pull(t, testPuller(t), ref)
	if err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(root, "arch")); got != "mine" {
		t.Errorf("picked the %q image", got)
	}
	if img.IndexDigest == "" || img.IndexDigest == img.Digest {
		t.Errorf("index digest %q, image digest %q", img.IndexDigest, img.Digest)
	}

	ref = reg.pushIndex(t, "other/only", mutate.AppendManifests(empty.Index, mk(other, "other")))
	_, _, err = pull(t, testPuller(t), ref)
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "linux/"+other) || !strings.Contains(err.Error(), "no linux/"+wantPlatform.Architecture) {
		t.Fatalf("%s-only list: %v", other, err)
	}
	// A single-platform image of another architecture is refused too.
	ref = reg.push(t, "other/single", mk(other, "other").Add.(v1.Image))
	if _, _, err := pull(t, testPuller(t), ref); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "/"+other) {
		t.Fatalf("%s image: %v", other, err)
	}
}

func TestPullRefusesCorruptBlobsAndCachesNothing(t *testing.T) {
	for _, tc := range []struct {
		name, message string
		tamper        func(w http.ResponseWriter, body []byte)
	}{
		{"digest mismatch", "digest mismatch", func(w http.ResponseWriter, b []byte) {
			c := slices.Clone(b)
			c[len(c)/2] ^= 0xff
			w.Write(c)
		}},
		{"cut mid-stream", "truncated or corrupt", func(w http.ResponseWriter, b []byte) {
			// The full length is declared, half is sent: the connection
			// ends early.
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
			w.Write(b[:len(b)/2])
		}},
		{"shorter length declared", "truncated or corrupt", func(w http.ResponseWriter, b []byte) {
			w.Header().Set("Content-Length", strconv.Itoa(len(b)/2))
			w.Write(b[:len(b)/2])
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := newRegistry(t)
			l := layerOf(t, file("f", strings.Repeat("data", 1000)))
			ref := reg.push(t, "corrupt/img", imageOf(t, v1.Config{}, l))
			reg.tamper[hexOf(t, l)] = tc.tamper
			p := testPuller(t)
			_, _, err := pull(t, p, ref)
			if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("err = %v, want invalid argument mentioning %q", err, tc.message)
			}
			var files []string
			filepath.WalkDir(p.CacheDir, func(path string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() && d.Name() != cacheLockName {
					files = append(files, path)
				}
				return nil
			})
			if len(files) > 0 {
				t.Fatalf("cache holds %v after a failed download", files)
			}
		})
	}
}

func TestPullRefusesPlainHTTPUnlessInsecure(t *testing.T) {
	reg := newRegistry(t)
	ref := reg.push(t, "plain/http", imageOf(t, v1.Config{}, layerOf(t, file("f", "x"))))
	p := testPuller(t)
	p.Insecure = false
	_, err := p.Resolve(t.Context(), ref)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "--insecure-registry") {
		t.Fatalf("plain HTTP without Insecure: %v", err)
	}
	if _, err := testPuller(t).Resolve(t.Context(), reg.ref("no/such:tag")); !errdefs.IsNotFound(err) {
		t.Fatalf("unknown image: %v", err)
	}
	if _, err := testPuller(t).Resolve(t.Context(), "UPPER CASE"); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad reference: %v", err)
	}
}

// TestPullPublicOnly: a tenant's pull (PublicOnly) is refused at dial
// time by a registry on loopback, naming the operator's way to allow it;
// the same pull without it works. No traffic leaves the test's server.
func TestPullPublicOnly(t *testing.T) {
	reg := newRegistry(t)
	ref := reg.push(t, "public/only", imageOf(t, v1.Config{}, layerOf(t, file("f", "x"))))
	p := testPuller(t)
	p.PublicOnly = true
	_, err := p.Resolve(t.Context(), ref)
	if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "--registry-private") {
		t.Fatalf("a public-only pull from loopback: %v", err)
	}
	if _, err := testPuller(t).Resolve(t.Context(), ref); err != nil {
		t.Fatalf("the same pull, unrestricted: %v", err)
	}
}
