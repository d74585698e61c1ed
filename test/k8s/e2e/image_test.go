package e2e_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// NodeImageEnv names a docker-archive of the node daemon's container
// image (make images: dist/images/forkd-TAG.tar). When it is set, every
// daemon runs from that image's root filesystem as its DaemonSet pod runs
// it (deploy/manifests/30-node.yaml: privileged, hostPID), instead of
// bin/forkd: in a mount namespace of its own, chrooted into the image,
// with the host's /dev, /proc and /sys and its data, run and credentials
// directories bound in. The snapshot is then built by the image's own
// tools, so a missing runtime dependency fails the test.
const NodeImageEnv = "FORKD_E2E_NODE_IMAGE"

// containerScript is what the container runtime does for the daemon's
// container: $1 the root filesystem, $2 how many host directories follow
// to bind at the same paths; then the command, run chrooted.
const containerScript = `set -eu
R=$1; n=$2; shift 2
mount --bind "$R" "$R" # a container's root is a mount point (forkd's VMM jail remounts it private)
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
mount --rbind /sys "$R/sys"
while [ "$n" -gt 0 ]; do mkdir -p "$R$1"; mount --bind "$1" "$R$1"; shift; n=$((n-1)); done
exec chroot "$R" "$@"`

// daemonCommand is the command that runs `forkd ARGS` for node n in its
// network namespace: bin/forkd, or the image's forkd (NodeImageEnv) with
// binds bound in.
func daemonCommand(t *testing.T, n *node, binds []string, args ...string) *exec.Cmd {
	t.Helper()
	archive := os.Getenv(NodeImageEnv)
	if archive == "" {
		return exec.Command("nsenter", append([]string{"--net=" + n.netns, "--", n.forkd}, args...)...)
	}
	rootfs := nodeImageRootFS(t, archive)
	argv := []string{"--net=" + n.netns, "--", "unshare", "--mount", "--propagation", "private", "--",
		"/bin/sh", "-c", containerScript, "sh", rootfs, strconv.Itoa(len(binds))}
	argv = append(argv, binds...)
	argv = append(argv, "/usr/bin/forkd")
	return exec.Command("nsenter", append(argv, args...)...)
}

var nodeImage struct {
	once   sync.Once
	rootfs string
	err    error
}

// nodeImageRootFS unpacks the image's layers, in order, into a directory
// under /var/tmp, once per test binary; it is removed when the test that
// unpacked it ends, after its daemons (whose cleanups come later, so run
// first).
func nodeImageRootFS(t *testing.T, archive string) string {
	t.Helper()
	nodeImage.once.Do(func() {
		nodeImage.rootfs, nodeImage.err = unpackArchive(archive)
		t.Cleanup(func() {
			if err := removeNodeImage(); err != nil {
				t.Error(err)
			}
		})
	})
	if nodeImage.err != nil {
		t.Fatalf("%s=%s: %v", NodeImageEnv, archive, nodeImage.err)
	}
	return nodeImage.rootfs
}

// unpackArchive lays a docker-archive's one image out as a directory.
func unpackArchive(archive string) (string, error) {
	work, err := os.MkdirTemp("/var/tmp", "forkd-e2e-archive-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	if out, err := exec.Command("tar", "-xf", archive, "-C", work).CombinedOutput(); err != nil {
		return "", fmt.Errorf("unpack the archive: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(work, "manifest.json"))
	if err != nil {
		return "", fmt.Errorf("not a docker-archive (make images writes one): %w", err)
	}
	var manifest []struct {
		Layers []string
	}
	if err := json.Unmarshal(b, &manifest); err != nil || len(manifest) != 1 || len(manifest[0].Layers) == 0 {
		return "", fmt.Errorf("manifest.json: want one image with layers, got %d images (%v)", len(manifest), err)
	}
	rootfs, err := os.MkdirTemp("/var/tmp", "forkd-e2e-rootfs-")
	if err != nil {
		return "", err
	}
	for _, l := range manifest[0].Layers {
		if !filepath.IsLocal(l) {
			return rootfs, fmt.Errorf("manifest.json: layer %q is not inside the archive", l)
		}
		// GNU tar, as root: owners, modes and device nodes as packed.
		if out, err := exec.Command("tar", "--numeric-owner", "-xf", filepath.Join(work, l), "-C", rootfs).CombinedOutput(); err != nil {
			return rootfs, fmt.Errorf("unpack layer %s: %v\n%s", l, err, out)
		}
	}
	return rootfs, nil
}

// removeNodeImage removes the unpacked image, unless something is still
// mounted under it (then removing would reach into the host's /dev or
// /sys): the daemons' mount namespaces end with them, so nothing should be.
func removeNodeImage() error {
	dir := nodeImage.rootfs
	if dir == "" {
		return nil
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			return fmt.Errorf("%s is still mounted under the unpacked node image; left %s in place", fields[4], dir)
		}
	}
	return os.RemoveAll(dir)
}
