package recipe

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func repoRecipes(t *testing.T) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "recipes")
}

func TestShippedRecipesParse(t *testing.T) {
	dir := repoRecipes(t)
	names := Names([]string{dir})
	if len(names) < 2 {
		t.Fatalf("recipes found: %v", names)
	}
	for _, n := range names {
		r, err := Load(n, []string{dir})
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if r.Name != n || r.MemoryMiB == 0 || r.VCPUs == 0 || r.Digest() == "" {
			t.Fatalf("%s parsed as %+v", n, r)
		}
	}
	pp, _ := Load("py-pandas", []string{dir})
	if !pp.Python.Enabled || !strings.Contains(pp.Python.Warm, "import pandas") {
		t.Fatalf("py-pandas warm-up: %+v", pp.Python)
	}
}

func TestBadRecipes(t *testing.T) {
	for name, c := range map[string]struct{ src, says string }{
		"unknown key":        {"name='x'\nbase='busybox'\nmemroy_mib=1", "unknown keys memroy_mib"},
		"bad base":           {"name='x'\nbase='alpine'", `must be "busybox" or "debian"`},
		"busybox pkgs":       {"name='x'\nbase='busybox'\npackages=['vim']", "takes no packages"},
		"bad package":        {"name='x'\nbase='debian'\npackages=['rm -rf']", "not a Debian package name"},
		"python no py3":      {"name='x'\nbase='debian'\npackages=['busybox']\n[python]\nenabled=true", `needs "python3"`},
		"warm disabled":      {"name='x'\nbase='debian'\npackages=['python3']\n[python]\nwarm='import os'", "enabled is false"},
		"rehearse disabled":  {"name='x'\nbase='debian'\npackages=['python3']\n[python]\nrehearse='1'", "rehearse code is set but enabled is false"},
		"memory range":       {"name='x'\nbase='busybox'\nmemory_mib=8", "out of range"},
		"bad name":           {"name='X Y'\nbase='busybox'", "lowercase"},
		"malformed toml":     {"name='x", "recipe r.toml"},
		"busybox omit":       {"name='x'\nbase='busybox'\nomit=['vim']", "takes no packages or omit"},
		"bad omit":           {"name='x'\nbase='debian'\nomit=['../x']", "omit: \"../x\" is not a Debian package name"},
		"omit installed":     {"name='x'\nbase='debian'\npackages=['vim']\nomit=['vim']", "both in packages and in omit"},
		"empty warm command": {"name='x'\nbase='busybox'\nwarm=['true', ' ']", "warm[1]"},
		"warm not a list":    {"name='x'\nbase='busybox'\nwarm='true'", "recipe r.toml"},
	} {
		_, err := Parse("r.toml", []byte(c.src))
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %v, want invalid argument saying %q", name, err, c.says)
		}
	}
}

func TestRootfsKeyIgnoresWarmAndOrder(t *testing.T) {
	a, err := Parse("a", []byte("name='a'\nbase='debian'\npackages=['python3','busybox']\n[python]\nenabled=true\nwarm='import os'"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse("b", []byte("name='a'\nbase='debian'\npackages=['busybox','python3']\nmemory_mib=512\n[python]\nenabled=true\nwarm='import sys'"))
	if err != nil {
		t.Fatal(err)
	}
	if a.RootfsKey() != b.RootfsKey() {
		t.Error("root fs key depends on warm code, memory or package order")
	}
	if a.Digest() == b.Digest() {
		t.Error("recipe digest ignores a change")
	}
}

func TestRootfsKeyCoversOmit(t *testing.T) {
	parse := func(src string) *Recipe {
		t.Helper()
		r, err := Parse("r", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	plain := parse("name='a'\nbase='debian'\npackages=['busybox']")
	omitA := parse("name='a'\nbase='debian'\npackages=['busybox']\nomit=['python3-sympy','python3-pythran']")
	omitB := parse("name='a'\nbase='debian'\npackages=['busybox']\nomit=['python3-pythran','python3-sympy']")
	if plain.RootfsKey() == omitA.RootfsKey() {
		t.Error("root fs key ignores omit")
	}
	if omitA.RootfsKey() != omitB.RootfsKey() {
		t.Error("root fs key depends on the order of omit")
	}
	// A recipe without omit keeps the key it had before omit existed, so
	// cached root file systems stay valid.
	sum := sha256.Sum256([]byte("debian\nbusybox"))
	if got, want := plain.RootfsKey(), hex.EncodeToString(sum[:]); got != want {
		t.Errorf("root fs key without omit = %s, want %s (the key before omit existed)", got, want)
	}
}

func TestLoadUnknownListsKnown(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "one.toml"), []byte("name='one'\nbase='busybox'"), 0o644)
	_, err := Load("two", []string{dir})
	if !errdefs.IsNotFound(err) || !strings.Contains(err.Error(), "known: one") {
		t.Fatalf("Load(unknown) = %v", err)
	}
}

func TestRecipeCPUs(t *testing.T) {
	base := "name = \"c\"\nbase = \"busybox\"\nvcpus = 2\n"
	r, err := Parse("c.toml", []byte(base+"cpus = 0.5\n"))
	if err != nil || r.CPUs != 0.5 {
		t.Fatalf("cpus 0.5: %+v %v", r, err)
	}
	for _, bad := range []string{"cpus = 0.05\n", "cpus = 3\n", "cpus = -1\n"} {
		if _, err := Parse("c.toml", []byte(base+bad)); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "cpus") {
			t.Errorf("%q: %v, want invalid argument naming cpus", bad, err)
		}
	}
}

func TestRecipeBuildSteps(t *testing.T) {
	r, err := Parse("r.toml", []byte(`name = "app"
from = "registry.test/base:1"
run = ["make", "make install"]
files = { "/app/b" = "b", "/app/a" = "src/a" }
env = { B = "2", A = "1" }
workdir = "/app"
user = "app"
`))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range r.Steps {
		got = append(got, string(s.Kind)+" "+s.Origin)
	}
	want := `copy files["/app/a"],copy files["/app/b"],env env.A,env env.B,workdir workdir,user user,run run[0],run run[1]`
	if strings.Join(got, ",") != want {
		t.Fatalf("steps %q\nwant %q", strings.Join(got, ","), want)
	}
	for _, bad := range []string{
		"name = \"x\"\nbase = \"busybox\"\nrun = [\"true\"]\n",                    // no from
		"name = \"x\"\nfrom = \"r.test/a\"\nfiles = { \"/x\" = \"../secret\" }\n", // outside the context
		"name = \"x\"\nfrom = \"r.test/a\"\nfiles = { \"rel\" = \"a\" }\n",        // relative destination
		"name = \"x\"\nfrom = \"r.test/a\"\nenv = { \"1X\" = \"a\" }\n",           // bad name
		"name = \"x\"\nfrom = \"r.test/a\"\nuser = \"a b\"\n",                     // bad user
		"name = \"x\"\nfrom = \"r.test/a\"\nworkdir = \"app\"\n",                  // relative workdir
	} {
		if _, err := Parse("bad.toml", []byte(bad)); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
