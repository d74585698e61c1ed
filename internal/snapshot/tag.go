package snapshot

import (
	"fmt"
	"regexp"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// TagRule is the one rule for snapshot tags, stated the way errors quote it.
// Tags name directories and appear in URLs, so they are restricted to a set
// that is safe in both without escaping.
const TagRule = "a tag is 1-64 characters: lowercase letters, digits, '.', '_' or '-', starting with a letter or digit (e.g. py-pandas, eval.v2)"

var tagPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`)

// ValidateTag enforces TagRule. Every entry point (CLI, API, store) calls it.
func ValidateTag(tag string) error {
	if !tagPattern.MatchString(tag) {
		return fmt.Errorf("invalid tag %q: %s: %w", tag, TagRule, errdefs.ErrInvalidArgument)
	}
	return nil
}
