package api

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkd-dev/forkd/internal/client"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/pack"
	"github.com/forkd-dev/forkd/internal/sandbox"
	"github.com/forkd-dev/forkd/internal/snapshot"
	"github.com/forkd-dev/forkd/internal/vmm"
)

// nopDriver is a VMM driver that cannot start anything: archive routes
// never need one.
type nopDriver struct{}

func (nopDriver) Name() string                            { return "nop" }
func (nopDriver) Version(context.Context) (string, error) { return "0", nil }
func (nopDriver) Boot(context.Context, vmm.BootSpec) (vmm.Machine, error) {
	return nil, errors.New("nop driver")
}
func (nopDriver) Prepare(context.Context, vmm.PrepareSpec) (vmm.Machine, error) {
	return nil, errors.New("nop driver")
}

// nopEngine is an engine over dataDir ("" for a fresh one) whose driver
// starts nothing, closed when the test ends; change, if set, edits its
// Config first. prefix names its network namespaces.
func nopEngine(t *testing.T, dataDir, prefix string, change func(*sandbox.Config)) *sandbox.Engine {
	t.Helper()
	if dataDir == "" {
		dataDir = t.TempDir()
	}
	cfg := sandbox.Config{
		DataDir: dataDir, RunDir: t.TempDir(), Driver: nopDriver{},
		NetNSPrefix: prefix + snapshot.NewID()[:4] + "-",
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if change != nil {
		change(&cfg)
	}
	e, err := sandbox.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(context.Background()) })
	return e
}

// archiveServer serves the archive routes of a server whose engine has an
// empty data directory, through the real client.
func archiveServer(t *testing.T) (*client.Client, string) {
	t.Helper()
	return archiveServerWith(t, nil)
}

