package image

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

// pushTestImage pushes a one-layer image made of hdrs (with bodies) to a
// registry on loopback and returns its reference.
func pushTestImage(t *testing.T, registryHost, repo string, cfg v1.Config, files map[*tar.Header]string) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	var hdrs []*tar.Header
	for h := range files {
		hdrs = append(hdrs, h)
	}
	slices.SortFunc(hdrs, func(a, b *tar.Header) int { return strings.Compare(a.Name, b.Name) })
	for _, h := range hdrs {
		h.Size = int64(len(files[h]))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(files[h]))
	}
	tw.Close()
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, _ := mutate.AppendLayers(empty.Image, l)
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", "amd64", cfg
	img, _ = mutate.ConfigFile(img, cf)
	ref := registryHost + "/" + repo
	r, _ := name.ParseReference(ref, name.Insecure)
	if err := remote.Write(r, img); err != nil {
		t.Fatal(err)
	}
	return ref
}

func TestBuildFromImage(t *testing.T) {
	dd := newDataDir(t)
	b := newBuilder(t, dd)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	// Directories the image's symlinks point at on the host: finishing the
	// tree must write through none of them.
	outside := t.TempDir()
	cfg := v1.Config{Env: []string{"PATH=/app/bin:/bin", "GREETING=hello"}, WorkingDir: "/app",
		Entrypoint: []string{"/app/bin/run"}, Cmd: []string{"--serve"}, User: "65534"}
	files := map[*tar.Header]string{
		{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755}:                           "",
		{Name: "app/hello.txt", Typeflag: tar.TypeReg, Mode: 0o644}:                  "from an OCI image\n",
		{Name: "etc", Typeflag: tar.TypeSymlink, Linkname: outside}:                  "",
		{Name: "tmp", Typeflag: tar.TypeSymlink, Linkname: "../../../../" + outside}: "",
	}
	ref := pushTestImage(t, host, "forkd/app:v1", cfg, files)

	// Plain HTTP is refused unless the recipe asks for it.
	if _, err := b.Build(context.Background(), mustRecipe(t, "name = \"app\"\nfrom = \""+ref+"\"\n")); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("plain-HTTP registry without insecure_registry: %v", err)
	}
	r := mustRecipe(t, "name = \"app\"\nfrom = \""+ref+"\"\ninsecure_registry = true\n")
	img, err := b.Build(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if img.From == nil || img.From.Ref != ref || !strings.HasPrefix(img.From.Digest, "sha256:") || len(img.From.Layers) != 1 ||
		img.From.Config.WorkingDir != "/app" || !slices.Equal(img.From.Config.Cmd, []string{"--serve"}) {
		t.Fatalf("image source: %+v", img.From)
	}
	if ents, _ := os.ReadDir(outside); len(ents) > 0 {
		t.Fatalf("the build wrote through the image's symlinks to the host: %v", ents)
	}
	debugfs := requireBinary(t, "debugfs")
	cat := func(p string) string {
		out, err := exec.Command(debugfs, "-R", "cat "+p, img.Rootfs).Output()
		if err != nil {
			t.Fatalf("debugfs cat %s: %v", p, err)
		}
		return string(out)
	}
	if got := cat("/app/hello.txt"); got != "from an OCI image\n" {
		t.Errorf("/app/hello.txt = %q", got)
	}
	var ic agentapi.ImageConfig
	if err := json.Unmarshal([]byte(cat(agentapi.ImageConfigPath)), &ic); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ic.Env, cfg.Env) || ic.WorkingDir != "/app" || ic.User != "65534" || !slices.Equal(ic.Entrypoint, cfg.Entrypoint) {
		t.Errorf("image config in the guest: %+v", ic)
	}
	if got := cat("/etc/hostname"); got != "forkd\n" {
		t.Errorf("/etc/hostname = %q (etc must have become a real directory)", got)
	}

	// The same digest is the cached image; a moved tag is a new one.
	again, err := b.Build(context.Background(), r)
	if err != nil || again.Digest != img.Digest {
		t.Fatalf("rebuild: %v, digest %s then %s", err, img.Digest, again.Digest)
	}
	files[&tar.Header{Name: "app/v2", Typeflag: tar.TypeReg, Mode: 0o644}] = "2"
	pushTestImage(t, host, "forkd/app:v1", cfg, files)
	moved, err := b.Build(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if moved.Digest == img.Digest || moved.From.Digest == img.From.Digest {
		t.Fatalf("a moved tag kept digest %s (from %s)", moved.Digest, moved.From.Digest)
	}
	layers, _ := filepath.Glob(filepath.Join(dd, "cache", "layers", "sha256", "*"))
	if len(layers) != 2 {
		t.Errorf("layer cache holds %v, want the two layers", layers)
	}
}
