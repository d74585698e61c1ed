package procenv

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

func TestLookupUser(t *testing.T) {
	dir := t.TempDir()
	pw, gr := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	os.WriteFile(pw, []byte("root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001:app:/home/app:/bin/sh\n"), 0o644)
	os.WriteFile(gr, []byte("root:x:0:\nstaff:x:50:\n"), 0o644)
	oldP, oldG := PasswdFile, GroupFile
	PasswdFile, GroupFile = pw, gr
	t.Cleanup(func() { PasswdFile, GroupFile = oldP, oldG })
	for spec, want := range map[string]User{
		"app":       {UID: 1000, GID: 1001, Home: "/home/app"},
		"1000":      {UID: 1000, GID: 1001, Home: "/home/app"},
		"app:staff": {UID: 1000, GID: 50, Home: "/home/app"},
		"4242":      {UID: 4242},
		"4242:7":    {UID: 4242, GID: 7},
	} {
		got, err := LookupUser(spec)
		if err != nil || got != want {
			t.Errorf("LookupUser(%q) = %+v, %v; want %+v", spec, got, err, want)
		}
	}
	if _, err := LookupUser("nobody-here"); !errdefs.IsNotFound(err) {
		t.Errorf("an unknown name: %v", err)
	}
	if _, err := LookupUser("app:nogroup"); !errdefs.IsNotFound(err) {
		t.Errorf("an unknown group: %v", err)
	}
	if _, err := LookupUser("app:"); !errdefs.IsInvalidArgument(err) {
		t.Errorf("an empty group: %v", err)
	}
}
