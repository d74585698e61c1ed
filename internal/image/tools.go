package image

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/tailbuf"
)

// Tool is a host command the image builder runs, with the Debian package
// that provides it.
type Tool struct {
	Name    string // the command, e.g. "mkfs.ext4"
	Package string // the Debian package, e.g. "e2fsprogs"
	Why     string // what the builder uses it for, for `forkd doctor`
}

// tools names every host command the builder runs, so that a missing one
// fails with its fix rather than with "executable file not found", and so
// that `forkd doctor` checks the same list. (The initramfs is written by
// internal/image/cpio, not by a host cpio.)
var tools = []Tool{
	{"apt-cache", "apt", "finds the guest kernel and package versions"},
	{"apt-get", "apt", "downloads the guest kernel and packages"},
	{"dpkg-deb", "dpkg", "unpacks the kernel and busybox .deb files"},
	{"mkfs.ext4", "e2fsprogs", "builds the read-only root file system"},
	{"mmdebstrap", "mmdebstrap", "builds Debian root file systems (recipes with base = \"debian\")"},
	{"unshare", "util-linux", "runs mmdebstrap in a private mount namespace"},
	{"xz", "xz-utils", "decompresses kernel modules (.ko.xz)"},
	{"zstd", "zstd", "decompresses kernel modules (.ko.zst)"},
}

// Tools returns the host commands the builder runs, sorted by name.
func Tools() []Tool { return append([]Tool(nil), tools...) }

// LookTool finds a host command as the builder does and, for a missing one,
// returns an error naming the Debian package to install.
func LookTool(name string) (string, error) { return lookTool(name) }

// lookTool finds a host command. The sbin directories are searched too:
// mkfs.ext4 lives in /usr/sbin, which is not on a non-root user's PATH.
func lookTool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/bin", "/bin"} {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", missingTool(name)
}

// missingTool says which Debian package provides a missing command.
func missingTool(name string) error {
	pkg := name
	for _, t := range tools {
		if t.Name == name {
			pkg = t.Package
		}
	}
	return fmt.Errorf("%s not found on this host; install the Debian package %q (apt-get install %s): %w",
		name, pkg, pkg, errdefs.ErrFailedPrecondition)
}

// GuestKernel says which guest kernel the next image build uses, without
// fetching anything: the one cached under dataDir/cache/kernel, or else the
// cloud kernel package apt would download. An error says why neither is
// available, with its fix. It is `forkd doctor`'s kernel check.
func GuestKernel(ctx context.Context, dataDir string) (string, error) {
	kdir := filepath.Join(dataDir, "cache", "kernel")
	if k, err := loadCurrentKernel(kdir); err == nil {
		return fmt.Sprintf("%s cached (%s %s) in %s", k.Version, k.Package, k.PackageVersion, k.Dir), nil
	}
	pkg, ver, err := kernelCandidate(ctx)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("none cached in %s; the first image build downloads %s %s", kdir, pkg, ver), nil
}

// kernelCandidate returns the versioned cloud kernel package that Debian's
// meta package currently depends on, and apt's candidate version of it: what
// fetchKernel downloads into an empty cache.
func kernelCandidate(ctx context.Context) (pkg, version string, err error) {
	if err := requireTools("apt-cache"); err != nil {
		return "", "", err
	}
	if err := checkAptLists(); err != nil {
		return "", "", err
	}
	meta, err := kernelMetaPackage()
	if err != nil {
		return "", "", err
	}
	deps, err := aptDepends(ctx, meta)
	if err != nil {
		return "", "", err
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "linux-image-") && d != meta {
			pkg = d
			break
		}
	}
	if pkg == "" {
		return "", "", fmt.Errorf("apt knows no kernel package behind %s (apt-cache depends: %v); run `apt-get update` with Debian's main archive in the apt sources: %w",
			meta, deps, errdefs.ErrFailedPrecondition)
	}
	version, err = aptCandidate(ctx, pkg)
	if err != nil {
		return "", "", err
	}
	return pkg, version, nil
}

// requireTools checks several commands at once, before any slow work starts.
func requireTools(names ...string) error {
	var errs []error
	for _, n := range names {
		if _, err := lookTool(n); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// command describes one host command run by the builder.
type command struct {
	name string
	args []string
	dir  string
	// lines, when set, receives each line the command writes to stderr as it
	// arrives (mmdebstrap reports its progress there).
	lines func(string)
	// gracePeriod is how long a command may take to clean up after SIGTERM
	// when ctx ends before it is killed; mmdebstrap unmounts what it mounted.
	gracePeriod time.Duration
}

// run executes c and returns its stdout. A failure carries the command line
// and the tail of stderr, since that is where apt, dpkg and mke2fs explain
// themselves. The environment pins the C locale so output can be parsed.
func run(ctx context.Context, c command) ([]byte, error) {
	path, err := lookTool(c.name)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, path, c.args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C", "DEBIAN_FRONTEND=noninteractive")
	if c.gracePeriod > 0 {
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		cmd.WaitDelay = c.gracePeriod
	}
	var stdout bytes.Buffer
	stderr := tailbuf.New(4096)
	cmd.Stdout = &stdout
	var pw *io.PipeWriter
	var scanDone chan struct{}
	if c.lines != nil {
		var pr *io.PipeReader
		pr, pw = io.Pipe()
		cmd.Stderr = io.MultiWriter(stderr, pw)
		scanDone = make(chan struct{})
		go func() {
			defer close(scanDone)
			sc := bufio.NewScanner(pr)
			sc.Buffer(make([]byte, 64*1024), 1024*1024)
			for sc.Scan() {
				c.lines(sc.Text())
			}
			io.Copy(io.Discard, pr)
		}()
	} else {
		cmd.Stderr = stderr
	}
	err = cmd.Run()
	if pw != nil {
		pw.Close()
		<-scanDone
	}
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("%s: %w", c.name, ctxErrClass(ctxErr))
		}
		msg := stderr.String()
		if msg == "" {
			msg = strings.TrimSpace(stdout.String())
		}
		return stdout.Bytes(), &commandError{line: c.name + " " + strings.Join(c.args, " "), err: err, stderr: msg}
	}
	return stdout.Bytes(), nil
}

// commandError is a host command that failed; Error quotes its stderr.
type commandError struct {
	line   string
	err    error
	stderr string
}

func (e *commandError) Error() string {
	line := e.line
	if len(line) > 300 {
		line = line[:300] + "..."
	}
	return fmt.Sprintf("%s: %v: %s", line, e.err, e.stderr)
}

// Unwrap classifies a failed host command as internal: callers that know
// better (a missing package is the recipe's fault) wrap it differently.
func (e *commandError) Unwrap() error { return errdefs.ErrInternal }

// ctxErrClass maps a context error onto the errdefs classes.
func ctxErrClass(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%v: %w", err, errdefs.ErrDeadlineExceeded)
	}
	return fmt.Errorf("%v: %w", err, errdefs.ErrCanceled)
}
