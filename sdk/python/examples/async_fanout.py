#!/usr/bin/env python3
"""Fork 20 sandboxes from one snapshot and run a command in each, at once,
with asyncio.gather; print a summary.

    python3 examples/async_fanout.py TAG [N]

Needs a forkd daemon (FORKD_SOCKET, or FORKD_HOST and FORKD_TOKEN) and a
snapshot TAG (for example ``forkd snapshot create --tag py --recipe python``).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from forkd import AsyncClient, AsyncSandbox, CommandResult, ForkdError  # noqa: E402


async def work(sb: AsyncSandbox, i: int) -> "tuple[float, CommandResult]":
    t0 = time.perf_counter()
    r = await sb.commands.run("echo job-%d on $(hostname); head -c 1000000 /dev/urandom | md5sum" % i, timeout=60)
    return (time.perf_counter() - t0) * 1000, r


async def main(tag: str, n: int) -> int:
    async with AsyncClient() as client:
        t0 = time.perf_counter()
        sandboxes = await AsyncSandbox.fork(tag, n, client=client, timeout=300, metadata={"example": "async_fanout"})
        fork_ms = (time.perf_counter() - t0) * 1000
        try:
            t1 = time.perf_counter()
            outcomes = await asyncio.gather(*(work(sb, i) for i, sb in enumerate(sandboxes)), return_exceptions=True)
            run_ms = (time.perf_counter() - t1) * 1000
        finally:
            await client.sandboxes.kill(sb.id for sb in sandboxes)
    ok = [o for o in outcomes if not isinstance(o, BaseException)]
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    for sb, o in zip(sandboxes, outcomes):
        line = ("error: %s" % o) if isinstance(o, BaseException) else o[1].stdout.splitlines()[0]
        print("%-28s %s" % (sb.id, line))
    lat = sorted(ms for ms, _ in ok)
    print()
    print("forked %d sandboxes from %r in %.0f ms (one request)" % (n, tag, fork_ms))
    print("ran %d commands concurrently in %.0f ms: %d ok, %d failed" % (n, run_ms, len(ok), len(failed)))
    if lat:
        print("command latency ms: min %.0f  median %.0f  max %.0f" % (lat[0], statistics.median(lat), lat[-1]))
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    try:
        sys.exit(asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20)))
    except ForkdError as e:
        print("forkd: %s" % e, file=sys.stderr)
        sys.exit(1)
