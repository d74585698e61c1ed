package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkd-dev/forkd/internal/apiv1"
	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/fsutil"
	"github.com/forkd-dev/forkd/internal/pack"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

// archiveDaemon stands in for the daemon's two archive routes (the real
// handlers are in internal/api): it packs from src and unpacks into dst.
func archiveDaemon(t *testing.T, src, dst string) *httptest.Server {
	mux := http.NewServeMux()
	problem := func(w http.ResponseWriter, err error) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(400)
		json.NewEncoder(w).Encode(apiv1.Problem{Status: 400, Code: errdefs.Code(err), Detail: err.Error()})
	}
	mux.HandleFunc("GET /v1/snapshots/{tag}/archive", func(w http.ResponseWriter, r *http.Request) {
		if _, err := pack.Pack(r.Context(), src, r.PathValue("tag"), w, pack.PackOptions{ExcludeImages: r.URL.Query().Get("image") == "0"}); err != nil {
			problem(w, err)
		}
	})
	mux.HandleFunc("POST /v1/snapshots/import", func(w http.ResponseWriter, r *http.Request) {
		opts := pack.UnpackOptions{Tag: r.URL.Query().Get("tag"), Force: r.URL.Query().Get("force") == "1"}
		if k := r.URL.Query().Get("verify_key"); k != "" {
			opts.VerifyKey, _ = pack.ParsePublicKey([]byte(k))
		}
		snap, _, err := pack.Unpack(r.Context(), dst, r.Body, opts)
		if err != nil {
			problem(w, err)
			return
		}
		w.WriteHeader(201)
		json.NewEncoder(w).Encode(apiv1.Snapshot{Tag: snap.Tag, ID: snap.ID})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// smallSnapshot puts a tiny image and snapshot tagged tag into dataDir.
func smallSnapshot(t *testing.T, dataDir, tag string) {
	t.Helper()
	sum := sha256.Sum256([]byte(tag))
	digest := hex.EncodeToString(sum[:])
	imgDir := filepath.Join(dataDir, "images", digest)
	os.MkdirAll(imgDir, 0o700)
	files := map[string]snapshot.FileEntry{}
	for _, name := range []string{"vmlinuz", "initrd.img", "rootfs.ext4"} {
		b := make([]byte, 4096)
		rand.Read(b)
		p := filepath.Join(imgDir, name)
		os.WriteFile(p, b, 0o444)
		size, sum, _ := fsutil.HashFile(p)
		files[name] = snapshot.FileEntry{Size: size, SHA256: sum}
	}
	im, _ := json.Marshal(map[string]any{"format_version": 1, "digest": digest, "files": files, "created": time.Now()})
	os.WriteFile(filepath.Join(imgDir, "image.json"), im, 0o444)
	store, err := snapshot.Open(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Stage(tag)
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(st.Path(snapshot.MemoryFile), []byte("memory"), 0o600)
	os.WriteFile(st.Path(snapshot.StateFile), []byte("state"), 0o600)
	if _, err := st.Commit(snapshot.Manifest{Image: snapshot.ImageRef{Digest: digest}}); err != nil {
		t.Fatal(err)
	}
}

func runCmd(cmd *cobra.Command, args ...string) error {
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	return cmd.ExecuteContext(context.Background())
}

func TestPackUnpackCommands(t *testing.T) {
	src, dst, work := t.TempDir(), t.TempDir(), t.TempDir()
	smallSnapshot(t, src, "base")
	g := &globals{host: archiveDaemon(t, src, dst).URL}
	key := filepath.Join(work, "key")

	if err := runCmd(packCmd(g), "keygen", "-o", key); err != nil {
		t.Fatal(err)
	}
	for path, perm := range map[string]os.FileMode{key: 0o600, key + ".pub": 0o644} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != perm {
			t.Errorf("%s: %v %v, want mode %v", path, err, fi, perm)
		}
	}
	if err := runCmd(packCmd(g), "keygen", "-o", key); !errdefs.IsAlreadyExists(err) {
		t.Errorf("keygen over an existing key: %v", err)
	}

	signed := filepath.Join(work, "base.signed")
	unsigned := filepath.Join(work, "base.unsigned")
	if err := runCmd(packCmd(g), "base", "-o", signed, "--sign", key); err != nil {
		t.Fatal(err)
	}
	if err := runCmd(packCmd(g), "base", "-o", unsigned); err != nil {
		t.Fatal(err)
	}
	if err := runCmd(packCmd(g), "nope", "-o", filepath.Join(work, "nope")); err == nil {
		t.Error("packed an unknown tag")
	}
	if err := runCmd(packCmd(g), "base"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("pack without -o: %v", err)
	}
	ents, _ := os.ReadDir(work)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") || e.Name() == "nope" {
			t.Errorf("left behind: %s", e.Name())
		}
	}

	if err := runCmd(unpackCmd(g), signed, "--verify", key+".pub", "--tag", "signed"); err != nil {
		t.Errorf("unpack --verify of a signed archive: %v", err)
	}
	err := runCmd(unpackCmd(g), unsigned, "--verify", key+".pub", "--tag", "unsigned")
	if err == nil || !strings.Contains(err.Error(), "not signed") {
		t.Errorf("unpack --verify of an unsigned archive: %v", err)
	}
	if err := runCmd(unpackCmd(g), unsigned); err != nil {
		t.Errorf("unpack: %v", err)
	}
	if err := runCmd(unpackCmd(g), unsigned); err == nil {
		t.Error("unpacked onto an existing tag without --force")
	}
	if err := runCmd(unpackCmd(g), unsigned, "--force"); err != nil {
		t.Errorf("unpack --force: %v", err)
	}
	if err := runCmd(unpackCmd(g), unsigned, "--tag", "../x"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("unpack --tag ../x: %v", err)
	}
	for _, tag := range []string{"base", "signed"} {
		if _, err := os.Stat(filepath.Join(dst, "snapshots", tag, "manifest.json")); err != nil {
			t.Errorf("snapshot %s: %v", tag, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dst, "snapshots", "unsigned")); err == nil {
		t.Error("the refused archive left snapshots/unsigned")
	}
}
