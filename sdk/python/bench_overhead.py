#!/usr/bin/env python3
"""Measure the SDK's overhead on ``commands.run("true")``.

Forks one sandbox, then times, interleaved (alternating which goes first),
the SDK call and the same HTTP request sent with bare ``http.client`` over
its own keep-alive connection to the same daemon: ``POST
/v1/sandboxes/{id}/exec`` with ``X-Forkd-Exec: {"shell":"true"}``, the
NDJSON answer read to its end. Prints p50/p90 of both, the difference of
the medians and the median of the paired differences.

    eval "$(scripts/sdk-test-env.sh start py)"
    python3 sdk/python/bench_overhead.py --tag "$FORKD_TEST_TAG" -n 300

Connection settings come from the environment as for the SDK
(FORKD_SOCKET, FORKD_HOST, FORKD_TOKEN, FORKD_CA_CERT).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import forkd  # noqa: E402
from forkd._http import Endpoint  # noqa: E402


def pct(xs: List[float], p: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", default=os.environ.get("FORKD_TEST_TAG", "minimal"), help="snapshot to fork (default $FORKD_TEST_TAG)")
    ap.add_argument("-n", type=int, default=300, help="measured pairs (default 300)")
    ap.add_argument("--warmup", type=int, default=30, help="unmeasured pairs first (default 30)")
    args = ap.parse_args()
    if args.n < 1:
        ap.error("-n must be >= 1")

    client = forkd.Client()
    ep = Endpoint()  # the same settings the client resolved
    sb = forkd.Sandbox.create(args.tag, client=client)
    try:
        raw = ep.new_connection(None)
        path = "/v1/sandboxes/%s/exec" % sb.id
        headers = {
            "X-Forkd-Exec": json.dumps({"shell": "true"}, separators=(",", ":")),
            "Accept": "application/x-ndjson",
            "Content-Length": "0",
        }
        if ep.token:
            headers["Authorization"] = "Bearer " + ep.token

        def run_raw() -> None:
            raw.request("POST", path, headers=headers)
            r = raw.getresponse()
            body = r.read()
            if r.status != 200 or b'"exit"' not in body:
                raise SystemExit("raw request failed: %d %r" % (r.status, body[:200]))

        def run_sdk() -> None:
            sb.commands.run("true")

        sdk_ms: List[float] = []
        raw_ms: List[float] = []
        clock = time.perf_counter
        for i in range(args.warmup + args.n):
            order = (run_sdk, run_raw) if i % 2 == 0 else (run_raw, run_sdk)
            for fn in order:
                t0 = clock()
                fn()
                dt = (clock() - t0) * 1000.0
                if i >= args.warmup:
                    (sdk_ms if fn is run_sdk else raw_ms).append(dt)
        raw.close()
    finally:
        sb.kill()

    diffs = [a - b for a, b in zip(sdk_ms, raw_ms)]
    print("forkd SDK overhead: commands.run('true') vs raw http.client, %d interleaved pairs after %d warm-up, %s"
          % (args.n, args.warmup, client.endpoint))
    print("python %s" % sys.version.split()[0])
    print("%-10s %9s %9s %9s" % ("", "p50 ms", "p90 ms", "mean ms"))
    for name, xs in (("sdk", sdk_ms), ("raw", raw_ms)):
        print("%-10s %9.3f %9.3f %9.3f" % (name, pct(xs, 0.5), pct(xs, 0.9), statistics.mean(xs)))
    print("p50 difference (sdk - raw): %.3f ms" % (pct(sdk_ms, 0.5) - pct(raw_ms, 0.5)))
    print("median of paired differences: %.3f ms (p90 %.3f ms)" % (pct(diffs, 0.5), pct(diffs, 0.9)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
