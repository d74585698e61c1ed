package integration

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkd-dev/forkd/internal/pack"
)

// TestPackUnpackFork moves a real template to an empty data directory
// through a signed archive and forks a child from it there.
func TestPackUnpackFork(t *testing.T) {
	e := newEngine(t, 0)
	snap := newTemplate(t, e, "minimal")
	ctx := context.Background()
	privPEM, pubPEM, err := pack.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	key, _ := pack.ParsePrivateKey(privPEM)
	pub, _ := pack.ParsePublicKey(pubPEM)

	archive := filepath.Join(t.TempDir(), "minimal.forkd.tar.zst")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	pst, err := pack.Pack(ctx, dataDir, snap.Tag, f, pack.PackOptions{SignKey: key})
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("packed %d MB logical into %.1f MB in %v", pst.LogicalBytes>>20, float64(pst.ArchiveBytes)/1e6, pst.Duration)

	fresh := t.TempDir()
	f, err = os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	moved, ust, err := pack.Unpack(ctx, fresh, f, pack.UnpackOptions{VerifyKey: pub, Tag: "moved"})
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if !ust.Verified || len(ust.ImagesAdded) != 1 || moved.Image.Rootfs != filepath.Join(fresh, "images", snap.Image.Digest, "rootfs.ext4") {
		t.Errorf("unpack: %+v, rootfs %s", ust, moved.Image.Rootfs)
	}

	e2 := newEngineOn(t, fresh, 0)
	sbs, err := e2.Fork(ctx, "moved", 1)
	if err != nil {
		t.Fatalf("fork from the unpacked snapshot: %v", err)
	}
	if got := run(t, agentOf(t, e2, sbs[0].ID), "echo", "moved ok"); got != "moved ok" {
		t.Errorf("child of the unpacked snapshot said %q", got)
	}
}
