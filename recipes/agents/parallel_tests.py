#!/usr/bin/env python3
"""Run a repository's tests in parallel, one subset per forked sandbox.

An agent that changed code wants the test suite's verdict fast. This
recipe copies a small repository (./sample_repo: a package with unittest
tests) into N sandboxes forked from one Python snapshot, runs a different
subset of (test module, environment) jobs in each at the same time, and
prints per-child pass/fail and the total time.

One test module depends on $CALC_BACKEND: with "fast" one of its tests
fails on purpose (float rounding), so the matrix shows children with
different outcomes. The recipe exits 0 only when exactly that job failed
and every other job passed.

    eval "$(scripts/sdk-test-env.sh start py)"        # or any daemon with a python3 snapshot
    python3 recipes/agents/parallel_tests.py --tag "$FORKD_TEST_PY_TAG"
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
import tarfile
import threading
import time
from typing import Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "sdk", "python"))

import forkd  # noqa: E402
from forkd import Sandbox  # noqa: E402

REPO = os.path.join(HERE, "sample_repo")
BACKENDS = ("exact", "fast")
# The one job expected to fail: the float backend's exact-equality test.
EXPECTED_FAILURES = {("tests.test_backend", "fast")}

Job = Tuple[str, str]  # (test module, CALC_BACKEND)


def repo_tarball(root: str) -> bytes:
    """The repository as a .tar.gz, without caches."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        def skip(ti: tarfile.TarInfo) -> Optional[tarfile.TarInfo]:
            return None if "__pycache__" in ti.name or ti.name.endswith(".pyc") else ti

        t.add(root, arcname="repo", filter=skip)
    return buf.getvalue()


def test_modules(root: str) -> List[str]:
    return sorted(
        "tests." + f[:-3] for f in os.listdir(os.path.join(root, "tests")) if f.startswith("test_") and f.endswith(".py")
    )


def parse_unittest(output: str) -> Tuple[int, int]:
    """(tests run, failures + errors) from unittest's summary."""
    ran = re.search(r"^Ran (\d+) tests?", output, re.M)
    bad = sum(int(n) for n in re.findall(r"(?:failures|errors)=(\d+)", output))
    return (int(ran.group(1)) if ran else 0), bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", default=os.environ.get("FORKD_TEST_PY_TAG", "py-pandas"),
                    help="a snapshot with python3 (default $FORKD_TEST_PY_TAG, else py-pandas)")
    ap.add_argument("--children", "-n", type=int, default=0,
                    help="sandboxes to fork (default: one per job, i.e. modules x backends)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for each child's test run")
    args = ap.parse_args()

    client = forkd.Client()
    if not client.snapshots.exists(args.tag):
        print("no snapshot %r on %s; create one with a python3 recipe, e.g.\n"
              "  forkd snapshot create --tag py-pandas --recipe py-pandas" % (args.tag, client.endpoint), file=sys.stderr)
        return 2

    jobs: List[Job] = [(m, b) for m in test_modules(REPO) for b in BACKENDS]
    n = args.children or len(jobs)
    n = max(1, min(n, len(jobs)))
    plan: List[List[Job]] = [jobs[i::n] for i in range(n)]  # round-robin subsets
    tarball = repo_tarball(REPO)
    print("repository %s: %d test modules x %d backends = %d jobs over %d children (snapshot %s)"
          % (os.path.relpath(REPO), len(jobs) // len(BACKENDS), len(BACKENDS), len(jobs), n, args.tag))

    t_start = time.monotonic()
    t0 = time.monotonic()
    sandboxes = Sandbox.fork(args.tag, n, client=client, timeout=max(600, args.timeout * 2),
                             metadata={"recipe": "parallel_tests"})
    fork_s = time.monotonic() - t0
    print("forked %d sandboxes in %.2fs" % (n, fork_s))

    results: Dict[int, List[Tuple[Job, int, int, int, float, str]]] = {}
    errors: Dict[int, BaseException] = {}

    def child(i: int, sb: Sandbox) -> None:
        try:
            sb.files.write("/tmp/repo.tgz", tarball)
            sb.commands.run(
                ["python3", "-c", "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])",
                 "/tmp/repo.tgz", "/work"],
            )
            out = []
            for module, backend in plan[i]:
                t = time.monotonic()
                r = sb.commands.run(
                    ["python3", "-m", "unittest", "-v", module],
                    cwd="/work/repo", envs={"CALC_BACKEND": backend}, timeout=args.timeout, check=False,
                )
                ran, bad = parse_unittest(r.stderr)
                out.append(((module, backend), r.exit_code, ran, bad, time.monotonic() - t, r.stderr))
            results[i] = out
        except BaseException as e:  # noqa: BLE001 - reported below
            errors[i] = e

    threads = [threading.Thread(target=child, args=(i, sb)) for i, sb in enumerate(sandboxes)]
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        run_s = time.monotonic() - t0
        client.sandboxes.kill([sb.id for sb in sandboxes])
    total_s = time.monotonic() - t_start

    print()
    print("%-16s %-22s %-7s %5s %6s %8s" % ("child", "job", "backend", "tests", "result", "time"))
    failed: set = set()
    busy = 0.0
    ok = True
    for i, sb in enumerate(sandboxes):
        if i in errors:
            print("%-16s ERROR: %s" % (sb.id, errors[i]))
            ok = False
            continue
        for (module, backend), code, ran, bad, secs, log in results[i]:
            busy += secs
            verdict = "pass" if code == 0 else "FAIL"
            if code != 0:
                failed.add((module, backend))
            print("%-16s %-22s %-7s %5d %6s %7.2fs" % (sb.id, module, backend, ran, verdict, secs))
            if ran == 0:
                ok = False
                print("    no tests ran:\n    " + log.strip().replace("\n", "\n    "))
            if code != 0 and (module, backend) not in EXPECTED_FAILURES:
                print("    " + log.strip().replace("\n", "\n    "))
    print()
    print("fork %.2fs; upload + tests %.2fs wall, while the test runs add up to %.2fs (they overlap); total %.2fs"
          % (fork_s, run_s, busy, total_s))

    if ok and failed == EXPECTED_FAILURES:
        print("as expected: every job passed except %s" % ", ".join("%s with CALC_BACKEND=%s" % j for j in sorted(failed)))
        return 0
    print("UNEXPECTED: failed jobs %s, expected %s" % (sorted(failed), sorted(EXPECTED_FAILURES)), file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
