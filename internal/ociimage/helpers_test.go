package ociimage

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// testRegistry is go-containerregistry's in-memory registry on loopback.
// tamper, if set, answers blob GETs in its place with what the registry
// would send (corrupt or truncated blobs); the registry itself checks
// digests on upload.
type testRegistry struct {
	srv *httptest.Server
	mu  sync.Mutex
	// tamper maps a blob digest to a function that writes the response.
	tamper map[string]func(w http.ResponseWriter, body []byte)
}

func newRegistry(t *testing.T) *testRegistry {
	t.Helper()
	tr := &testRegistry{tamper: map[string]func(http.ResponseWriter, []byte){}}
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	tr.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tr.mu.Lock()
		var fn func(http.ResponseWriter, []byte)
		for d, f := range tr.tamper {
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+d) {
				fn = f
			}
		}
		tr.mu.Unlock()
		if fn == nil {
			reg.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		reg.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			if k != "Content-Length" {
				w.Header()[k] = v
			}
		}
		fn(w, rec.Body.Bytes())
	}))
	t.Cleanup(tr.srv.Close)
	return tr
}

// ref names repo:tag in the registry.
func (tr *testRegistry) ref(repo string) string {
	return strings.TrimPrefix(tr.srv.URL, "http://") + "/" + repo
}

func (tr *testRegistry) push(t *testing.T, repo string, img v1.Image) string {
	t.Helper()
	ref := tr.ref(repo)
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref
}

func (tr *testRegistry) pushIndex(t *testing.T, repo string, idx v1.ImageIndex) string {
	t.Helper()
	ref := tr.ref(repo)
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(r, idx); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref
}

// entry is one tar entry of a test layer.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
	size             int64 // declared size when not len(body)
}

func file(name, body string) entry {
	return entry{name: name, body: body, typ: tar.TypeReg, mode: 0o644}
}
func dir(name string) entry { return entry{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, target string) entry {
	return entry{name: name, link: target, typ: tar.TypeSymlink, mode: 0o777}
}
func hardlink(name, target string) entry {
	return entry{name: name, link: target, typ: tar.TypeLink, mode: 0o644}
}

// tarBytes writes entries as a tar; an entry whose declared size exceeds
// its body ends the archive there (a truncated layer).
func tarBytes(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		size := int64(len(e.body))
		if e.size != 0 {
			size = e.size
		}
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			Size: size, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
		if size != int64(len(e.body)) {
			tw.Flush()
			return buf.Bytes() // truncated on purpose
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func layerOf(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	data := tarBytes(t, entries...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// imageOf stacks layers into a linux/amd64 image with cfg.
func imageOf(t *testing.T, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", wantPlatform.Architecture, cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func testPuller(t *testing.T) *Puller {
	return &Puller{CacheDir: t.TempDir(), Insecure: true, Progress: func(s string) { t.Log(s) }}
}

// pull resolves ref and unpacks it into a new directory.
func pull(t *testing.T, p *Puller, ref string) (*Image, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	img, err := p.Resolve(ctx, ref)
	if err != nil {
		return nil, "", err
	}
	dir := t.TempDir()
	_, err = img.Unpack(ctx, dir)
	return img, dir, err
}
