package qemu

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/forkd-dev/forkd/internal/errdefs"
	"github.com/forkd-dev/forkd/internal/qmp"
)

// features are what the QEMU binary can do that forkd uses when it can,
// decided once from its version. QEMU 7.2 (Debian 12) is the oldest
// supported; Debian 13 and bookworm-backports ship 10.0.
type features struct {
	// version is the binary's version ("10.0.2 (Debian …)").
	version string
	// runWith: drop privileges with -run-with user=UID:GID (9.1 added it
	// and deprecated -runas; 10.0 removed -runas).
	runWith bool
	// readonlyRAM: a clone maps the template's memory file from a
	// read-only descriptor (memory-backend-file readonly=on,rom=off,
	// 8.2+): a compromised VMM cannot write the template. 7.2 opens the
	// file read-write even for a private mapping.
	readonlyRAM bool
	// uffdDevice: QEMU gets its userfaultfd from /dev/userfaultfd when it
	// can open it (8.1+), so a live branch needs no host-wide
	// vm.unprivileged_userfaultfd: the jail gives each VMM a device node
	// of its own uid.
	uffdDevice bool
	// fileMigration: a migration file reaches QEMU as a descriptor set
	// (add-fd) named by a "file:/dev/fdset/N" URI (9.1+, which deprecated
	// "fd:" for anything but sockets and pipes); older QEMU gets it by
	// getfd and "fd:NAME" (see handover.go).
	fileMigration bool
}

// featuresOf decides the features of a version string.
func featuresOf(version string) features {
	f := features{version: version}
	at := func(major, minor int) bool {
		maj, min := versionNumbers(version)
		return maj > major || maj == major && min >= minor
	}
	f.runWith = at(9, 1)
	f.readonlyRAM = at(8, 2)
	f.uffdDevice = at(8, 1)
	f.fileMigration = at(9, 1)
	return f
}

// runningVersion asks a running QEMU its version (query-version), in the
// form of the binary's --version ("10.0.2 (Debian …)"): an adopted process
// may run another release than the binary installed now.
func runningVersion(ctx context.Context, c *qmp.Client) (string, error) {
	var v struct {
		QEMU struct {
			Major int `json:"major"`
			Minor int `json:"minor"`
			Micro int `json:"micro"`
		} `json:"qemu"`
		Package string `json:"package"`
	}
	if err := c.Execute(ctx, "query-version", nil, &v); err != nil {
		return "", err
	}
	version := fmt.Sprintf("%d.%d.%d", v.QEMU.Major, v.QEMU.Minor, v.QEMU.Micro)
	if p := strings.Trim(strings.TrimSpace(v.Package), "()"); p != "" {
		version += " (" + p + ")"
	}
	return version, nil
}

// versionNumbers returns the major and minor numbers of a version string
// (0, 0 if it does not start with them).
func versionNumbers(v string) (major, minor int) {
	f := strings.Fields(v)
	if len(f) == 0 {
		return 0, 0
	}
	parts := strings.SplitN(f[0], ".", 3)
	major, _ = strconv.Atoi(parts[0])
	if len(parts) > 1 {
		minor, _ = strconv.Atoi(parts[1])
	}
	return major, minor
}

// majorVersion returns the leading number of a version string.
func majorVersion(v string) int {
	major, _ := versionNumbers(v)
	return major
}

// CanRestore says whether this QEMU can restore a snapshot that QEMU
// version wrote. microvm has no versioned machine types, so QEMU keeps no
// promise of migration compatibility for it across releases, and indeed
// 10.0 refuses 7.2's state (its firmware block is twice the size): the
// major and minor versions must match. An unknown version on either side
// is let through (QEMU's own check then decides).
func (d *Driver) CanRestore(version string) error {
	if version == "" || d.versionErr != nil {
		return nil
	}
	wantMaj, wantMin := versionNumbers(version)
	maj, min := versionNumbers(d.version)
	if wantMaj == maj && wantMin == min {
		return nil
	}
	return fmt.Errorf("it was written by QEMU %s, and this host runs QEMU %s, which cannot restore it "+
		"(a microvm's saved state is tied to its QEMU release): create it again on this host "+
		"(forkd snapshot create --tag TAG --recipe RECIPE; branches of it too), or run QEMU %d.%d: %w",
		firstField(version), firstField(d.version), wantMaj, wantMin, errdefs.ErrFailedPrecondition)
}

func firstField(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return f[0]
	}
	return s
}
