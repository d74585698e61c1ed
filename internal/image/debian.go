package image

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/recipe"
)

// debianExcludes keeps documentation, manual pages and translations out of
// the image (dpkg path-exclude): a sandbox never reads them, and they are a
// large share of a Debian install. Copyright files stay.
var debianExcludes = []string{
	"path-exclude=/usr/share/doc/*",
	"path-include=/usr/share/doc/*/copyright",
	"path-exclude=/usr/share/man/*",
	"path-exclude=/usr/share/info/*",
	"path-exclude=/usr/share/locale/*",
	"path-exclude=/usr/share/lintian/*",
	"path-exclude=/usr/share/linda/*",
}

// debianTree installs the "debian" base in tree: mmdebstrap's essential
// variant of the host's release plus the recipe's packages, from the
// host's Debian apt sources. It needs root (mmdebstrap --mode=root creates
// files owned by other users and device nodes).
func (b *Builder) debianTree(ctx context.Context, r *recipe.Recipe, release, stage, tree string) (map[string]string, error) {
	say := progressFunc(b.Progress)
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("base %q needs root (mmdebstrap --mode=root); run the build as root: %w",
			recipe.BaseDebian, errdefs.ErrFailedPrecondition)
	}
	if err := requireTools("mmdebstrap", "unshare", "apt-cache"); err != nil {
		return nil, err
	}
	if err := checkAptLists(); err != nil {
		return nil, err
	}
	// Check the names against the host's package lists first: a typo should
	// fail in a second with its name, not after a minute of mmdebstrap.
	if len(r.Packages) > 0 {
		cands, err := aptCandidates(ctx, r.Packages...)
		if err != nil {
			return nil, err
		}
		var missing []string
		for _, p := range r.Packages {
			if _, ok := cands[p]; !ok {
				missing = append(missing, p)
			}
		}
		if len(missing) > 0 {
			return nil, fmt.Errorf("packages not available in Debian %s: %s (check the names with `apt-cache policy`): %w",
				release, strings.Join(missing, ", "), errdefs.ErrInvalidArgument)
		}
	}
	sources, err := hostDebianSources(release)
	if err != nil {
		return nil, err
	}
	// apt downloads as the _apt user when the target is reachable for it;
	// MkdirTemp made the staging directory private to root.
	if err := os.Chmod(stage, 0o755); err != nil {
		return nil, err
	}
	sourcesText := deb822Text(sources)
	if len(r.Omit) > 0 {
		// The placeholders are served from a local flat repository in the
		// staging directory; mmdebstrap's own hook bind-mounts file://
		// repositories into the tree, where dpkg runs.
		repo := filepath.Join(stage, "placeholders")
		if err := placeholderRepo(ctx, r, repo); err != nil {
			return nil, err
		}
		sourcesText += fmt.Sprintf("\nTypes: deb\nURIs: file://%s\nSuites: ./\nTrusted: yes\n", repo)
	}
	sourcesFile := filepath.Join(stage, "debian.sources")
	if err := os.WriteFile(sourcesFile, []byte(sourcesText), 0o644); err != nil {
		return nil, err
	}

	args := []string{
		// A private mount namespace: mmdebstrap mounts /proc, /sys and /dev
		// into the tree, and if it is killed those mounts die with the
		// namespace instead of staying on the host.
		"--mount", "--propagation", "private", "--",
		"mmdebstrap", "--mode=root", "--variant=essential",
		`--aptopt=APT::Install-Recommends "false"`,
	}
	if len(r.Packages) > 0 {
		args = append(args, "--include="+strings.Join(r.Packages, ","))
	}
	if len(r.Omit) > 0 {
		// Named explicitly: each placeholder's version sorts above the
		// archive's, so it is the candidate apt installs.
		args = append(args, "--hook-dir="+fileMirrorHook, "--include="+strings.Join(r.Omit, ","))
	}
	for _, e := range debianExcludes {
		args = append(args, "--dpkgopt="+e)
	}
	args = append(args, release, tree, sourcesFile)

	start := time.Now()
	say("rootfs: mmdebstrap %s (essential + %s)", release, strings.Join(r.Packages, ", "))
	if len(r.Omit) > 0 {
		say("rootfs: omitted (empty placeholders): %s", strings.Join(r.Omit, ", "))
	}
	_, err = run(ctx, command{
		name:        "unshare",
		args:        args,
		gracePeriod: 30 * time.Second,
		lines: func(line string) {
			if strings.HasPrefix(line, "I: ") || strings.HasPrefix(line, "W: ") || strings.HasPrefix(line, "E: ") {
				say("rootfs: mmdebstrap: %s", line)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("mmdebstrap %s: %w", release, err)
	}
	say("rootfs: mmdebstrap done in %s", time.Since(start).Round(100*time.Millisecond))

	if r.Python.Enabled {
		if err := checkPython(tree); err != nil {
			return nil, err
		}
	}
	installed, err := dpkgInstalled(filepath.Join(tree, "var/lib/dpkg/status"))
	if err != nil {
		return nil, err
	}
	say("rootfs: %d packages installed", len(installed))
	return installed, nil
}

// checkPython makes sure /usr/bin/python3 resolves inside the tree (it is a
// symlink to python3.X), since the agent starts the Python session with it.
func checkPython(tree string) error {
	p := "/usr/bin/python3"
	for i := 0; i < 10; i++ {
		st, err := os.Lstat(filepath.Join(tree, p))
		if err != nil {
			return fmt.Errorf("python is enabled but %s is missing from the image: %w", p, errdefs.ErrInvalidArgument)
		}
		if st.Mode()&os.ModeSymlink == 0 {
			if st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				return nil
			}
			return fmt.Errorf("%s in the image is not an executable: %w", p, errdefs.ErrInvalidArgument)
		}
		target, err := os.Readlink(filepath.Join(tree, p))
		if err != nil {
			return err
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(p), target)
		}
		p = filepath.Clean(target)
	}
	return fmt.Errorf("/usr/bin/python3 in the image is a symlink loop: %w", errdefs.ErrInvalidArgument)
}

