#!/usr/bin/env python3
"""A typical E2B code-interpreter script, ported to forkd.

It creates a sandbox, uploads a CSV, analyses it with pandas, draws a bar
chart, runs a shell command and kills the sandbox; then it checks what came
back against the same numbers computed here, and exits non-zero if anything
differs. docs/E2B.md maps every call; what changed from the E2B version:

- ``from e2b_code_interpreter import Sandbox`` -> ``from forkd import
  Sandbox``. No E2B_API_KEY: the SDK talks to the local daemon's socket, or
  to FORKD_HOST with FORKD_TOKEN.
- ``Sandbox.create()`` -> ``Sandbox.create("py-pandas")``: a snapshot tag
  (built once from recipes/py-pandas.toml) replaces E2B's default template
  code-interpreter-v1. The lifetime is 300 s by default in both.
- ``/home/user/sales.csv`` -> ``/root/sales.csv``: forkd runs commands and
  code as root (HOME=/root), E2B as ``user``.
- ``on_stdout=lambda msg: print(msg.line)`` -> ``lambda text: ...``: the
  callback gets text, not an OutputMessage. forkd's Python SDK has no
  ``on_result``, so the results are read from ``execution.results`` after
  the call.
- ``result.chart`` (E2B's data extracted from the figure) does not exist:
  the code prints the plotted numbers as JSON. The figure arrives as
  ``result.png`` (base64 in both), and ``png_bytes()`` decodes it.
- ``commands.run("ls -l /home/user")`` runs through /bin/sh (not bash -l)
  and has no default limit in forkd's Python SDK (E2B: 60 s), so the
  timeout is passed.
- ``sbx.kill()`` is unchanged.

    forkd snapshot create --tag py-pandas --recipe py-pandas   # once, a few minutes
    python3 recipes/agents/e2b_code_interpreter_port.py [--chart chart.png]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "sdk", "python"))

import forkd  # noqa: E402
from forkd import Sandbox  # noqa: E402

REGIONS = ["north", "south", "east", "west"]
CSV_PATH = "/root/sales.csv"

# The cell an E2B user would send. pandas and matplotlib are already
# imported in py-pandas's warm session; importing them again costs nothing.
ANALYSIS = """
import json
import pandas as pd
import matplotlib.pyplot as plt

df = pd.read_csv("%s")
df["revenue_cents"] = df["units"] * df["price_cents"]
by_region = df.groupby("region")["revenue_cents"].sum().sort_index()
print(json.dumps({"rows": int(len(df)), "revenue_cents": {r: int(v) for r, v in by_region.items()}}))

fig, ax = plt.subplots(figsize=(6, 4))
(by_region / 100).plot.bar(ax=ax, title="Revenue by region")
ax.set_ylabel("revenue")
by_region.to_frame()
""" % CSV_PATH

Row = Tuple[str, int, int]


def make_sales(rows: int, seed: int) -> List[Row]:
    rnd = random.Random(seed)
    return [(rnd.choice(REGIONS), rnd.randint(1, 9), rnd.randint(100, 9999)) for _ in range(rows)]


def to_csv(rows: List[Row]) -> str:
    buf = io.StringIO()
    buf.write("region,units,price_cents\n")
    for r in rows:
        buf.write("%s,%d,%d\n" % r)
    return buf.getvalue()


def revenue_by_region(rows: List[Row]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for region, units, price in rows:
        out[region] = out.get(region, 0) + units * price
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", default="py-pandas", help="snapshot with pandas and matplotlib (default py-pandas)")
    ap.add_argument("--rows", type=int, default=500, help="rows of the generated CSV (default 500)")
    ap.add_argument("--seed", type=int, default=11, help="dataset seed (default 11)")
    ap.add_argument("--chart", metavar="PNG", help="also save the chart to this file")
    args = ap.parse_args()
    if args.rows < 1:
        ap.error("--rows must be at least 1")

    client = forkd.Client()
    if not client.snapshots.exists(args.tag):
        print("no snapshot %r on %s; create it (a few minutes the first time) with\n"
              "  forkd snapshot create --tag %s --recipe py-pandas" % (args.tag, client.endpoint, args.tag),
              file=sys.stderr)
        return 2

    sales = make_sales(args.rows, args.seed)
    problems: List[str] = []

    sbx = Sandbox.create(args.tag, client=client)
    try:
        print("sandbox %s from %s" % (sbx.sandbox_id, args.tag))
        sbx.files.write(CSV_PATH, to_csv(sales))

        execution = sbx.run_code(ANALYSIS, timeout=300,
                                 on_stdout=lambda text: sys.stdout.write("[sandbox stdout] " + text),
                                 on_stderr=lambda text: sys.stderr.write("[sandbox stderr] " + text))
        if execution.error:
            print("the analysis raised %s: %s\n%s" % (execution.error.name, execution.error.value,
                                                     execution.error.traceback), file=sys.stderr)
            return 1

        for result in execution.results:
            print("result: formats %s%s" % (result.formats(), " (main)" if result.is_main_result else ""))
        charts = [r for r in execution.results if r.png]
        if not charts:
            problems.append("no chart among the results")
        else:
            png = charts[0].png_bytes() or b""
            if not png.startswith(b"\x89PNG\r\n\x1a\n"):
                problems.append("the chart is not a PNG")
            print("chart: %d bytes of PNG" % len(png))
            if args.chart:
                with open(args.chart, "wb") as f:
                    f.write(png)
                print("saved to %s" % args.chart)
        table = execution.main_result
        if table is None or not table.html or "<table" not in table.html:
            problems.append("the main result is not the DataFrame's HTML table")

        got = json.loads(execution.logs.stdout_text)
        want = revenue_by_region(sales)
        if got["rows"] != len(sales) or got["revenue_cents"] != want:
            problems.append("sandbox numbers %r differ from the local ones %r" % (got, want))
        for region in sorted(want):
            print("  %-6s %12.2f" % (region, want[region] / 100))

        ls = sbx.commands.run("ls -l /root && wc -l < %s" % CSV_PATH, timeout=60)
        print(ls.stdout, end="")
        if "sales.csv" not in ls.stdout or ls.stdout.split()[-1] != str(len(sales) + 1):
            problems.append("ls/wc did not show the CSV with %d lines" % (len(sales) + 1))
    finally:
        sbx.kill()

    if sbx.is_running():
        problems.append("sandbox %s still runs after kill" % sbx.sandbox_id)
    for p in problems:
        print("FAILED: " + p, file=sys.stderr)
    if problems:
        return 1
    print("ok: pandas numbers match, chart and table returned, sandbox killed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
