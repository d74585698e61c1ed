#!/usr/bin/env bash
# Peer comparison (issue 20): forkd's py-pandas fork against gVisor restoring
# a checkpoint of a container warmed exactly like forkd's py-pandas snapshot.
# gVisor (Debian's runsc) is what a user without KVM would pick instead.
#
#   sudo bench/peers/gvisor/run.sh [-k K] [-n N] [--platform ptrace|systrap]
#        [--compression none|flate-best-speed] [--rootfs FILE]
#        [--manifest FILE] [--json FILE] [--keep]
#
#   -k K            one-at-a-time restores (default 10)
#   -n N            restores at once (default 10)
#   --platform P    gVisor platform (default ptrace: needs no KVM, the peer issue 20 names;
#                   systrap is runsc's own default since 2023, for contrast)
#   --compression C checkpoint image compression (default none; runsc's own
#                   default, flate-best-speed, made a 18 MB image instead of
#                   67 MB but restore -> answer ~2x slower at ~2x the CPU on
#                   2026-12-04: 1.96 s vs ~0.5 s p50, 1.5 vs 0.7 CPU-s)
#   --rootfs FILE   ext4 image for the container's root (default: the
#                   "rootfs" of forkd's py-pandas snapshot manifest)
#   --manifest FILE manifest to read it and the warm-up code from (default
#                   /var/lib/forkd/snapshots/py-pandas/manifest.json)
#   --json FILE     also write the results as JSON
#   --keep          keep the work dir (checkpoint image, logs)
#
# What it does, in one run (details in bench.py):
#   1. installs Debian's runsc if missing (bookworm-backports first);
#   2. mounts the py-pandas root fs read-only (loop) and writes an OCI bundle
#      over it, with gVisor's in-memory overlay as the writable layer;
#   3. starts python3 in the container, runs forkd's warm-up code, then
#      serves requests on its stdin/stdout; checkpoints it;
#   4. measures restore -> first answer (K one at a time, N at once), CPU
#      per child, PSS per child with N running, distinct random.random();
#   5. removes every container, cgroup, mount and process it made (trap).
# Needs root (loop mount, runsc, cgroups). Sends no network traffic: the
# containers have no network (--network=none); requests go over stdio pipes.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
K=10 N=10 PLATFORM=ptrace COMPRESSION=none ROOTFS= JSON= KEEP=false
MANIFEST=/var/lib/forkd/snapshots/py-pandas/manifest.json
while [ $# -gt 0 ]; do
  case "$1" in
    -k) K=$2; shift 2 ;;
    -n) N=$2; shift 2 ;;
    --platform) PLATFORM=$2; shift 2 ;;
    --compression) COMPRESSION=$2; shift 2 ;;
    --rootfs) ROOTFS=$2; shift 2 ;;
    --manifest) MANIFEST=$2; shift 2 ;;
    --json) JSON=$2; shift 2 ;;
    --keep) KEEP=true; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "run as root (loop mount, runsc, cgroups)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "needs Debian's python3" >&2; exit 1; }

# --- 1. runsc --------------------------------------------------------------
# bookworm's runsc is 0.0~20221219; bookworm-backports has 0.0~20240729,
# the one this script was written and run with (its flags: --overlay2,
# checkpoint --compression). Prefer backports when that suite is in the apt
# sources, else take the stable one (untested).
if ! command -v runsc >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  if apt-cache policy 2>/dev/null | grep -q 'bookworm-backports'; then
    apt-get install -y -qq -t bookworm-backports runsc >&2 || apt-get install -y -qq runsc >&2
  else
    apt-get install -y -qq runsc >&2
  fi
fi
RUNSC=$(command -v runsc)

# --- 2. root fs --------------------------------------------------------------
if [ -z "$ROOTFS" ]; then
  [ -r "$MANIFEST" ] || { echo "no $MANIFEST: make the py-pandas snapshot (forkd snapshot create --tag py-pandas --recipe py-pandas) or pass --rootfs FILE" >&2; exit 1; }
  ROOTFS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["image"]["rootfs"])' "$MANIFEST")
fi
[ -r "$ROOTFS" ] || { echo "root fs image $ROOTFS not readable" >&2; exit 1; }

