package recipe

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// refRule is a loose check of an image reference; the builder parses it
// for real when it pulls.
var refRule = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$`)

// validateFrom checks a recipe that starts from an image.
func (r *Recipe) validateFrom() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf(format+": %w", append(a, errdefs.ErrInvalidArgument)...)
	}
	if r.Base != "" {
		return bad("from = %q and base = %q: a recipe starts from an image or from a base, not both; remove one", r.From, r.Base)
	}
	if len(r.From) > 512 || !refRule.MatchString(r.From) {
		return bad("from %q is not an image reference (REGISTRY/REPOSITORY[:TAG|@sha256:DIGEST])", r.From)
	}
	if len(r.Packages) > 0 || len(r.Omit) > 0 {
		return bad("from takes no packages or omit (they are Debian packages for base = %q)", BaseDebian)
	}
	return nil
}

// FromRef returns the recipe of `forkd image build --from REF`: the
// image's root file system with forkd's defaults, named after the image's
// repository (docker.io/library/python:3.12 -> "python-3-12").
func FromRef(ref string, insecureRegistry bool) (*Recipe, error) {
	var src strings.Builder
	src.WriteString("# forkd image build --from\n")
	toml.NewEncoder(&src).Encode(struct {
		Name             string `toml:"name"`
		From             string `toml:"from"`
		InsecureRegistry bool   `toml:"insecure_registry,omitempty"`
	}{nameOfRef(ref), ref, insecureRegistry})
	return Parse("--from "+ref, []byte(src.String()))
}

// nameOfRef makes a recipe name of an image reference's last path
// component and tag.
func nameOfRef(ref string) string {
	s := ref
	if i := strings.LastIndex(s, "/"); i >= 0 {
		s = s[i+1:]
	}
	s, _, _ = strings.Cut(s, "@")
	var b strings.Builder
	for _, c := range strings.ToLower(s) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			b.WriteRune(c)
		} else {
			b.WriteByte('-')
		}
	}
	n := strings.Trim(b.String(), "-")
	if len(n) > 32 {
		n = strings.TrimRight(n[:32], "-")
	}
	if n == "" {
		return "image"
	}
	return n
}
