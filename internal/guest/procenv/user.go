package procenv

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// User is whom a process runs as.
type User struct {
	UID, GID uint32
	Home     string // "" when the user is not in passwd
}

// Account databases LookupUser reads (variables for tests).
var (
	PasswdFile = "/etc/passwd"
	GroupFile  = "/etc/group"
)

// LookupUser resolves NAME, UID, NAME:GROUP or UID:GID as Docker's USER
// does: a name must be in /etc/passwd (a group name in /etc/group); a
// numeric UID need not be, and then runs with GID 0 unless one is given.
func LookupUser(spec string) (User, error) {
	name, group, hasGroup := strings.Cut(spec, ":")
	if name == "" || hasGroup && group == "" {
		return User{}, fmt.Errorf("user %q: want NAME, UID, NAME:GROUP or UID:GID: %w", spec, errdefs.ErrInvalidArgument)
	}
	var u User
	uid, numeric := parseID(name)
	found := false
	err := scan(PasswdFile, func(f []string) bool {
		if len(f) < 7 || !(f[0] == name || numeric && f[2] == name) {
			return false
		}
		id, ok1 := parseID(f[2])
		gid, ok2 := parseID(f[3])
		if !ok1 || !ok2 {
			return false
		}
		u, found = User{UID: id, GID: gid, Home: f[5]}, true
		return true
	})
	if err != nil {
		return User{}, err
	}
	switch {
	case !found && !numeric:
		return User{}, fmt.Errorf("user %q is not in the image's %s (add it, e.g. RUN adduser -D %s, or give a numeric UID): %w",
			name, PasswdFile, name, errdefs.ErrNotFound)
	case !found:
		u = User{UID: uid}
	}
	if hasGroup {
		gid, numeric := parseID(group)
		found := numeric
		if !numeric {
			if err := scan(GroupFile, func(f []string) bool {
				if len(f) < 3 || f[0] != group {
					return false
				}
				gid, found = parseID(f[2])
				return found
			}); err != nil {
				return User{}, err
			}
		}
		if !found {
			return User{}, fmt.Errorf("group %q is not in the image's %s: %w", group, GroupFile, errdefs.ErrNotFound)
		}
		u.GID = gid
	}
	return u, nil
}

func parseID(s string) (uint32, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}

// scan calls match with the colon-separated fields of each line of path
// until it returns true. A missing file has no lines.
func scan(path string, match func([]string) bool) error {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if match(strings.Split(sc.Text(), ":")) {
			return nil
		}
	}
	return sc.Err()
}
