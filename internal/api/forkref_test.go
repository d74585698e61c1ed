package api

import (
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/snapshot"
)

func TestRefTag(t *testing.T) {
	ref := "Registry.Example.com:5000/team/py-pandas:v1.2"
	a, b := refTag("acme", ref), refTag("other", ref)
	for _, tag := range []string{a, b, refTag("", strings.Repeat("x/", 100)+"y:z"), refTag("t", "__/_:x")} {
		if err := snapshot.ValidateTag(tag); err != nil {
			t.Errorf("refTag gave %q: %v", tag, err)
		}
	}
	if a == b || a != refTag("acme", ref) || !strings.HasPrefix(a, "registry.example.com-5000-team-py-pandas-v1.2-") {
		t.Errorf("refTag: %q and %q for two tenants; want stable, readable and distinct", a, b)
	}
}

func TestCheckForkTag(t *testing.T) {
	for _, ok := range []string{"py-pandas", "localhost:5000/forkd/x:base", "registry.example.com/a/b@sha256:" + strings.Repeat("a", 64)} {
		if err := CheckForkTag(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	if IsForkReference("py-pandas") || !IsForkReference("localhost:5000/forkd/x:base") {
		t.Error("IsForkReference tells tags and references apart wrongly")
	}
	for in, says := range map[string]string{"Py Pandas": "a tag is", "host/repo": "no tag or digest", "/x:y": "reference"} {
		if err := CheckForkTag(in); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), says) {
			t.Errorf("%q: %v, want invalid argument saying %q", in, err, says)
		}
	}
}
