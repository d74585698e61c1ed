#!/usr/bin/env python3
"""Branch an agent's sandbox mid-task and explore three continuations.

An agent has done part of a task: files on disk and Python variables in its
interpreter. Unsure how to go on, it branches the running sandbox (memory,
processes, Python session, files: everything as of now), forks three
children from the branch, and lets each try a different continuation. The
recipe then compares the children's file systems (listing + SHA-256 of
each file) side by side, shows that the Python state came along into every
child, and that the source sandbox is unchanged by what the children did.

Exits non-zero if any of that did not happen.

    eval "$(scripts/sdk-test-env.sh start py)"        # or any daemon with a python3 snapshot
    python3 recipes/agents/branch_and_explore.py --tag "$FORKD_TEST_PY_TAG"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "sdk", "python"))

import forkd  # noqa: E402
from forkd import Sandbox  # noqa: E402

WORK = "/work/app"

# Run in the sandbox's Python session: {relative path: sha256} of WORK.
MANIFEST = """
import hashlib, json, os
_m = {}
for _d, _subdirs, _files in os.walk(%r):
    _subdirs.sort()
    for _f in sorted(_files):
        _p = os.path.join(_d, _f)
        with open(_p, 'rb') as _fh:
            _m[os.path.relpath(_p, %r)] = hashlib.sha256(_fh.read()).hexdigest()
print(json.dumps(_m))
""" % (WORK, WORK)

# The task so far: a small dataset on disk, parsed into variables.
SETUP = """
import csv, io, os
os.makedirs('%(w)s/data', exist_ok=True)
rows = [('widget', 3, 250), ('gadget', 5, 1200), ('doohickey', 1, 75), ('gizmo', 8, 420)]
with open('%(w)s/data/inventory.csv', 'w', newline='') as f:
    w = csv.writer(f)
    w.writerow(['item', 'qty', 'price_cents'])
    w.writerows(rows)
with open('%(w)s/NOTES.md', 'w') as f:
    f.write('# task\\nsummarise inventory value; step 1 done: data loaded\\n')
inventory = {item: (qty, price) for item, qty, price in rows}
step = 1
len(inventory)
""" % {"w": WORK}

# Three ways to go on from the branch point.
CONTINUATIONS: Dict[str, str] = {
    "report": """
# A: write a report from the variables the agent had in memory.
value = sum(q * p for q, p in inventory.values())
with open('%(w)s/report.txt', 'w') as f:
    for item, (q, p) in sorted(inventory.items()):
        f.write('%%-10s %%3d x %%6.2f\\n' %% (item, q, p / 100))
    f.write('total %%.2f\\n' %% (value / 100))
step = 2
value
""" % {"w": WORK},
    "refactor": """
# B: normalise the data: prices in dollars, rename the file, edit the notes.
import csv, os
with open('%(w)s/data/inventory.csv') as f:
    rows = list(csv.DictReader(f))
with open('%(w)s/data/inventory_usd.csv', 'w', newline='') as f:
    w = csv.writer(f)
    w.writerow(['item', 'qty', 'price_usd'])
    for r in rows:
        w.writerow([r['item'], r['qty'], '%%.2f' %% (int(r['price_cents']) / 100)])
os.remove('%(w)s/data/inventory.csv')
with open('%(w)s/NOTES.md', 'a') as f:
    f.write('step 2: prices converted to dollars\\n')
step = 2
len(rows)
""" % {"w": WORK},
    "reset": """
