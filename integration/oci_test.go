package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/forkd-dev/forkd/internal/image"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// ociLayer is a layer of the given tar entries (bodies in files).
func ociLayer(t *testing.T, hdrs []*tar.Header, bodies map[string][]byte) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		h.Size = int64(len(bodies[h.Name]))
		h.ModTime = time.Unix(1700000000, 0)
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(bodies[h.Name]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestSnapshotFromOCIImage builds an image from a two-layer OCI image with
// a static busybox, pushed by the test to an in-process registry on
// loopback, snapshots it from a recipe with from, forks, and checks in the
// child that the image's files, whiteouts and config (Env, WorkingDir) are
// there.
func TestSnapshotFromOCIImage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bb, err := (&image.Builder{DataDir: dataDir, Progress: func(s string) { t.Log(s) }}).BusyboxBinary(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	busybox, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	base := ociLayer(t, []*tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755},
		{Name: "bin/sh", Typeflag: tar.TypeSymlink, Linkname: "busybox"},
		{Name: "bin/cat", Typeflag: tar.TypeSymlink, Linkname: "/bin/busybox"},
		{Name: "bin/pwd", Typeflag: tar.TypeLink, Linkname: "bin/busybox"},
		{Name: "bin/removed", Typeflag: tar.TypeSymlink, Linkname: "busybox"},
	}, map[string][]byte{"bin/busybox": busybox})
	app := ociLayer(t, []*tar.Header{
		{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "app/hello.txt", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "bin/.wh.removed", Typeflag: tar.TypeReg, Mode: 0o644},
	}, map[string][]byte{"app/hello.txt": []byte("hello from an OCI layer\n")})
	img, err := mutate.AppendLayers(empty.Image, base, app)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{Env: []string{"PATH=/bin", "GREETING=from-the-image-config"}, WorkingDir: "/app", Cmd: []string{"/bin/sh"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	ref := strings.TrimPrefix(srv.URL, "http://") + "/forkd-it/busybox-app:v1"
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithContext(ctx)); err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()

	e := newEngine(t, 0)
	tag := "it-oci-" + snapshot.NewID()
	snap, err := e.CreateSnapshot(ctx, sandbox.CreateSnapshotOptions{
		Tag: tag, RecipeTOML: "name = \"oci-it\"\nfrom = \"" + ref + "\"\ninsecure_registry = true\n",
		Progress: func(m string) { t.Log(m) },
	})
	if err != nil {
		t.Fatalf("create snapshot from %s: %v", ref, err)
	}
	t.Cleanup(func() { e.RemoveSnapshot(context.Background(), tag) })
	built, err := image.Open(dataDir, snap.Image.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if built.From == nil || built.From.Digest != want.String() {
		t.Fatalf("image %s records source %+v, want manifest %s", built.Digest, built.From, want)
	}
	// df counts the pulled layers as in use, and no prune would take them.
	du, err := e.DiskUsage()
	if err != nil || len(built.From.Layers) != 2 || du.OCILayers.Active < 2 || du.OCILayers.Bytes <= 0 {
		t.Fatalf("df: %+v (%v); the image lists layers %v", du.OCILayers, err, built.From.Layers)
	}
	plan, err := e.Prune(ctx, sandbox.PruneOptions{Images: true, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range plan.OCILayers {
		if slices.Contains(built.From.Layers, d) {
			t.Fatalf("a prune would remove layer %s of image %s, which snapshot %s uses", d, built.Digest, tag)
		}
	}

	sbs, err := e.Fork(ctx, snap.Tag, 1)
	if err != nil {
		t.Fatal(err)
	}
	a := agentOf(t, e, sbs[0].ID)
	// No cwd and no env in the request: the image's are the defaults.
	got := run(t, a, "sh", "-c", `pwd; echo "$GREETING"; cat hello.txt; test -e /bin/removed || echo whited-out; /bin/pwd`)
	wantOut := "/app\nfrom-the-image-config\nhello from an OCI layer\nwhited-out\n/app"
	if got != wantOut {
		t.Fatalf("in the child:\n%s\nwant:\n%s", got, wantOut)
	}
}
