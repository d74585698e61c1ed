package api

import (
	"path"
	"strings"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestValidateGuestPath(t *testing.T) {
	for _, ok := range []string{"/", "/root/data.csv", "/tmp/a b/c", "/etc/passwd"} {
		if err := ValidateGuestPath(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for p, says := range map[string]string{
		"":                              "missing path",
		"root/x":                        "relative",
		"../etc/passwd":                 "relative",
		"/root/../etc":                  `did you mean "/etc"`,
		"/root/./x":                     "not clean",
		"//x":                           "not clean",
		"/x/":                           "not clean",
		"/a\x00b":                       "NUL",
		"/" + strings.Repeat("a", 5000): "longer than",
	} {
		err := ValidateGuestPath(p)
		if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), says) {
			t.Errorf("%q: %v, want invalid argument saying %q", p, err, says)
		}
	}
}

func FuzzValidateGuestPath(f *testing.F) {
	for _, s := range []string{"/root/x", "../x", "/a/../../b", "/a//b", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if ValidateGuestPath(p) != nil {
			return
		}
		// Accepted paths are absolute, clean, and never climb.
		if !path.IsAbs(p) || path.Clean(p) != p || strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") || strings.ContainsRune(p, 0) {
			t.Fatalf("accepted unsafe path %q", p)
		}
	})
}