WORK=$(mktemp -d /var/tmp/gvisor-bench.XXXXXX)
STATE=$WORK/state          # runsc --root: this run's containers only
MNT=$WORK/rootfs
CG=                        # cgroup parent dir, named by bench.py in $WORK/cgroup
mkdir -p "$STATE" "$MNT"

# Cleanup, on success and failure alike. Every container lives under this
# run's own --root, every process under this run's own cgroup, so nothing
# else on the machine is touched.
cleanup() {
  local rc=$? id
  trap - EXIT INT TERM
  set +e
  for id in $("$RUNSC" --root="$STATE" list -quiet 2>/dev/null); do
    "$RUNSC" --root="$STATE" delete -force "$id" >/dev/null 2>&1
  done
  [ -f "$WORK/cgroup" ] && CG=$(cat "$WORK/cgroup")
  if [ -n "$CG" ] && [ -d "$CG" ]; then
    # Anything left (a runsc that hung, a sandbox whose delete failed):
    # cgroup.kill SIGKILLs every process in this run's cgroups.
    for d in $(find "$CG" -mindepth 1 -maxdepth 1 -type d); do
      [ -f "$d/cgroup.kill" ] && echo 1 >"$d/cgroup.kill" 2>/dev/null
    done
    for _ in $(seq 50); do
      [ -z "$(cat "$CG"/*/cgroup.procs 2>/dev/null)" ] && break
      sleep 0.1
    done
    find "$CG" -mindepth 1 -maxdepth 1 -type d -exec rmdir {} + 2>/dev/null
    rmdir "$CG" 2>/dev/null
  fi
  if mountpoint -q "$MNT"; then
    umount "$MNT" || umount -l "$MNT"   # -o loop mounts detach their loop device on umount
  fi
  if $KEEP; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
  exit $rc
}
PY=
trap cleanup EXIT
# On a signal, stop bench.py (it removes its containers on SIGTERM), then
# the EXIT trap removes whatever is left.
trap 'sig=130; [ -n "$PY" ] && kill -TERM "$PY" 2>/dev/null && wait "$PY"; exit $sig' INT
trap 'sig=143; [ -n "$PY" ] && kill -TERM "$PY" 2>/dev/null && wait "$PY"; exit $sig' TERM

# Read-only loop mount: the snapshot's image is shared (hard-linked) by
# forkd's image cache and must not change; gVisor's overlay (below) takes the
# writes. ~540 MB, so mounting beats copying it out.
mount -o ro,loop "$ROOTFS" "$MNT"

# --- 3-4. warm, checkpoint, measure (bench.py) -------------------------------
# runsc flags, one set for run, checkpoint and restore (restore must match):
#   --platform=ptrace      no KVM; ptrace works everywhere (see --platform)
#   --network=none         no traffic leaves anything; forkd's bench also
#                          runs its children with --network none
#   --overlay2=root:memory the root fs mount is read-only; writes go to an
#                          overlay upper layer in the sandbox's memory, which
#                          the checkpoint carries (runsc's default root:self
#                          would put its file store in the read-only mount)
#   --ignore-cgroups       runsc sets no limits of its own; bench.py puts each
#                          container in its own cgroup to count its CPU
RUNSC_FLAGS="--root=$STATE --platform=$PLATFORM --network=none --overlay2=root:memory --ignore-cgroups"
args=(--runsc "$RUNSC" "--runsc-flags=$RUNSC_FLAGS" --work "$WORK" --rootfs-dir "$MNT"
      --rootfs-image "$ROOTFS" --platform "$PLATFORM" --compression "$COMPRESSION" -k "$K" -n "$N")
[ -n "$JSON" ] && args+=(--json "$JSON")
# The warm-up code is the snapshot's own (manifest python.warm) when there is
# a manifest; bench.py has a copy of recipes/py-pandas.toml's otherwise.
[ -r "$MANIFEST" ] && args+=(--manifest "$MANIFEST")
# In the background and waited for, so that a signal reaches the traps at once.
python3 "$here/bench.py" "${args[@]}" &
PY=$!
wait "$PY"
