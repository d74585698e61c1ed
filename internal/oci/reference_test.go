package oci

import (
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestParseReference(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	for in, want := range map[string]string{
		"localhost:5000/team/py:3.12":        "localhost:5000/team/py:3.12",
		"Registry.Example.COM/team/py:v1":    "registry.example.com/team/py:v1",
		"r.example/team/py@" + digest:        "r.example/team/py@" + digest,
		"r.example/team/py:3.12@" + digest:   "r.example/team/py@" + digest, // the digest is what is fetched
		"127.0.0.1:5000/a/b/c:x":             "127.0.0.1:5000/a/b/c:x",
		"[::1]:5000/forkd/x:base":            "[::1]:5000/forkd/x:base",
		"docker.io/library/python:3.12-slim": "docker.io/library/python:3.12-slim",
	} {
		r, err := ParseReference(in)
		if err != nil || r.String() != want {
			t.Errorf("ParseReference(%q) = %q, %v; want %q", in, r.String(), err, want)
		}
	}
	r, _ := ParseReference("r.example/team/py:3.12@" + digest)
	if r.Tag != "" || r.Digest != digest || r.Repository != "team/py" || r.Registry != "r.example" {
		t.Errorf("parts: %+v", r)
	}
	for in, says := range map[string]string{
		"team/py:3.12":           "names no registry host",
		"r.example/team/py":      "no tag or digest",
		"r.example/Team/py:1":    "reference",
		"r.example/py@sha256:12": "reference",
		"":                       "no reference",
	} {
		if _, err := ParseReference(in); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), says) {
			t.Errorf("ParseReference(%q): %v, want invalid argument saying %q", in, err, says)
		}
	}
}

func TestCheckForkSource(t *testing.T) {
	for _, ok := range []string{"py-pandas", "ref--mine-0123", "localhost:5000/forkd/x:base"} {
		if err := CheckForkSource(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	if IsReference("py-pandas") || !IsReference("localhost:5000/forkd/x:base") {
		t.Error("IsReference tells tags and references apart wrongly")
	}
	for in, says := range map[string]string{"Py Pandas": "a tag is", "host/repo:1": "registry host", "r.example/repo": "no tag or digest"} {
		if err := CheckForkSource(in); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), says) {
			t.Errorf("%q: %v, want invalid argument saying %q", in, err, says)
		}
	}
}
