#!/usr/bin/env bash
# Pushes the two images `make images` wrote to dist/images/ to $REGISTRY
# (forkd:$TAG and forkd-controller:$TAG), by digest what was built and
# tested, with the docker configuration's credentials (`docker login
# REGISTRY` first). Prints each image's REF@DIGEST, for deploy/'s
# image: fields.
#
#   make push-images REGISTRY=registry.example.com/forkd [IMAGE_TAG=1.2.3]
#
# INSECURE=1 speaks HTTP to a registry other than localhost (a lab
# registry); layers the registry holds already are not sent again.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${VERSION:?VERSION is required (make push-images sets it)}
REGISTRY=${REGISTRY:?REGISTRY is required: make push-images REGISTRY=HOST/PATH}
TAG=${IMAGE_TAG:-$(printf '%s' "$VERSION" | tr -c 'A-Za-z0-9_.-' '-' | cut -c1-128)}
GO=${GO:-go}
flags=()
[ "${INSECURE:-}" = 1 ] && flags=(--insecure)
work=$(mktemp -d "${TMPDIR:-/tmp}/forkd-push.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$GO" build -o "$work/mkimage" ./packaging/mkimage
for name in forkd forkd-controller; do
  archive=dist/images/$name-$TAG.tar
  [ -f "$archive" ] || { echo "push-images: $archive missing: run make images (IMAGE_TAG=$TAG)" >&2; exit 1; }
  "$work/mkimage" push "${flags[@]}" "$archive" "$REGISTRY/$name:$TAG"
done