// archiveServerWith is archiveServer with change applied to its Server.
func archiveServerWith(t *testing.T, change func(*Server)) (*client.Client, string) {
	t.Helper()
	dataDir := t.TempDir()
	e := nopEngine(t, dataDir, "fkar", nil)
	s := &Server{Engine: e}
	if change != nil {
		change(s)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/snapshots/{tag}/archive", s.exportArchive)
	mux.HandleFunc("POST /v1/snapshots/import", s.importArchive)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c, err := client.NewRemote(client.Remote{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c, dataDir
}

// addImage puts a small image of recipe, its digest made of seed, into
// dataDir.
func addImage(t *testing.T, dataDir, recipe, seed string) (digest, dir string) {
	t.Helper()
	sum := sha256.Sum256([]byte(seed))
	digest = hex.EncodeToString(sum[:])
	dir = filepath.Join(dataDir, "images", digest)
	os.MkdirAll(dir, 0o700)
	files := map[string]snapshot.FileEntry{}
	for _, name := range []string{"vmlinuz", "initrd.img", "rootfs.ext4"} {
		p := filepath.Join(dir, name)
		b := make([]byte, 8192)
		rand.Read(b)
		os.WriteFile(p, b, 0o444)
		size, sum, _ := fsutil.HashFile(p)
		files[name] = snapshot.FileEntry{Size: size, SHA256: sum}
	}
	im, _ := json.Marshal(map[string]any{"format_version": 1, "digest": digest, "recipe": map[string]string{"name": recipe}, "files": files, "created": time.Now()})
	os.WriteFile(filepath.Join(dir, "image.json"), im, 0o444)
	return digest, dir
}

// addSnapshot puts a small image and a snapshot tagged tag into dataDir;
// its memory file holds dataBytes of random data.
func addSnapshot(t *testing.T, dataDir, tag string, dataBytes int) {
	t.Helper()
	random := func(n int) []byte {
		b := make([]byte, n)
		rand.Read(b)
		return b
	}
	digest, imgDir := addImage(t, dataDir, "fake", tag)
	store, err := snapshot.Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Stage(tag)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := os.Create(st.Path(snapshot.MemoryFile))
	f.Truncate(64 << 20)
	f.WriteAt(random(dataBytes), 1<<20)
	f.Close()
	os.WriteFile(st.Path(snapshot.StateFile), []byte("state"), 0o600)
	if _, err := st.Commit(snapshot.Manifest{Image: snapshot.ImageRef{Digest: digest, Kernel: filepath.Join(imgDir, "vmlinuz")}, VMM: snapshot.VMMRef{Kind: "nop"}, MemoryMiB: 64, VCPUs: 1}); err != nil {
		t.Fatal(err)
	}
}

func TestArchiveExportImport(t *testing.T) {
	src, srcDir := archiveServer(t)
	addSnapshot(t, srcDir, "base", 1<<20)
	dst, dstDir := archiveServer(t)
	ctx := context.Background()

	var archive bytes.Buffer
	n, err := src.ExportArchive(ctx, "base", &archive, client.ExportOptions{})
	if err != nil || n != int64(archive.Len()) {
		t.Fatalf("export: %d bytes, %v", n, err)
	}
	if _, err := src.ExportArchive(ctx, "nope", io.Discard, client.ExportOptions{}); !errdefs.IsNotFound(err) {
		t.Errorf("export of an unknown tag: %v", err)
	}

	snap, err := dst.ImportArchive(ctx, bytes.NewReader(archive.Bytes()), client.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Tag != "base" || snap.MemoryMiB != 64 || snap.Files[snapshot.MemoryFile].Size != 64<<20 || snap.DiskBytes > 4<<20 {
		t.Errorf("imported %+v", snap)
	}
	if _, err := dst.ImportArchive(ctx, bytes.NewReader(archive.Bytes()), client.ImportOptions{}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("import onto an existing tag: %v", err)
	}
	again, err := dst.ImportArchive(ctx, bytes.NewReader(archive.Bytes()), client.ImportOptions{Force: true})
	if err != nil || again.ID == snap.ID {
		t.Errorf("forced import: %+v %v", again, err)
	}
	renamed, err := dst.ImportArchive(ctx, bytes.NewReader(archive.Bytes()), client.ImportOptions{Tag: "copy"})
	if err != nil || renamed.Tag != "copy" {
		t.Errorf("import under another tag: %+v %v", renamed, err)
	}
	if _, err := dst.ImportArchive(ctx, strings.NewReader("not an archive"), client.ImportOptions{Tag: "junk"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("import of garbage: %v", err)
	}

	// Signed on the client side; verified by the daemon.
	pubPEM, key := signingKey(t)
	pub, _ := pack.ParsePublicKey(pubPEM)
	var signed bytes.Buffer
	if err := pack.Sign(bytes.NewReader(archive.Bytes()), &signed, key); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.ImportArchive(ctx, bytes.NewReader(signed.Bytes()), client.ImportOptions{Tag: "signed", VerifyKey: pub}); err != nil {
		t.Errorf("signed import: %v", err)
	}
	_, err = dst.ImportArchive(ctx, bytes.NewReader(archive.Bytes()), client.ImportOptions{Tag: "unsigned", VerifyKey: pub})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "not signed") {
		t.Errorf("unsigned import with a verify key: %v", err)
	}
	for _, tag := range []string{"junk", "unsigned"} {
		if _, err := os.Stat(filepath.Join(dstDir, "snapshots", tag)); err == nil {
			t.Errorf("failed import left snapshots/%s", tag)
		}
	}
}

// TestArchiveImportFailsEarly: an archive refused by its manifest (here:
// not signed) is answered with a problem while the client still sends
// the rest of a large body, not with a broken connection.
func TestArchiveImportFailsEarly(t *testing.T) {
	src, srcDir := archiveServer(t)
	addSnapshot(t, srcDir, "big", 48<<20)
	var archive bytes.Buffer
	if _, err := src.ExportArchive(context.Background(), "big", &archive, client.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	dst, _ := archiveServer(t)
	pubPEM, _ := signingKey(t)
	pub, _ := pack.ParsePublicKey(pubPEM)
	start := time.Now()
	_, err := dst.ImportArchive(context.Background(), bytes.NewReader(archive.Bytes()), client.ImportOptions{VerifyKey: pub})
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "not signed") {
		t.Errorf("unsigned %d MB import with a verify key: %v (after %v)", archive.Len()>>20, err, time.Since(start))
	}
}

func signingKey(t *testing.T) ([]byte, ed25519.PrivateKey) {
	privPEM, pubPEM, err := pack.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	key, err := pack.ParsePrivateKey(privPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pubPEM, key
}

// TestImportPolicy: a daemon with trusted keys imports only archives one
// of them signed: unsigned and otherwise signed ones are 403 naming the
// fix, and leave nothing behind.
func TestImportPolicy(t *testing.T) {
	src, srcDir := archiveServer(t)
	addSnapshot(t, srcDir, "base", 1<<20)
	ctx := context.Background()
	var archive bytes.Buffer
	if _, err := src.ExportArchive(ctx, "base", &archive, client.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	pubPEM, key := signingKey(t)
	pub, _ := pack.ParsePublicKey(pubPEM)
	_, otherKey := signingKey(t)
	sign := func(k ed25519.PrivateKey) []byte {
		var b bytes.Buffer
		if err := pack.Sign(bytes.NewReader(archive.Bytes()), &b, k); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	dst, dstDir := archiveServerWith(t, func(s *Server) { s.TrustedKeys = []ed25519.PublicKey{pub} })
	for name, body := range map[string][]byte{"unsigned": archive.Bytes(), "other-key": sign(otherKey)} {
		_, err := dst.ImportArchive(ctx, bytes.NewReader(body), client.ImportOptions{Tag: name})
		if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), "--trusted-keys") {
			t.Errorf("%s import under the policy: %v, want 403 naming --trusted-keys", name, err)
		}
		if _, err := os.Stat(filepath.Join(dstDir, "snapshots", name)); err == nil {
			t.Errorf("refused import left snapshots/%s", name)
		}
	}
	if snap, err := dst.ImportArchive(ctx, bytes.NewReader(sign(key)), client.ImportOptions{Tag: "trusted"}); err != nil || snap.Tag != "trusted" {
		t.Errorf("import signed by the trusted key: %+v %v", snap, err)
	}
}
