package image

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/recipe"
)

// TestBadRecipes: mistakes in a recipe fail at parse time with the fix in
// the message and the InvalidArgument class.
func TestBadRecipes(t *testing.T) {
	cases := []struct {
		name, text string
		want       []string
	}{
		{"unknown base", "name = \"x\"\nbase = \"alpine\"\n", []string{`base "alpine"`, "busybox", "debian"}},
		{"packages on busybox", "name = \"x\"\nbase = \"busybox\"\npackages = [\"curl\"]\n", []string{"takes no packages", `"debian"`}},
		{"python on busybox", "name = \"x\"\nbase = \"busybox\"\n[python]\nenabled = true\n", []string{"[python] needs base"}},
		{"python without python3", "name = \"x\"\nbase = \"debian\"\npackages = [\"curl\"]\n[python]\nenabled = true\n", []string{`"python3" in packages`}},
		{"warm without python", "name = \"x\"\nbase = \"debian\"\npackages = [\"python3\"]\n[python]\nwarm = \"import os\"\n", []string{"enabled is false"}},
		{"misspelt key", "name = \"x\"\nbase = \"busybox\"\nmemory = 256\n", []string{"unknown keys memory", "memory_mib"}},
		{"bad name", "name = \"My_Image\"\nbase = \"busybox\"\n", []string{`name "My_Image"`, "lowercase"}},
		{"bad package", "name = \"x\"\nbase = \"debian\"\npackages = [\"Python 3\"]\n", []string{`package "Python 3"`}},
		{"memory too small", "name = \"x\"\nbase = \"busybox\"\nmemory_mib = 16\n", []string{"memory_mib 16", "64..65536"}},
		{"toml syntax", "name = \"x\nbase = \"busybox\"\n", []string{"recipe test.toml"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := recipe.Parse("test.toml", []byte(c.text))
			if err == nil {
				t.Fatal("parsed without error")
			}
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("error class %s, want invalid_argument: %v", errdefs.Code(err), err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestBuildRejects: Build checks its inputs before any slow work.
func TestBuildRejects(t *testing.T) {
	ctx := context.Background()
	good := mustRecipe(t, minimalRecipe)
	script := filepath.Join(t.TempDir(), "init.sh")
	os.WriteFile(script, []byte("#!/bin/sh\necho hi\n"), 0o755)

	cases := []struct {
		name  string
		b     Builder
		r     *recipe.Recipe
		class error
		want  string
	}{
		{"nil recipe", Builder{DataDir: t.TempDir(), AgentBinary: "/bin/true"}, nil, errdefs.ErrInvalidArgument, "no recipe"},
		{"no data dir", Builder{AgentBinary: "/bin/true"}, good, errdefs.ErrInvalidArgument, "DataDir"},
		{"no agent", Builder{DataDir: t.TempDir()}, good, errdefs.ErrInvalidArgument, "AgentBinary"},
		{"missing agent", Builder{DataDir: t.TempDir(), AgentBinary: "/nonexistent/forkd-agent"}, good, errdefs.ErrNotFound, "/nonexistent/forkd-agent"},
		{"script agent", Builder{DataDir: t.TempDir(), AgentBinary: script}, good, errdefs.ErrInvalidArgument, "not an ELF executable"},
		{"dynamic agent", Builder{DataDir: t.TempDir(), AgentBinary: "/bin/true"}, good, errdefs.ErrInvalidArgument, "dynamically linked"},
		{"invalid recipe in code", Builder{DataDir: t.TempDir(), AgentBinary: "/bin/true"}, &recipe.Recipe{Name: "x", Base: "nix"}, errdefs.ErrInvalidArgument, `base "nix"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.b.Build(ctx, c.r)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q lacks %q", err, c.want)
			}
			if errdefs.Code(err) != errdefs.Code(c.class) {
				t.Errorf("class %s, want %s: %v", errdefs.Code(err), errdefs.Code(c.class), err)
			}
		})
	}
}

// TestBuildUnknownPackage: a package Debian does not have is named in the
// error within seconds, before mmdebstrap starts.
func TestBuildUnknownPackage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the debian base needs root")
	}
	requireBinary(t, "mmdebstrap")
	b := newBuilder(t, newDataDir(t))
	r := mustRecipe(t, "name = \"x\"\nbase = \"debian\"\npackages = [\"python3\", \"no-such-package-forkd\"]\n")
	_, err := b.Build(context.Background(), r)
	if err == nil {
		t.Fatal("no error")
	}
	if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "no-such-package-forkd") || strings.Contains(err.Error(), "python3,") {
		t.Errorf("error = %v (class %s)", err, errdefs.Code(err))
	}
}

func TestMissingTool(t *testing.T) {
	if _, err := lookTool("definitely-not-a-tool"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("missing tool: %v", err)
	}
	for tool, pkg := range map[string]string{"mmdebstrap": "mmdebstrap", "mkfs.ext4": "e2fsprogs", "apt-get": "apt", "dpkg-deb": "dpkg"} {
		err := missingTool(tool)
		if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "apt-get install "+pkg) {
			t.Errorf("missing %s: %v does not name package %s", tool, err, pkg)
		}
	}
}
