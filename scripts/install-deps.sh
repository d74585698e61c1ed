#!/usr/bin/env bash
# Installs the Debian packages forkd needs, only those missing, and a Go
# toolchain new enough for go.mod (scripts/install-go.sh). Used by
# `make quickstart`, `make test` and CI. Needs root (apt-get).
#   --test   also what the tests need: a static busybox (the VMM driver's
#            tests boot it as a bare guest), Debian's python3-pytest, Node.js
#            and npm (the TypeScript SDK needs Node >= 20: a Node already on
#            PATH is kept), and Debian's docker-registry (distribution 2.8:
#            the registry tests start their own on a unix socket; the
#            package's own service is disabled when this script installs it),
#            and util-linux's unshare and flock (make test-k8s).
#   --bench  also what `forkd bench image-from` compares with: docker-registry,
#            skopeo and umoci (not needed by `make test`).
set -euo pipefail
for_tests=false
for_bench=false
for arg in "$@"; do
  case "$arg" in
    --test) for_tests=true ;;
    --bench) for_bench=true ;;
    *) echo "usage: $0 [--test] [--bench]" >&2; exit 2 ;;
  esac
done

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have qemu-system-x86_64 || need+=(qemu-system-x86)
have mmdebstrap || need+=(mmdebstrap)
have mkfs.ext4 || need+=(e2fsprogs)
have debugfs || need+=(e2fsprogs)
have ip || need+=(iproute2)
have cpio || need+=(cpio)
have python3 || need+=(python3)
# Kernel modules come as .ko.xz or .ko.zst (internal/image/tools.go); the
# .deb depends on both.
have xz || need+=(xz-utils)
have zstd || need+=(zstd)
if $for_tests; then
  # ldd fails on a static binary: a dynamic busybox cannot run in a guest.
  { have busybox && ! ldd "$(command -v busybox)" >/dev/null 2>&1; } || need+=(busybox-static)
  /usr/bin/python3 -c 'import pytest' 2>/dev/null || need+=(python3-pytest)
  have node || need+=(nodejs)
  have npm || need+=(npm)
  have docker-registry || need+=(docker-registry)
  # make test-k8s: unshare gives the control plane a private network
  # namespace, flock guards the cache of its binaries.
  { have unshare && have flock; } || need+=(util-linux)
fi
if $for_bench; then
  have docker-registry || need+=(docker-registry)
  have skopeo || need+=(skopeo)
  have umoci || need+=(umoci)
fi
have apt-get || { echo "forkd needs a Debian-based host with apt-get" >&2; exit 1; }

lists=$(ls /var/lib/apt/lists/ 2>/dev/null | grep -c Packages || true)
if [ "${#need[@]}" -gt 0 ] || [ "$lists" -eq 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "forkd: missing packages (${need[*]:-apt lists}); run as root: sudo $0" >&2
    exit 1
  fi
  echo "forkd: apt-get update" >&2
  apt-get update -qq
fi
if [ "${#need[@]}" -gt 0 ]; then
  # Deduplicate and install without recommends: qemu's recommends pull a GUI.
  mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
  echo "forkd: installing ${need[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # The package starts a registry on :5000, every interface, unauthenticated:
  # the tests need only the binary.
  if printf '%s\n' "${need[@]}" | grep -qx docker-registry && have systemctl; then
    systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
  fi
fi
# QEMU 8.2+ lets forkd confine VMMs further: a clone's QEMU opens the
# template's memory read-only, and takes its userfaultfd (live branches)
# from a device node in its jail instead of needing the host-wide
# vm.unprivileged_userfaultfd (docs/SECURITY.md). Debian 12 ships 7.2;
# bookworm-backports has Debian 13's 10.0. FORKD_QEMU_BACKPORTS=0 keeps 7.2.
qemu_version() { qemu-system-x86_64 --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9]*\)\.\([0-9]*\).*/\1 \2/p'; }
read -r qmaj qmin < <(qemu_version; echo 0 0) || true
codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
if [ "${FORKD_QEMU_BACKPORTS:-1}" != 0 ] && [ "$codename" = bookworm ] &&
   { [ "${qmaj:-0}" -lt 8 ] || { [ "${qmaj:-0}" -eq 8 ] && [ "${qmin:-0}" -lt 2 ]; }; }; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "forkd: QEMU ${qmaj}.${qmin} is older than 8.2; run as root to install 10.0 from bookworm-backports (or FORKD_QEMU_BACKPORTS=0)" >&2
  else
    src=/etc/apt/sources.list.d/forkd-bookworm-backports.sources
    if ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
      echo "forkd: adding Debian's bookworm-backports ($src) for QEMU 10.0" >&2
      printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' >"$src.tmp"
      mv "$src.tmp" "$src"
    fi
    apt-get update -qq
    echo "forkd: installing QEMU from bookworm-backports (installed: ${qmaj}.${qmin})" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t bookworm-backports \
      qemu-system-x86 qemu-system-data qemu-system-common >/dev/null
  fi
fi
# Go: Debian's golang is too old for this module; fetch the pinned one.
"$(dirname "$0")/install-go.sh"
for m in tun; do
  [ -e /dev/net/tun ] || modprobe "$m" 2>/dev/null || echo "forkd: /dev/net/tun missing: load the tun module (modprobe tun)" >&2
done
