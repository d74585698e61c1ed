package imagebuild

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// TestPushToARegistry: an archive pushed to a registry (go-containerregistry's
// in-memory one, on loopback) is the archive's image, by digest; pushing
// it again is no error; a bad reference or archive is named.
func TestPushToARegistry(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "tool")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho tool\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	img, err := Build(Spec{Files: []File{{Src: bin, Dst: "/usr/bin/tool", Mode: 0o755}},
		Entrypoint: []string{"/usr/bin/tool"}, Created: time.Unix(1700000000, 0).UTC()})
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "tool.tar")
	if err := WriteArchive(img, archive, "ghcr.io/forkd-dev/tool:1"); err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()

	reg := httptest.NewServer(registry.New())
	t.Cleanup(reg.Close)
	ref := strings.TrimPrefix(reg.URL, "http://") + "/forkd-dev/tool:1"
	ctx := context.Background()
	for i := range 2 {
		got, err := Push(ctx, archive, ref, false)
		if err != nil || got != want {
			t.Fatalf("push %d: %s, %v; want %s", i+1, got, err, want)
		}
	}
	parsed, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(parsed, remote.WithContext(ctx))
	if err != nil || desc.Digest != want {
		t.Fatalf("the registry holds %v (%v), want %s", desc, err, want)
	}

	for _, c := range []struct{ archive, ref, says string }{
		{archive, "not a reference", "want REGISTRY/REPOSITORY:TAG"},
		{filepath.Join(dir, "missing.tar"), ref, "reading the archive"},
	} {
		if _, err := Push(ctx, c.archive, c.ref, false); err == nil || !strings.Contains(err.Error(), c.says) {
			t.Errorf("push %s to %q: %v, want an error saying %q", c.archive, c.ref, err, c.says)
		}
	}
}
