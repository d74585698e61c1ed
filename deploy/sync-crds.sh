#!/bin/sh
# Copies the generated CRDs (k8s/config/crd, `go generate ./...` in k8s/)
# into the plain manifests and the Helm chart. k8s/deploytest fails when
# the copies differ from the source.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
for dst in "$root/deploy/manifests/crds" "$root/deploy/helm/forkd/crds"; do
  mkdir -p "$dst"
  rm -f "$dst"/*.yaml
  cp "$root"/k8s/config/crd/*.yaml "$dst"/
done
