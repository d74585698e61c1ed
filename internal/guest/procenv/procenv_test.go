package procenv

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestMerge(t *testing.T) {
	got := Merge(Default, map[string]string{"HOME": "/home/u", "B": "2", "A": "1"})
	want := []string{Default[0], Default[2], "A=1", "B=2", "HOME=/home/u"}
	if !slices.Equal(got, want) {
		t.Fatalf("Merge = %v, want %v", got, want)
	}
	if Get(got, "HOME") != "/home/u" || Get(got, "NOPE") != "" {
		t.Fatal("Get")
	}
}

func TestValidate(t *testing.T) {
	for _, bad := range []map[string]string{{"": "x"}, {"A=B": "x"}, {"A": "x\x00"}} {
		if err := Validate(bad); !errdefs.IsInvalidArgument(err) {
			t.Errorf("Validate(%q) = %v", bad, err)
		}
	}
}

func TestLookPath(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "tool")
	os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "data"), nil, 0o644)
	env := []string{"PATH=/nonexistent:" + dir}
	if p, err := LookPath("tool", env); err != nil || p != exe {
		t.Fatalf("LookPath(tool) = %q, %v", p, err)
	}
	if _, err := LookPath("missing", env); !errdefs.IsNotFound(err) {
		t.Fatalf("missing: %v", err)
	}
	if _, err := LookPath("data", env); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("not executable: %v", err)
	}
	if _, err := LookPath(filepath.Join(dir, "nope"), env); !errdefs.IsNotFound(err) {
		t.Fatalf("absolute missing: %v", err)
	}
}

func TestFromImageConfig(t *testing.T) {
	dir := t.TempDir()
	env, cwd, err := FromImageConfig(filepath.Join(dir, "missing.json"), Default)
	if err != nil || cwd != "" || !slices.Equal(env, Default) {
		t.Fatalf("missing file: %v %q %v", env, cwd, err)
	}
	p := filepath.Join(dir, "image-config.json")
	os.WriteFile(p, []byte(`{"env":["PATH=/app/bin:/bin","GREETING=a=b"],"working_dir":"/app","cmd":["x"]}`), 0o644)
	env, cwd, err = FromImageConfig(p, Default)
	if err != nil || cwd != "/app" || Get(env, "PATH") != "/app/bin:/bin" || Get(env, "GREETING") != "a=b" || Get(env, "HOME") != "/root" {
		t.Fatalf("config: %v %q %v", env, cwd, err)
	}
	os.WriteFile(p, []byte(`{"env":`), 0o644)
	if _, _, err := FromImageConfig(p, Default); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("corrupt config: %v", err)
	}
}
