#!/usr/bin/env python3
"""Fan a pandas analysis out over 20 forked code interpreters.

A dataset of orders is generated deterministically here, cut into one
slice per child, and each slice uploaded into its own sandbox forked from a
snapshot whose Python session already imported pandas (recipe py-pandas).
Every child analyses its slice with pandas in its warm session (revenue,
orders and units per region and product; its last expression is a
DataFrame, which comes back as an HTML result too), then the recipe merges
the partial aggregates, checks them against the same computation done
locally in plain Python, and prints the results and the timings.

Exits non-zero if a child failed or the merged numbers do not match.

    forkd snapshot create --tag py-pandas --recipe py-pandas   # once, a few minutes
    python3 recipes/agents/code_interpreter_fanout.py
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import sys
import threading
import time
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "sdk", "python"))

import forkd  # noqa: E402
from forkd import Sandbox  # noqa: E402

REGIONS = ["north", "south", "east", "west", "central"]
PRODUCTS = ["apple", "banana", "cherry", "durian", "elderberry", "fig", "grape"]
COLUMNS = ["order_id", "day", "region", "product", "units", "price_cents"]

Row = Tuple[int, int, str, str, int, int]

# Runs in each child's warm session: `pd` was imported when the snapshot was made.
ANALYSIS = """
import json as _json, time as _time
_t = _time.perf_counter()
df = pd.read_csv('/tmp/slice.csv')
df['revenue_cents'] = df['units'] * df['price_cents']
by_region = df.groupby('region').agg(orders=('order_id', 'size'), units=('units', 'sum'),
                                     revenue_cents=('revenue_cents', 'sum'))
