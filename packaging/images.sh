#!/usr/bin/env bash
# Builds forkd's two container images, for deploy/ (Kubernetes), as
# docker-archive tarballs in dist/images/, without a container runtime:
#
#   forkd-$TAG.tar             $REGISTRY/forkd:$TAG, the node daemon: Debian 12
#                              (minbase), QEMU from bookworm-backports, and
#                              forkd's own .deb (`make deb`) with what it
#                              depends on; deploy/'s DaemonSet runs it
#                              privileged, as root.
#   forkd-controller-$TAG.tar  $REGISTRY/forkd-controller:$TAG, the controller
#                              (and gateway): its static binary alone, run as
#                              65532:65532.
#
# Load them where the cluster pulls from: `docker load -i FILE`,
# `kind load image-archive FILE`, `ctr -n k8s.io images import FILE`, or
# push: `make push-images REGISTRY=HOST/PATH` (packaging/push-images.sh).
#
# Run by `make images` (which passes VERSION, DEB_VERSION); needs root
# (mmdebstrap) and the Debian mirror. SOURCE_DATE_EPOCH (default: the
# commit's time) fixes every timestamp, so the controller image is
# reproducible; the daemon's follows the mirror's package versions.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "images: the daemon's root filesystem needs root (mmdebstrap --mode=root): run sudo make images" >&2; exit 1; }
VERSION=${VERSION:?VERSION is required (make images sets it)}
DEB_VERSION=${DEB_VERSION:?DEB_VERSION is required (make images sets it)}
REGISTRY=${REGISTRY:-ghcr.io/forkd-dev}
# An image tag: the version with what a tag cannot hold replaced.
TAG=${IMAGE_TAG:-$(printf '%s' "$VERSION" | tr -c 'A-Za-z0-9_.-' '-' | cut -c1-128)}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
GO=${GO:-go}
out=dist/images
mkdir -p "$out"
work=$(mktemp -d "${TMPDIR:-/tmp}/forkd-images.XXXXXX")
trap 'rm -rf "$work"' EXIT

labels=(--label "org.opencontainers.image.source=https://github.com/forkd-dev/forkd"
  --label "org.opencontainers.image.version=$VERSION"
  --label "org.opencontainers.image.revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)")
"$GO" build -o "$work/mkimage" ./packaging/mkimage

# The controller: one static binary.
(cd k8s && CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w" -o "$work/forkd-controller" ./cmd/forkd-controller)
"$work/mkimage" --out "$out/forkd-controller-$TAG.tar" --tag "$REGISTRY/forkd-controller:$TAG" \
  --file "$work/forkd-controller:/usr/bin/forkd-controller:0755" \
  --entrypoint '["/usr/bin/forkd-controller"]' --user 65532:65532 \
  --label "org.opencontainers.image.title=forkd-controller" "${labels[@]}"

# The node daemon: Debian with forkd's .deb installed by apt, so the image
# holds exactly what the package depends on. The package lists stay: the
# daemon finds the guest kernel and busybox through apt when it builds a
# recipe's image (a node that only pulls snapshots never does).
deb=dist/forkd_${DEB_VERSION}_amd64.deb
[ -f "$deb" ] || { echo "images: $deb missing: run make deb (make images does)" >&2; exit 1; }
command -v mmdebstrap >/dev/null || { echo "images: mmdebstrap missing: apt-get install mmdebstrap" >&2; exit 1; }
cp "$deb" "$work/forkd.deb"
mmdebstrap --quiet --variant=minbase --mode=root --format=tar \
  --include=ca-certificates,debian-archive-keyring \
  --customize-hook="copy-in $work/forkd.deb /tmp" \
  --customize-hook='chroot "$1" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o=Dpkg::Use-Pty=0 --no-install-recommends -t bookworm-backports /tmp/forkd.deb qemu-system-x86 qemu-system-data qemu-system-common busybox-static' \
  --customize-hook='rm -f "$1/tmp/forkd.deb" "$1"/var/cache/apt/*.bin' \
  --skip=cleanup/apt/lists \
  bookworm "$work/rootfs.tar" \
  "deb $MIRROR bookworm main" "deb $MIRROR bookworm-updates main" "deb $MIRROR bookworm-backports main"
"$work/mkimage" --out "$out/forkd-$TAG.tar" --tag "$REGISTRY/forkd:$TAG" \
  --rootfs "$work/rootfs.tar" \
  --entrypoint '["/usr/bin/forkd"]' --cmd '["serve"]' \
  --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --workdir /var/lib/forkd \
  --label "org.opencontainers.image.title=forkd" "${labels[@]}"
ls -l "$out"
