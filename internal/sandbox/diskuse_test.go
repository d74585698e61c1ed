package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A prune while a build pulls layers (the layer cache held shared) leaves
// the unused layers, says so, and prunes the rest; the next prune, once
// the pull is done, removes them.
func TestPruneLeavesBusyLayerCache(t *testing.T) {
	ctx := context.Background()
	e, _ := newFakeEngine(t, &fakeDriver{}, 0)
	c := e.layerCache()
	hex := strings.Repeat("ab", 32)
	if err := os.MkdirAll(filepath.Join(c.Dir, "sha256"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.Dir, "sha256", hex), []byte("an unused layer"), 0o644); err != nil {
		t.Fatal(err)
	}
	release, err := c.Hold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.Prune(ctx, PruneOptions{})
	if err != nil {
		t.Fatalf("prune during a pull: %v, want the layers left and the rest pruned", err)
	}
	if len(res.OCILayers) != 0 || len(res.Skipped) != 1 || !strings.Contains(res.Skipped[0], "in use by an image build") {
		t.Fatalf("prune during a pull removed %v, skipped %q", res.OCILayers, res.Skipped)
	}
	release()
	res, err = e.Prune(ctx, PruneOptions{})
	if err != nil || !slices.Equal(res.OCILayers, []string{"sha256:" + hex}) || len(res.Skipped) != 0 {
		t.Fatalf("prune after the pull: %+v, %v", res, err)
	}
}
