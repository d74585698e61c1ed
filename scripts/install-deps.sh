#!/usr/bin/env bash
# Installs the Debian packages forkd needs, only those missing, and a Go
# toolchain new enough for go.mod (scripts/install-go.sh). Used by
# `make quickstart`, `make test` and CI. Needs root (apt-get).
#   --test   also what the tests need: a static busybox (the VMM driver's
#            tests boot it as a bare guest), Debian's python3-pytest, Node.js
#            and npm (the TypeScript SDK needs Node >= 20: a Node already on
#            PATH is kept).
set -euo pipefail
for_tests=false
[ "${1:-}" = --test ] && for_tests=true

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have qemu-system-x86_64 || need+=(qemu-system-x86)
have mmdebstrap || need+=(mmdebstrap)
have mkfs.ext4 || need+=(e2fsprogs)
have debugfs || need+=(e2fsprogs)
have ip || need+=(iproute2)
have cpio || need+=(cpio)
have python3 || need+=(python3)
if $for_tests; then
  # ldd fails on a static binary: a dynamic busybox cannot run in a guest.
  { have busybox && ! ldd "$(command -v busybox)" >/dev/null 2>&1; } || need+=(busybox-static)
  /usr/bin/python3 -c 'import pytest' 2>/dev/null || need+=(python3-pytest)
  have node || need+=(nodejs)
  have npm || need+=(npm)
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
fi
# Go: Debian's golang is too old for this module; fetch the pinned one.
"$(dirname "$0")/install-go.sh"
for m in tun; do
  [ -e /dev/net/tun ] || modprobe "$m" 2>/dev/null || echo "forkd: /dev/net/tun missing: load the tun module (modprobe tun)" >&2
done
