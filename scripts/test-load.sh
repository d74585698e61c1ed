#!/usr/bin/env bash
# Runs `make test` while every core is kept busy by a CPU hog (one shell
# loop per core, stopped on exit, whatever happens), so that a test which
# depends on timing fails here before it fails on a busy CI machine.
#   scripts/test-load.sh [HOGS]    (default: one per core)
set -euo pipefail
cd "$(dirname "$0")/.."
hogs=${1:-$(nproc)}
pids=()
stop() { [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null || true; }
trap stop EXIT INT TERM
for _ in $(seq "$hogs"); do
  sh -c 'while :; do :; done' &
  pids+=($!)
done
echo "forkd: make test beside $hogs CPU hogs (pids ${pids[*]})" >&2
start=$(date +%s)
status=0
make test || status=$?
echo "forkd: make test under load: exit $status after $(( $(date +%s) - start )) s" >&2
exit $status