by_product = df.groupby('product')['revenue_cents'].sum()
_out = {
    'rows': int(len(df)),
    'by_region': {r: {k: int(v) for k, v in row.items()} for r, row in by_region.iterrows()},
    'by_product': {p: int(v) for p, v in by_product.items()},
    'biggest_order_cents': int(df['revenue_cents'].max()),
    'pandas': pd.__version__,
    'compute_ms': (_time.perf_counter() - _t) * 1000,
}
print(_json.dumps(_out))
by_region
"""


def make_dataset(rows: int, seed: int) -> List[Row]:
    rnd = random.Random(seed)
    return [
        (i, rnd.randint(1, 365), rnd.choice(REGIONS), rnd.choice(PRODUCTS), rnd.randint(1, 20), rnd.randint(50, 5000))
        for i in range(rows)
    ]


def to_csv(rows: List[Row]) -> bytes:
    buf = io.StringIO()
    buf.write(",".join(COLUMNS) + "\n")
    for r in rows:
        buf.write("%d,%d,%s,%s,%d,%d\n" % r)
    return buf.getvalue().encode()


def local_aggregate(rows: List[Row]) -> Dict[str, Any]:
    by_region: Dict[str, Dict[str, int]] = {}
    by_product: Dict[str, int] = {}
    for _, _, region, product, units, price in rows:
        r = by_region.setdefault(region, {"orders": 0, "units": 0, "revenue_cents": 0})
        r["orders"] += 1
        r["units"] += units
        r["revenue_cents"] += units * price
        by_product[product] = by_product.get(product, 0) + units * price
    return {"rows": len(rows), "by_region": by_region, "by_product": by_product,
            "biggest_order_cents": max(u * p for _, _, _, _, u, p in rows)}


def merge(parts: List[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"rows": 0, "by_region": {}, "by_product": {}, "biggest_order_cents": 0}
    for p in parts:
        out["rows"] += p["rows"]
        out["biggest_order_cents"] = max(out["biggest_order_cents"], p["biggest_order_cents"])
        for region, vals in p["by_region"].items():
            acc = out["by_region"].setdefault(region, {"orders": 0, "units": 0, "revenue_cents": 0})
            for k, v in vals.items():
                acc[k] += v
        for product, v in p["by_product"].items():
            out["by_product"][product] = out["by_product"].get(product, 0) + v
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tag", default="py-pandas", help="snapshot with pandas warmed (default py-pandas)")
    ap.add_argument("--children", "-n", type=int, default=20, help="sandboxes to fan out to (default 20)")
    ap.add_argument("--rows", type=int, default=100_000, help="rows in the whole dataset (default 100000)")
    ap.add_argument("--seed", type=int, default=7, help="dataset seed (default 7)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds for each child's analysis")
    args = ap.parse_args()
    if args.children < 1 or args.rows < args.children:
        ap.error("need --children >= 1 and --rows >= --children")

    client = forkd.Client()
    if not client.snapshots.exists(args.tag):
        print("no snapshot %r on %s; create it (a few minutes the first time) with\n"
              "  forkd snapshot create --tag %s --recipe py-pandas" % (args.tag, client.endpoint, args.tag), file=sys.stderr)
        return 2

    t_start = time.monotonic()
    data = make_dataset(args.rows, args.seed)
    n = args.children
    size = -(-len(data) // n)
    slices = [data[i * size:(i + 1) * size] for i in range(n)]
    payloads = [to_csv(s) for s in slices]
    print("dataset: %d orders (seed %d), %d slices of ~%d rows, %.1f MB of CSV"
          % (len(data), args.seed, n, size, sum(map(len, payloads)) / 1e6))

    t0 = time.monotonic()
    children = Sandbox.fork(args.tag, n, client=client, timeout=max(900, args.timeout * 2),
                            metadata={"recipe": "code_interpreter_fanout"})
    fork_s = time.monotonic() - t0
    print("forked %d children from %s in %.2fs" % (n, args.tag, fork_s))

    results: Dict[int, Dict[str, Any]] = {}
    errors: Dict[int, str] = {}
    timing: Dict[int, Tuple[float, float]] = {}
    html_ok: Dict[int, bool] = {}

    def work(i: int, sb: Sandbox) -> None:
        try:
            t = time.monotonic()
            sb.files.write("/tmp/slice.csv", payloads[i])
            up = time.monotonic() - t
            t = time.monotonic()
            ex = sb.run_code(ANALYSIS, timeout=args.timeout)
            rt = time.monotonic() - t
            if ex.error:
                errors[i] = "%s: %s\n%s" % (ex.error.name, ex.error.value, ex.error.traceback)
                return
            results[i] = json.loads(ex.logs.stdout_text)
            timing[i] = (up, rt)
            main_result = ex.main_result
            html_ok[i] = bool(main_result and main_result.html and "<table" in main_result.html)
        except forkd.ForkdError as e:
            errors[i] = str(e)

    threads = [threading.Thread(target=work, args=(i, sb)) for i, sb in enumerate(children)]
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        work_s = time.monotonic() - t0
        client.sandboxes.kill([sb.id for sb in children])

    print()
    print("%-16s %7s %14s %11s %10s %12s" % ("child", "rows", "revenue", "upload ms", "pandas ms", "run_code ms"))
    for i, sb in enumerate(children):
        if i in errors:
            print("%-16s FAILED: %s" % (sb.id, errors[i]))
            continue
        r = results[i]
        rev = sum(v["revenue_cents"] for v in r["by_region"].values())
        up, rt = timing[i]
        print("%-16s %7d %14s %11.0f %10.1f %12.0f" % (sb.id, r["rows"], "%.2f" % (rev / 100), up * 1000, r["compute_ms"], rt * 1000))

    problems: List[str] = ["child %s failed" % children[i].id for i in sorted(errors)]
    if not problems:
        merged = merge([results[i] for i in range(n)])
        want = local_aggregate(data)
        print()
        print("%-10s %8s %9s %16s" % ("region", "orders", "units", "revenue"))
        for region in sorted(merged["by_region"]):
            v = merged["by_region"][region]
            print("%-10s %8d %9d %16s" % (region, v["orders"], v["units"], "%.2f" % (v["revenue_cents"] / 100)))
        total = sum(v["revenue_cents"] for v in merged["by_region"].values())
        print("%-10s %8d %9d %16s" % ("total", merged["rows"], sum(v["units"] for v in merged["by_region"].values()),
                                       "%.2f" % (total / 100)))
        top = sorted(merged["by_product"].items(), key=lambda kv: -kv[1])[:3]
        print("top products: " + ", ".join("%s %.2f" % (p, v / 100) for p, v in top))
        print("biggest order: %.2f; pandas %s in every child: %s"
              % (merged["biggest_order_cents"] / 100, results[0]["pandas"],
                 len({r["pandas"] for r in results.values()}) == 1))
        if merged != want:
            problems.append("merged aggregates differ from the local computation")
        else:
            print("merged aggregates match the local plain-Python computation exactly")
        if not all(html_ok.values()):
            problems.append("a child's DataFrame result had no text/html")

    busy = sum(rt for _, rt in timing.values())
    print()
    print("timings: fork %.2fs for %d children; upload+analysis %.2fs wall, while the children's run_code calls "
          "add up to %.2fs (they overlap); end to end %.2fs" % (fork_s, n, work_s, busy, time.monotonic() - t_start))
    if problems:
        for p in problems:
            print("PROBLEM: " + p, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
