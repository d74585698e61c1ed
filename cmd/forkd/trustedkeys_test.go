package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/pack"
)

func TestLoadTrustedKeys(t *testing.T) {
	dir := t.TempDir()
	keys := filepath.Join(dir, "keys")
	os.Mkdir(keys, 0o755)
	for _, name := range []string{"a.pub", "b.pub"} {
		_, pub, err := pack.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(keys, name), pub, 0o644)
	}
	_, one, _ := pack.GenerateKey()
	single := filepath.Join(dir, "one.pub")
	os.WriteFile(single, one, 0o644)
	got, err := loadTrustedKeys(keys + ", " + single)
	if err != nil || len(got) != 3 {
		t.Fatalf("a directory of two and a file: %d keys, %v", len(got), err)
	}
	if got, err := loadTrustedKeys(""); err != nil || got != nil {
		t.Errorf("none: %v %v", got, err)
	}
	empty := filepath.Join(dir, "empty")
	os.Mkdir(empty, 0o755)
	junk := filepath.Join(dir, "junk.pub")
	os.WriteFile(junk, []byte("not a key"), 0o644)
	for list, want := range map[string]string{
		filepath.Join(dir, "missing.pub"): "no such file",
		empty:                             "no *.pub",
		junk:                              "forkd pack keygen",
	} {
		if _, err := loadTrustedKeys(list); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want invalid argument containing %q", list, err, want)
		}
	}
}
