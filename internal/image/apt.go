package image

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
)

// The builder takes every Debian package from the host's own apt
// configuration: the same mirrors, keys and release as the host, and no
// network access beyond what apt already has.

// aptListsDir is where apt keeps downloaded package indexes.
const aptListsDir = "/var/lib/apt/lists"

// checkAptLists fails with the fix when apt has no package indexes (a fresh
// container image), because apt-cache then answers "no packages found" for
// everything, which reads like a typo in a package name.
func checkAptLists() error {
	m, _ := filepath.Glob(filepath.Join(aptListsDir, "*_Packages*"))
	if len(m) == 0 {
		return fmt.Errorf("apt has no package lists in %s; run `apt-get update` first: %w",
			aptListsDir, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// aptDepends returns the packages pkg's candidate version depends on.
func aptDepends(ctx context.Context, pkg string) ([]string, error) {
	out, err := run(ctx, command{name: "apt-cache", args: []string{"depends", pkg}})
	if err != nil {
		return nil, aptLookupError(pkg, err)
	}
	var deps []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		// Alternatives are marked "|Depends:"; virtual packages are "<name>".
		line = strings.TrimPrefix(line, "|")
		if rest, ok := strings.CutPrefix(line, "Depends:"); ok {
			name := strings.TrimSpace(rest)
			if !strings.HasPrefix(name, "<") {
				deps = append(deps, name)
			}
		}
	}
	return deps, nil
}

// aptCandidates returns the candidate version of each package; a package
// apt knows no installable version of is missing from the map.
func aptCandidates(ctx context.Context, pkgs ...string) (map[string]string, error) {
	out, err := run(ctx, command{name: "apt-cache", args: append([]string{"policy"}, pkgs...)})
	if err != nil {
		return nil, aptLookupError(strings.Join(pkgs, " "), err)
	}
	res := map[string]string{}
	var cur string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if line != "" && line[0] != ' ' && strings.HasSuffix(line, ":") {
			cur = strings.TrimSuffix(line, ":")
			continue
		}
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Candidate:"); ok && cur != "" {
			if v = strings.TrimSpace(v); v != "" && v != "(none)" {
				res[cur] = v
			}
		}
	}
	return res, nil
}

// aptCandidate returns the candidate version of one package.
func aptCandidate(ctx context.Context, pkg string) (string, error) {
	c, err := aptCandidates(ctx, pkg)
	if err != nil {
		return "", err
	}
	v, ok := c[pkg]
	if !ok {
		return "", fmt.Errorf("package %s has no installable version in the host's apt sources (try `apt-get update`): %w",
			pkg, errdefs.ErrFailedPrecondition)
	}
	return v, nil
}

func aptLookupError(what string, err error) error {
	if lerr := checkAptLists(); lerr != nil {
		return lerr
	}
	return fmt.Errorf("apt-cache lookup of %s: %w", what, err)
}

// aptDownload fetches one exact package version into dir and returns the
// .deb's path. As root, apt drops to the _apt user to download, which cannot
// write to a root-owned temporary directory; APT::Sandbox::User=root keeps
// it from switching (the file is only unpacked, never installed).
func aptDownload(ctx context.Context, dir, pkg, version string) (string, error) {
	args := []string{"download", "-q"}
	if os.Geteuid() == 0 {
		args = append(args, "-o", "APT::Sandbox::User=root")
	}
	args = append(args, pkg+"="+version)
	if _, err := run(ctx, command{name: "apt-get", args: args, dir: dir}); err != nil {
		return "", fmt.Errorf("download %s %s: %w", pkg, version, err)
	}
	m, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if len(m) != 1 {
		return "", fmt.Errorf("download %s %s: expected one .deb in %s, found %d: %w", pkg, version, dir, len(m), errdefs.ErrInternal)
	}
	return m[0], nil
}

// debExtract unpacks a .deb's files (not its maintainer scripts) into dir.
func debExtract(ctx context.Context, deb, dir string) error {
	if _, err := run(ctx, command{name: "dpkg-deb", args: []string{"-x", deb, dir}}); err != nil {
		return fmt.Errorf("unpack %s: %w", filepath.Base(deb), err)
	}
	return nil
}

// hostRelease returns the host's Debian release code name (e.g. bookworm)
// from os-release. Guest root file systems are built from this release so
// that the host's apt sources serve them.
func hostRelease() (string, error) {
	for _, p := range []string{"/etc/os-release", "/usr/lib/os-release"} {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		fields := map[string]string{}
		for _, line := range strings.Split(string(data), "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
			if ok {
				fields[k] = strings.Trim(v, `"'`)
			}
		}
		if fields["ID"] != "debian" && !strings.Contains(" "+fields["ID_LIKE"]+" ", " debian ") {
			return "", fmt.Errorf("host is %q, not Debian: guest images are built from the host's Debian release: %w",
				fields["ID"], errdefs.ErrFailedPrecondition)
		}
		if c := fields["VERSION_CODENAME"]; c != "" {
			return c, nil
		}
		return "", fmt.Errorf("%s has no VERSION_CODENAME (a Debian testing/sid host without one is not supported): %w",
			p, errdefs.ErrFailedPrecondition)
	}
	return "", fmt.Errorf("no /etc/os-release: cannot tell the host's Debian release: %w", errdefs.ErrFailedPrecondition)
}
