package image

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestListOpenRemove(t *testing.T) {
	dd := newDataDir(t)
	b := newBuilder(t, dd)
	ctx := context.Background()

	if imgs, err := List(dd); err != nil || len(imgs) != 0 {
		t.Fatalf("List of an empty data dir = %v, %v", imgs, err)
	}
	_, err := Open(dd, "minimal")
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "build one first") {
		t.Errorf("Open in an empty data dir: %v", err)
	}

	old, err := b.Build(ctx, mustRecipe(t, minimalRecipe))
	if err != nil {
		t.Fatal(err)
	}
	newer, err := b.Build(ctx, mustRecipe(t, strings.Replace(minimalRecipe, "256", "128", 1)))
	if err != nil {
		t.Fatal(err)
	}
	imgs, err := List(dd)
	if err != nil || len(imgs) != 2 || imgs[0].Digest != newer.Digest {
		t.Fatalf("List = %v (%v), want newest first", imgs, err)
	}

	for ref, want := range map[string]string{
		old.Digest:       old.Digest,
		old.Digest[:10]:  old.Digest,
		newer.Digest[:6]: newer.Digest,
		"minimal":        newer.Digest, // a recipe name picks its newest image
	} {
		img, err := Open(dd, ref)
		if err != nil || img.Digest != want {
			t.Errorf("Open(%q) = %v, %v; want %s", ref, img, err, want)
		}
	}
	_, err = Open(dd, "py-pandas")
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "minimal "+newer.Digest[:12]) {
		t.Errorf("Open(unknown) = %v; want NotFound listing the known images", err)
	}
	if _, err := Open(dd, ""); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Open(\"\") = %v", err)
	}

	if err := Remove(dd, "minimal"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Remove by recipe name = %v, want InvalidArgument", err)
	}
	if err := Remove(dd, old.Digest[:8]); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(old.Dir); !os.IsNotExist(err) {
		t.Errorf("removed image dir still there: %v", err)
	}
	if err := Remove(dd, old.Digest); !errdefs.IsNotFound(err) {
		t.Errorf("second Remove = %v, want NotFound", err)
	}
	if imgs, _ := List(dd); len(imgs) != 1 || imgs[0].Digest != newer.Digest {
		t.Errorf("after Remove, List = %v", imgs)
	}
	// The shared root file system is still cached and still used.
	if _, err := os.Stat(newer.Rootfs); err != nil {
		t.Error(err)
	}
	ents, _ := os.ReadDir(filepath.Join(dd, "images"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), stagingPrefix) {
			t.Errorf("Remove left %s", e.Name())
		}
	}
}

// TestHalfImageInvisible: a directory without image.json (a crash between
// mkdir and publish cannot produce one, but a manual copy could) is not an
// image, and a build replaces it.
func TestHalfImageInvisible(t *testing.T) {
	dd := newDataDir(t)
	b := newBuilder(t, dd)
	img, err := b.Build(context.Background(), mustRecipe(t, minimalRecipe))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(img.Dir, manifestName)); err != nil {
		t.Fatal(err)
	}
	if imgs, _ := List(dd); len(imgs) != 0 {
		t.Errorf("List shows an image without manifest: %v", imgs)
	}
	again, err := b.Build(context.Background(), mustRecipe(t, minimalRecipe))
	if err != nil {
		t.Fatal(err)
	}
	if again.Digest != img.Digest {
		t.Errorf("digest changed: %s vs %s", again.Digest, img.Digest)
	}
	if _, err := os.Stat(filepath.Join(img.Dir, manifestName)); err != nil {
		t.Errorf("rebuilt image has no manifest: %v", err)
	}
}
