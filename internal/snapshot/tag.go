package snapshot

import (
	"fmt"
	"regexp"
	"strings"

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

// ReservedTagPrefix starts the tags forkd derives for snapshots that a
// fork by registry reference pulled (POST /v1/sandboxes with a reference
// for a tag): each such tag names one reference pulled for one tenant,
// so nobody may create a tag in this namespace by any other path (build,
// branch, compact, pull --tag, import, an archive's own tags), or a
// tenant could plant a snapshot another tenant's fork would run.
const ReservedTagPrefix = "ref--"

// IsReservedTag reports whether tag is in ReservedTagPrefix's namespace.
func IsReservedTag(tag string) bool { return strings.HasPrefix(tag, ReservedTagPrefix) }

// ValidateNewTag is the rule for a tag a snapshot is to be created under:
// ValidateTag, outside the reserved namespace. Every path that creates a
// tag checks it (Store.CheckFree and Stage, pack.Unpack); only a fork by
// reference creates reserved tags, through pack.UnpackOptions.ReservedTag.
func ValidateNewTag(tag string) error {
	if err := ValidateTag(tag); err != nil {
		return err
	}
	if IsReservedTag(tag) {
		return ReservedTagError(tag)
	}
	return nil
}

// ReservedTagError is the error for creating tag, a reserved one.
func ReservedTagError(tag string) error {
	return fmt.Errorf("tag %q starts with %q, which forkd reserves for snapshots pulled by a fork by registry reference (forkd fork --tag HOST/REPOSITORY:TAG); choose a tag that does not start with it: %w",
		tag, ReservedTagPrefix, errdefs.ErrInvalidArgument)
}
