#!/usr/bin/env bash
# make quickstart: build the py-pandas snapshot (once), fork 3 sandboxes from
# it and run pandas code in each, printing results and timings.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then
  exec sudo -E "$0" "$@"
fi
forkd=./bin/forkd
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

echo "== forkd doctor"
$forkd doctor || echo "(doctor reported problems; continuing)"

# A snapshot restores only on the QEMU release that wrote it (install-deps
# may have upgraded QEMU since it was made).
release() { sed -n 's/^\([0-9]*\.[0-9]*\).*/\1/p'; }
qemu_rel=$(qemu-system-x86_64 --version | sed -n 's/^QEMU emulator version //p' | release)
if info=$($forkd snapshot info py-pandas --json 2>/dev/null); then
  snap_rel=$(printf '%s' "$info" | python3 -c 'import json,sys; print(json.load(sys.stdin).get("vmm_version",""))' | release)
  if [ -n "$snap_rel" ] && [ "$snap_rel" != "$qemu_rel" ]; then
    echo "== snapshot py-pandas was made with QEMU $snap_rel; this host runs QEMU $qemu_rel, which cannot restore it: creating it again"
    $forkd rmi --cascade py-pandas
  else
    echo "== snapshot py-pandas exists"
  fi
fi
if ! $forkd snapshot info py-pandas >/dev/null 2>&1; then
  echo "== creating snapshot py-pandas (first time: builds the image with mmdebstrap, a few minutes)"
  $forkd snapshot create --tag py-pandas --recipe py-pandas
fi
$forkd snapshots

echo "== forking 3 sandboxes from py-pandas"
t=$(date +%s%N)
ids=$($forkd fork --tag py-pandas -n 3 --quiet)
echo "3 sandboxes answering after $(ms "$t") ms: $(echo $ids)"
echo "   (each has the internet under the default egress policy, public: never the host, other"
echo "    sandboxes or private ranges; forkd fork --network none|allow:pypi.org,... narrows it)"

code='import socket
df = pd.DataFrame({"x": np.random.randint(0, 100, 5)})
print(socket.gethostname(), "x =", df.x.tolist(), "sum =", int(df.x.sum()))
df.describe().loc[["mean", "std"]].round(2).to_dict()'
for id in $ids; do
  t=$(date +%s%N)
  $forkd run-code "$id" "$code"
  echo "   ^ run_code in $id took $(ms "$t") ms (pandas was imported before the snapshot)"
done

echo "== the same code, cold: a fresh python3 importing pandas inside one sandbox"
first=$(echo $ids | cut -d' ' -f1)
t=$(date +%s%N)
$forkd exec "$first" -- python3 -c 'import pandas; print("pandas", pandas.__version__, "imported cold")'
echo "   ^ cold import took $(ms "$t") ms"

$forkd ls
$forkd kill $ids >/dev/null
echo "== done: sandboxes killed. Try: $forkd fork --tag py-pandas -n 3; $forkd exec ID -- uname -a"
echo "   or an agent recipe: python3 recipes/agents/code_interpreter_fanout.py   (20 sandboxes analysing slices with pandas)"
echo "   SDKs: sdk/python, sdk/typescript; MCP: $forkd mcp"
