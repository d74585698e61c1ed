package handler_test

import (
	"bytes"
	"path/filepath"
	"slices"
	"testing"

	"github.com/forkd-dev/forkd/internal/agentapi"
	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestFilesRoundTrip(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	dir := t.TempDir()
	data := randomBytes(5<<20 + 123)
	path := filepath.Join(dir, "big.bin")
	fi, err := e.c.WriteFile(ctx, path, 0o640, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size != int64(len(data)) || fi.Mode != 0o640 || fi.IsDir || fi.Name != "big.bin" || fi.Path != path {
		t.Fatalf("write: %+v", fi)
	}
	var got bytes.Buffer
	n, err := e.c.ReadFile(ctx, path, &got)
	if err != nil || n != int64(len(data)) || !bytes.Equal(got.Bytes(), data) {
		t.Fatalf("read back %d bytes (%v), identical=%v", n, err, bytes.Equal(got.Bytes(), data))
	}
	// Overwrite atomically; no temporary files are left behind.
	if _, err := e.c.WriteFile(ctx, path, 0o600, bytes.NewReader([]byte("small"))); err != nil {
		t.Fatal(err)
	}
	got.Reset()
	e.c.ReadFile(ctx, path, &got)
	if got.String() != "small" {
		t.Fatalf("overwrite: %q", got.String())
	}

	sub, err := e.c.Mkdir(ctx, agentapi.MkdirRequest{Path: filepath.Join(dir, "a/b/c"), Parents: true, Mode: 0o700})
	if err != nil || !sub.IsDir || sub.Mode != 0o700 {
		t.Fatalf("mkdir -p: %+v %v", sub, err)
	}
	if _, err := e.c.WriteFile(ctx, filepath.Join(dir, "a/b/c/f.txt"), 0o644, bytes.NewReader(nil)); err != nil {
		t.Fatal(err)
	}
	list, err := e.c.ListFiles(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range list {
		names = append(names, f.Name)
	}
	if !slices.Equal(names, []string{"a", "big.bin"}) {
		t.Fatalf("list: %v", names)
	}
	st, err := e.c.Stat(ctx, filepath.Join(dir, "a/b/c/f.txt"))
	if err != nil || st.Size != 0 || st.Mode != 0o644 || st.ModTime.IsZero() {
		t.Fatalf("stat: %+v %v", st, err)
	}

	if err := e.c.Remove(ctx, filepath.Join(dir, "a"), false); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("remove non-empty dir: %v, want failed precondition", err)
	}
	if err := e.c.Remove(ctx, filepath.Join(dir, "a"), true); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Stat(ctx, filepath.Join(dir, "a")); !errdefs.IsNotFound(err) {
		t.Fatalf("stat after remove: %v", err)
	}
	if err := e.c.Remove(ctx, path, false); err != nil {
		t.Fatal(err)
	}
	if list, _ := e.c.ListFiles(ctx, dir); len(list) != 0 {
		t.Fatalf("left behind: %+v", list)
	}
}

func TestFilesErrors(t *testing.T) {
	e := newEnv(t)
	ctx := ctxT(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")

	if _, err := e.c.ReadFile(ctx, missing, &bytes.Buffer{}); !errdefs.IsNotFound(err) {
		t.Errorf("read missing: %v", err)
	}
	_, err := e.c.WriteFile(ctx, filepath.Join(missing, "f"), 0o644, bytes.NewReader([]byte("x")))
	if !errdefs.IsNotFound(err) || !bytes.Contains([]byte(err.Error()), []byte("parent directory")) {
		t.Errorf("write into missing dir: %v", err)
	}
	if _, err := e.c.Stat(ctx, missing); !errdefs.IsNotFound(err) {
		t.Errorf("stat missing: %v", err)
	}
	if _, err := e.c.ListFiles(ctx, missing); !errdefs.IsNotFound(err) {
		t.Errorf("list missing: %v", err)
	}
	if err := e.c.Remove(ctx, missing, true); !errdefs.IsNotFound(err) {
		t.Errorf("remove missing: %v", err)
	}
	if _, err := e.c.Mkdir(ctx, agentapi.MkdirRequest{Path: filepath.Join(missing, "x")}); !errdefs.IsNotFound(err) {
		t.Errorf("mkdir without parents: %v", err)
	}
	if _, err := e.c.Mkdir(ctx, agentapi.MkdirRequest{Path: dir}); !errdefs.IsAlreadyExists(err) {
		t.Errorf("mkdir existing: %v", err)
	}
	if _, err := e.c.Mkdir(ctx, agentapi.MkdirRequest{Path: dir, Parents: true}); err != nil {
		t.Errorf("mkdir -p existing: %v", err)
	}
	if _, err := e.c.ReadFile(ctx, dir, &bytes.Buffer{}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("read a directory: %v", err)
	}
	if _, err := e.c.Stat(ctx, "relative/path"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("relative path: %v", err)
	}
	if _, err := e.c.WriteFile(ctx, dir, 0o644, bytes.NewReader(nil)); !errdefs.IsInvalidArgument(err) {
		t.Errorf("write over a directory: %v", err)
	}
	if err := e.c.Remove(ctx, "/", true); !errdefs.IsInvalidArgument(err) {
		t.Errorf("remove /: %v", err)
	}
}
