package api

import (
	"fmt"
	"path"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// maxGuestPath bounds a guest path (Linux's PATH_MAX).
const maxGuestPath = 4096

// ValidateGuestPath accepts an absolute, clean path inside the sandbox:
// no "..", ".", empty or repeated separators, no NUL. Such a path cannot be
// read as relative to anything, and it never names the daemon host: file
// operations happen in the guest, by the agent. The error says what to
// send instead.
func ValidateGuestPath(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("missing path (an absolute path inside the sandbox, e.g. /root/data.csv): %w", errdefs.ErrInvalidArgument)
	case len(p) > maxGuestPath:
		return fmt.Errorf("path is %d bytes, longer than %d: %w", len(p), maxGuestPath, errdefs.ErrInvalidArgument)
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("path %q contains a NUL byte: %w", p, errdefs.ErrInvalidArgument)
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("path %q is relative: send an absolute path inside the sandbox, e.g. /root/%s: %w", p, p, errdefs.ErrInvalidArgument)
	case path.Clean(p) != p:
		return fmt.Errorf("path %q is not clean (no '..', '.', or repeated '/'); did you mean %q?: %w", p, path.Clean(p), errdefs.ErrInvalidArgument)
	}
	return nil
}
