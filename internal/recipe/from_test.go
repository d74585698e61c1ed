package recipe

import (
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestFromRecipes(t *testing.T) {
	r, err := Parse("a.toml", []byte("name = \"app\"\nfrom = \"127.0.0.1:5000/team/app:v1\"\ninsecure_registry = true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r.From != "127.0.0.1:5000/team/app:v1" || !r.InsecureRegistry || r.Base != "" {
		t.Fatalf("parsed %+v", r)
	}
	other, _ := Parse("b.toml", []byte("name = \"app\"\nfrom = \"127.0.0.1:5000/team/app:v2\"\n"))
	if r.RootfsKey() == other.RootfsKey() {
		t.Error("two references share a rootfs key")
	}
	for _, tc := range []struct{ src, want string }{
		{"name = \"x\"\nfrom = \"alpine\"\nbase = \"busybox\"\n", "not both"},
		{"name = \"x\"\nfrom = \"alpine\"\npackages = [\"curl\"]\n", "no packages"},
		{"name = \"x\"\nfrom = \"not a ref\"\n", "not an image reference"},
		{"name = \"x\"\nbase = \"busybox\"\ninsecure_registry = true\n", "from is not"},
		{"name = \"x\"\n", "set base"},
	} {
		if _, err := Parse("t.toml", []byte(tc.src)); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want %q", tc.src, err, tc.want)
		}
	}
}

func TestFromRef(t *testing.T) {
	for ref, name := range map[string]string{
		"docker.io/library/python:3.12-slim":                             "python-3-12-slim",
		"127.0.0.1:5000/forkd/busybox@sha256:" + strings.Repeat("a", 64): "busybox",
		"registry/" + strings.Repeat("Long_Name", 6):                     "long-namelong-namelong-namelong",
	} {
		r, err := FromRef(ref, false)
		if err != nil {
			t.Fatalf("%s: %v", ref, err)
		}
		if r.Name != name || r.From != ref || r.InsecureRegistry {
			t.Errorf("FromRef(%q) = name %q from %q", ref, r.Name, r.From)
		}
	}
	r, err := FromRef("127.0.0.1:5000/x", true)
	if err != nil || !r.InsecureRegistry {
		t.Fatalf("insecure: %+v %v", r, err)
	}
	if _, err := FromRef("bad ref", false); !errdefs.IsInvalidArgument(err) {
		t.Fatalf("bad ref: %v", err)
	}
}