// dpkgInstalled reads dpkg's status file: package -> version of every
// installed package.
func dpkgInstalled(statusFile string) (map[string]string, error) {
	f, err := os.Open(statusFile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	var pkg, ver, status string
	flush := func() {
		if pkg != "" && strings.HasSuffix(status, " installed") {
			out[pkg] = ver
		}
		pkg, ver, status = "", "", ""
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			flush()
			continue
		}
		if v, ok := strings.CutPrefix(line, "Package: "); ok {
			pkg = v
		} else if v, ok := strings.CutPrefix(line, "Version: "); ok {
			ver = v
		} else if v, ok := strings.CutPrefix(line, "Status: "); ok {
			status = v
		}
	}
	flush()
	return out, sc.Err()
}

// fileMirrorHook is shipped with mmdebstrap (1.1 and later).
const fileMirrorHook = "/usr/share/mmdebstrap/hooks/file-mirror-automount"

// placeholderSuffix marks the version of a placeholder package, so dpkg -l
// in the guest says what it is, and it sorts above the archive's version
// (apt then never prefers the real package over it).
const placeholderSuffix = "+forkd.omitted"

// placeholderRepo writes a flat apt repository to dir with one empty
// package per omitted package of r, named like it and versioned just above
// its candidate in the host's lists, so that versioned dependencies on it
// (">= X", "<< next upstream") still hold.
func placeholderRepo(ctx context.Context, r *recipe.Recipe, dir string) error {
	if err := requireTools("dpkg-deb"); err != nil {
		return err
	}
	if _, err := os.Stat(fileMirrorHook); err != nil {
		return fmt.Errorf("omit needs mmdebstrap's hook %s (mmdebstrap 1.1 or later; Debian 12 has it): %w",
			fileMirrorHook, errdefs.ErrFailedPrecondition)
	}
	cands, err := aptCandidates(ctx, r.Omit...)
	if err != nil {
		return err
	}
	var missing []string
	for _, p := range r.Omit {
		if _, ok := cands[p]; !ok {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("omit: packages not available in Debian: %s (omit names packages that something in packages depends on; check the names with `apt-cache policy`): %w",
			strings.Join(missing, ", "), errdefs.ErrInvalidArgument)
	}
	var index strings.Builder
	for _, p := range r.Omit {
		control := fmt.Sprintf("Package: %s\nVersion: %s%s\nArchitecture: all\nMulti-Arch: foreign\n"+
			"Maintainer: forkd <forkd@localhost>\nSection: misc\nPriority: optional\n"+
			"Description: empty placeholder for %s\n forkd recipe %q omits %s: this package only satisfies\n dependencies on it and installs no files.\n",
			p, cands[p], placeholderSuffix, p, r.Name, p)
		root := filepath.Join(dir, "src", p)
		if err := os.MkdirAll(filepath.Join(root, "DEBIAN"), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(root, "DEBIAN", "control"), []byte(control), 0o644); err != nil {
			return err
		}
		deb := p + ".deb"
		if _, err := run(ctx, command{name: "dpkg-deb", args: []string{"--root-owner-group", "--build", root, filepath.Join(dir, deb)}}); err != nil {
			return fmt.Errorf("placeholder package for %s: %w", p, err)
		}
		fi, err := fileDigest(filepath.Join(dir, deb))
		if err != nil {
			return err
		}
		fmt.Fprintf(&index, "%sFilename: ./%s\nSize: %d\nSHA256: %s\n\n", control, deb, fi.Size, fi.SHA256)
	}
	return os.WriteFile(filepath.Join(dir, "Packages"), []byte(index.String()), 0o644)
}
