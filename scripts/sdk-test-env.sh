#!/usr/bin/env bash
# A daemon for SDK and MCP client tests, with two snapshots to fork from:
#   $FORKD_TEST_TAG     minimal (busybox): exec, files, branch
#   $FORKD_TEST_PY_TAG  py-min (Debian python3, warmed session): run_code
#
#   eval "$(scripts/sdk-test-env.sh start NAME)"   # prints export lines
#   scripts/sdk-test-env.sh stop NAME
#
# Each NAME has its own data dir (/var/tmp/forkd-sdk-NAME: image builds are
# cached there), run dir and network-namespace prefix, so several can run at
# once. Needs root and `make build`. The Go integration test
# TestSDKs does the same for `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:?usage: $0 start|stop NAME}
name=${2:?usage: $0 start|stop NAME}
export FORKD_DATA_DIR=/var/tmp/forkd-sdk-$name
export FORKD_RUN_DIR=/run/forkd-sdk-$name
export FORKD_RECIPES=$PWD/recipes:$PWD/integration/testdata
export FORKD_NETNS_PREFIX=fks$(printf %s "$name" | cksum | cut -c1-3)-
export FORKD_POOL_MAX=0 # as integration/cli_test.go: no pool growth behind the tests
export FORKD_READY_TIMEOUT=5m # a busy CI machine can starve a child past 90 s
forkd=$PWD/bin/forkd
case $cmd in
start)
	mkdir -p "$FORKD_DATA_DIR" "$FORKD_RUN_DIR"
	"$forkd" daemon start >&2
	for pair in sdk-min:minimal sdk-py:py-min; do
		tag=${pair%%:*} recipe=${pair#*:}
		"$forkd" snapshot info "$tag" >/dev/null 2>&1 ||
			"$forkd" snapshot create --tag "$tag" --recipe "$recipe" >&2
	done
	echo "export FORKD_SOCKET=$FORKD_RUN_DIR/forkd.sock FORKD_TEST_TAG=sdk-min FORKD_TEST_PY_TAG=sdk-py FORKD_BIN=$forkd"
	echo "export FORKD_DATA_DIR=$FORKD_DATA_DIR FORKD_RUN_DIR=$FORKD_RUN_DIR FORKD_RECIPES=$FORKD_RECIPES FORKD_NETNS_PREFIX=$FORKD_NETNS_PREFIX"
	;;
stop)
	"$forkd" --no-autostart kill --all >&2 || true
	"$forkd" daemon stop >&2 || true
	;;
*) echo "usage: $0 start|stop NAME" >&2; exit 2 ;;
esac