# C: start over: throw the data away and keep only the notes.
import shutil
shutil.rmtree('%(w)s/data')
inventory.clear()
step = 0
len(inventory)
""" % {"w": WORK},
}


def manifest(sb: Sandbox) -> Dict[str, str]:
    ex = sb.run_code(MANIFEST)
    if ex.error:
        raise RuntimeError("manifest in %s: %s: %s" % (sb.id, ex.error.name, ex.error.value))
    return json.loads(ex.logs.stdout_text)


def state(sb: Sandbox) -> str:
    return sb.run_code("(step, sorted(inventory))").text or ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", default=os.environ.get("FORKD_TEST_PY_TAG", "py-pandas"),
                    help="a snapshot with a Python session (default $FORKD_TEST_PY_TAG, else py-pandas)")
    ap.add_argument("--branch-tag", default=None, help="tag for the branch (default: generated)")
    ap.add_argument("--mode", default="diff", choices=["diff", "full", "live"], help="branch mode (default diff)")
    ap.add_argument("--keep", action="store_true", help="keep the branch snapshot afterwards")
    args = ap.parse_args()

    client = forkd.Client()
    if not client.snapshots.exists(args.tag):
        print("no snapshot %r on %s; create one with a python3 recipe, e.g.\n"
              "  forkd snapshot create --tag py-pandas --recipe py-pandas" % (args.tag, client.endpoint), file=sys.stderr)
        return 2

    problems: List[str] = []
    branch: Optional[forkd.Branch] = None
    children: List[Sandbox] = []
    src = Sandbox.create(args.tag, client=client, metadata={"recipe": "branch_and_explore"})
    try:
        # 1. The agent works: files on disk, variables in its interpreter.
        ex = src.run_code(SETUP)
        if ex.error:
            raise RuntimeError("setup failed: %s" % ex.error.traceback)
        before = manifest(src)
        src_state = state(src)
        print("agent sandbox %s (from %s): step 1 done, %d files, Python state %s"
              % (src.id, args.tag, len(before), src_state))

        # 2. Branch mid-task, then fork three children from the branch.
        t0 = time.monotonic()
        branch = src.branch(args.branch_tag, mode=args.mode)
        snap = branch.wait(timeout=300)
        print("branched into %s (%s): source paused %.1f ms, %.1f MB written, %.2fs; state %s, depth %d"
              % (branch.tag, args.mode, branch.pause_ms, branch.bytes_written / 1e6, time.monotonic() - t0,
                 snap.state, snap.depth))
        t0 = time.monotonic()
        children = Sandbox.fork(branch.tag, len(CONTINUATIONS), client=client, metadata={"recipe": "branch_and_explore"})
        print("forked %d children from %s in %.2fs" % (len(children), branch.tag, time.monotonic() - t0))

        # Every child starts exactly where the agent was.
        for ch in children:
            got = state(ch)
            if got != src_state:
                problems.append("child %s started with Python state %s, not %s" % (ch.id, got, src_state))

        # 3. Each child tries its continuation, all at once.
        names = list(CONTINUATIONS)
        outcome: Dict[str, str] = {}
        manifests: Dict[str, Dict[str, str]] = {}
        errs: List[str] = []

        def explore(name: str, ch: Sandbox) -> None:
            try:
                ex = ch.run_code(CONTINUATIONS[name])
                if ex.error:
                    errs.append("%s: %s: %s" % (name, ex.error.name, ex.error.value))
                outcome[name] = ex.text or ""
                manifests[name] = manifest(ch)
            except forkd.ForkdError as e:
                errs.append("%s: %s" % (name, e))

        threads = [threading.Thread(target=explore, args=(n, c)) for n, c in zip(names, children)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        problems.extend(errs)

        # 4. Compare: listing + hashes per sandbox; the source must be as it was.
        after = manifest(src)
        src_state_after = state(src)
        cols = ["source"] + names
        tables = {"source": after}
        tables.update(manifests)
        paths = sorted(set().union(*[set(t) for t in tables.values()]))
        print()
        print("files under %s (sha256 prefix; '=' same as the branch point, '-' absent):" % WORK)
        print("%-26s" % "path" + "".join("%-12s" % c for c in cols))
        for p in paths:
            cells = []
            for c in cols:
                h = tables.get(c, {}).get(p)
                cells.append("-" if h is None else ("=" if before.get(p) == h else h[:10]))
            print("%-26s" % p + "".join("%-12s" % x for x in cells))
        print()
        for n, ch in zip(names, children):
            print("%-9s %s: last value %s, Python state now %s" % (n, ch.id, outcome.get(n), state(ch)))
        print("source    %s: Python state now %s" % (src.id, src_state_after))

        if after != before:
            problems.append("the source's files changed: %s -> %s" % (before, after))
        if src_state_after != src_state:
            problems.append("the source's Python state changed: %s -> %s" % (src_state, src_state_after))
        if len(manifests) == len(names):
            distinct = {json.dumps(m, sort_keys=True) for m in manifests.values()}
            if len(distinct) != len(names) or any(m == before for m in manifests.values()):
                problems.append("the continuations did not each leave a different file system")
            if "report.txt" not in manifests["report"]:
                problems.append("continuation 'report' wrote no report.txt")
            if "data/inventory.csv" in manifests["refactor"] or "data/inventory_usd.csv" not in manifests["refactor"]:
                problems.append("continuation 'refactor' did not rename the data file")
            if any(p.startswith("data/") for p in manifests["reset"]):
                problems.append("continuation 'reset' left data/ behind")
    finally:
        for ch in children:
            ch.kill()
        src.kill()
        if branch is not None and not args.keep:
            try:
                client.snapshots.delete(branch.tag, cascade=True)
            except forkd.ForkdError as e:
                print("could not delete %s: %s" % (branch.tag, e), file=sys.stderr)

    print()
    if problems:
        for p in problems:
            print("PROBLEM: " + p, file=sys.stderr)
        return 1
    print("ok: three continuations from one branch point, each with the agent's Python state; the source is unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
