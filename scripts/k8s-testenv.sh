#!/usr/bin/env bash
# etcd and kube-apiserver for the tests under test/k8s (controller-runtime's
# envtest), built from the Go module proxy at the versions pinned in
# test/k8s/go.mod. No download besides Go modules; see docs/KUBERNETES.md.
#
#   export KUBEBUILDER_ASSETS=$(scripts/k8s-testenv.sh)   # build or reuse; prints the dir
#   scripts/k8s-testenv.sh pin v1.37.3                    # move test/k8s to another release
#
# Binaries are cached in $FORKD_K8S_CACHE (default $XDG_CACHE_HOME/forkd/k8s,
# else ~/.cache/forkd/k8s), one directory per kube-apiserver, etcd and Go
# version and set of modules they link, so a cached pair is reused until one
# of them changes (a change to the build flags below does not change the
# key: remove the cache directory then). The builds are reproducible: a
# cold build gives the same bytes as the cached pair.
# A cold build takes about 12 minutes on 2 cores (17 with other jobs
# running); with the Go build cache warm a rebuild takes about 15 seconds.
# Concurrent callers wait on one lock.
set -euo pipefail
cd "$(dirname "$0")/../test/k8s"
export PATH=/usr/local/go/bin:$PATH
GO=${GO:-go}

# pin VERSION: require k8s.io/kubernetes VERSION, point each staging module it
# replaces with ./staging/... at the published v0.MINOR.PATCH of the same
# release, and build the etcd that release requires.
pin() {
	local kv=${1:?usage: $0 pin v1.MINOR.PATCH} mod m sv
	sv=v0.${kv#v1.}
	mod=$($GO mod download -json "k8s.io/kubernetes@$kv" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
	[ -f "$mod" ] || { echo "k8s.io/kubernetes@$kv: no go.mod from the module proxy" >&2; exit 1; }
	$GO mod edit -require="k8s.io/kubernetes@$kv" \
		-require="go.etcd.io/etcd/server/v3@$(awk '$1 == "go.etcd.io/etcd/server/v3" {print $2}' "$mod")"
	for m in $(grep -oP '^\tk8s.io/\S+(?= => ./staging/)' "$mod"); do
		if $GO list -m "$m@$sv" >/dev/null 2>&1; then
			$GO mod edit -replace="$m=$m@$sv"
		else # sample-controller, sample-cli-plugin: not published, not needed
			$GO mod edit -dropreplace="$m"
			echo "$m@$sv is not on the module proxy; left unreplaced" >&2
		fi
	done
	$GO mod tidy
}

build() {
	local k8s etcd gov key root dir tmp major minor ld
	k8s=$($GO list -m -f '{{.Version}}' k8s.io/kubernetes)
	etcd=$($GO list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
	gov=$($GO env GOVERSION)
	# The key is every module (and replacement) compiled into the two
	# binaries, so a change elsewhere in go.mod (a test's new dependency)
	# keeps the cached pair, and any change to what they link rebuilds it.
	key=$($GO list -deps -f '{{with .Module}}{{.Path}} {{.Version}}{{with .Replace}} => {{.Path}} {{.Version}}{{end}}{{end}}' \
		k8s.io/kubernetes/cmd/kube-apiserver go.etcd.io/etcd/server/v3 | sort -u | sha256sum | cut -c1-12)
	root=${FORKD_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/forkd/k8s}
	dir=$root/kube-apiserver-$k8s-etcd-$etcd-$gov-$key
	if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ]; then
		echo "$dir"
		return
	fi
	mkdir -p "$root"
	exec 9>"$root/.lock"
	flock 9
	if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ]; then # built while we waited
		echo "$dir"
		return
	fi
	tmp=$(mktemp -d "$root/.build.XXXXXX")
	chmod 755 "$tmp" # mktemp makes it 0700; others may share the cache
	trap 'rm -rf "$tmp"' EXIT
	major=${k8s#v}
	major=${major%%.*}
	minor=${k8s#v*.}
	minor=${minor%%.*}
	# What hack/lib/version.sh stamps, so /version and clients see the release.
	ld="-s -w"
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld="$ld -X $p.gitVersion=$k8s -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
	done
	echo "building kube-apiserver $k8s and etcd $etcd with $gov into $dir (cold: about 12 min on 2 cores)" >&2
	SECONDS=0
	$GO build -trimpath -ldflags "$ld" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
	$GO build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
	"$tmp/kube-apiserver" --version >&2
	"$tmp/etcd" --version | head -1 >&2
	sync "$tmp/kube-apiserver" "$tmp/etcd"
	rm -rf "$dir"
	mv "$tmp" "$dir"
	trap - EXIT
	echo "built in ${SECONDS}s" >&2
	echo "$dir"
}

case ${1:-} in
"") build ;;
pin) pin "${2:-}" ;;
*) echo "usage: $0 [pin v1.MINOR.PATCH]" >&2; exit 2 ;;
esac
