#!/bin/bash
# Runs forkd as packaging/forkd.service's file-system settings would, without
# systemd: in a mount namespace of its own (slave of the host's) where every
# mount but the API file systems (/proc, /sys, /dev) is read-only except RW
# (the unit's StateDirectory, RuntimeDirectory and ReadWritePaths), /tmp and
# /var/tmp are private (PrivateTmp) and /root and /home empty (ProtectHome).
# There it builds an image, creates a snapshot, forks and execs.
# Env: FORKD (the binary), DATA, RUN, RW (space-separated), PREFIX, RECIPE.
set -euo pipefail
mkdir -p $RW
exec unshare --mount --propagation slave bash -euo pipefail -c '
for p in $RW; do mount --bind "$p" "$p"; done
findmnt -rno TARGET | sort -u | while read -r m; do
	case " $RW " in *" $m "*) continue ;; esac
	case "$m" in /proc | /proc/* | /sys | /sys/* | /dev | /dev/*) continue ;; esac
	mount -o remount,bind,ro "$m" 2>/dev/null || true
done
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /var/tmp
mount -t tmpfs -o ro tmpfs /root
mount -t tmpfs -o ro tmpfs /home
if touch /usr/.forkd-unit-fs-probe 2>/dev/null; then
	echo "the simulation is broken: /usr is writable" >&2
	exit 1
fi
cd /
f() { "$FORKD" --data-dir "$DATA" --run-dir "$RUN" --no-autostart "$@"; }
"$FORKD" serve --data-dir "$DATA" --run-dir "$RUN" --netns-prefix "$PREFIX" --pool 1 --network none >"$RUN/serve.log" 2>&1 &
trap "f kill --all >/dev/null 2>&1; kill $! 2>/dev/null; wait" EXIT
until f daemon status >/dev/null 2>&1; do
	kill -0 $! 2>/dev/null || { cat "$RUN/serve.log" >&2; exit 1; }
	sleep 0.1
done
f --progress none image build "$RECIPE"
f --progress none snapshot create --tag unit-fs --recipe "$RECIPE"
id=$(f fork --tag unit-fs --json | python3 -c "import json, sys; print(json.load(sys.stdin)[\"sandboxes\"][0][\"id\"])")
f exec "$id" -- echo hello from a read-only system
f kill "$id" >/dev/null
f rmi unit-fs >/dev/null
'
