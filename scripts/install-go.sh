#!/usr/bin/env bash
# Makes sure a Go toolchain at least as new as go.mod's `go` line is on the
# machine. Debian 12's own golang is 1.19, too old for this module, so when
# `go` is missing or older this fetches the official toolchain from the Go
# module proxy (the same archive `GOTOOLCHAIN=auto` uses, from
# ${GOPROXY%%,*}, default proxy.golang.org) into /usr/local/go (or
# $FORKD_GO_ROOT), checked
# against the checksum database's hash first. Needs root to install.
set -euo pipefail
cd "$(dirname "$0")/.."

root=${FORKD_GO_ROOT:-/usr/local/go}
want=$(awk '$1 == "go" { print $2; exit }' go.mod)
[ -n "$want" ] || { echo "forkd: no go line in go.mod" >&2; exit 1; }

# version_ge A B: A >= B for dotted versions (1.26.8 >= 1.26).
version_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]; }

for g in go "$root/bin/go"; do
  if command -v "$g" >/dev/null 2>&1; then
    have=$("$g" env GOVERSION 2>/dev/null | sed 's/^go//') || have=
    if [ -n "$have" ] && version_ge "$have" "$want"; then
      exit 0
    fi
  fi
done

if [ "$(id -u)" -ne 0 ]; then
  echo "forkd: needs Go >= $want (found: $(go version 2>/dev/null || echo none)); run as root to install it into $root: sudo $0" >&2
  exit 1
fi
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) echo "forkd: no Go toolchain download for $(uname -m); install Go >= $want from https://go.dev/dl/" >&2; exit 1 ;;
esac
for t in curl unzip; do
  command -v "$t" >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$t" >/dev/null
done

proxy=${GOPROXY:-https://proxy.golang.org}
proxy=${proxy%%,*}
case "$proxy" in direct|off|"") proxy=https://proxy.golang.org ;; esac
mod=golang.org/toolchain
ver=v0.0.1-go$want.linux-$arch
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "forkd: installing Go $want into $root (from $proxy)" >&2
curl -fsSL --retry 3 -o "$tmp/go.zip" "$proxy/$mod/@v/$ver.zip"

# The module's hash from the checksum database (what `go` itself checks):
# h1: is the SHA-256 of the per-file SHA-256 lines sorted by file name, which python3
# (always present on a Debian host forkd supports) computes from the zip.
# The proxy also serves the checksum database (…/sumdb/sum.golang.org/…).
sumdb=$(curl -fsSL --retry 3 "$proxy/sumdb/sum.golang.org/lookup/$mod@$ver" | awk -v m="$mod" -v v="$ver" '$1 == m && $2 == v { print $3; exit }')
got=$(python3 - "$tmp/go.zip" <<'PY'
import base64, hashlib, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = sorted(n for n in z.namelist() if not n.endswith("/"))
lines = ["%s  %s\n" % (hashlib.sha256(z.read(n)).hexdigest(), n) for n in names]
print("h1:" + base64.b64encode(hashlib.sha256("".join(lines).encode()).digest()).decode())
PY
)
if [ -z "$sumdb" ] || [ "$sumdb" != "$got" ]; then
  echo "forkd: Go toolchain hash mismatch (checksum database: ${sumdb:-unreachable}, download: $got); not installing" >&2
  exit 1
fi

unzip -q "$tmp/go.zip" -d "$tmp/x"
rm -rf "$root.new"
mv "$tmp/x/$mod@$ver" "$root.new"
chmod +x "$root.new"/bin/* "$root.new"/pkg/tool/*/* 2>/dev/null || true
if [ -d "$root" ]; then mv "$root" "$root.old.$$"; fi
mv "$root.new" "$root"
rm -rf "$root.old.$$"
"$root/bin/go" version >&2
