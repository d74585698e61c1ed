package integration

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkd-dev/forkd/internal/pack"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// engineOn starts an engine over its own data directory.
func engineOn(t *testing.T, data string) *sandbox.Engine {
	t.Helper()
	ctor, err := vmm.Lookup("qemu")
	if err != nil {
		t.Fatal(err)
	}
	drv, err := ctor.New(vmm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	runDir, err := os.MkdirTemp("/run", "forkd-it-")
	if err != nil {
		t.Fatal(err)
	}
	e, err := sandbox.New(sandbox.Config{
		DataDir: data, RunDir: runDir, Driver: drv,
		NetNSPrefix: "fkp" + snapshot.NewID()[:4] + "-", MaxForkCount: 4,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Close(context.Background())
		os.RemoveAll(runDir)
	})
	return e
}

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

	e2 := engineOn(t, fresh)
	sbs, err := e2.Fork(ctx, "moved", 1)
	if err != nil {
		t.Fatalf("fork from the unpacked snapshot: %v", err)
	}
	if got := run(t, agentOf(t, e2, sbs[0].ID), "echo", "moved ok"); got != "moved ok" {
		t.Errorf("child of the unpacked snapshot said %q", got)
	}
}
