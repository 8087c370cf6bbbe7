#!/usr/bin/env python3
"""The suite's verdicts (scripts/lib/bench_tables.py) on hand-made figures: "as fast as
free_fence:none" counts the default as slower only when every repeat of it was slower than the
median of free_fence:none's repeats; aggregate() keeps each cell's range of medians."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "scripts", "lib"))
import bench_tables  # noqa: E402


def cell(median, low, high):
    return {"median_ns": median, "median_ns_range": (low, high)}


def main():
    failures = []

    def check(what, got, want_prefix):
        if not got.startswith(want_prefix):
            failures.append(f"{what}: got {got!r}, want {want_prefix!r}...")

    check("faster median", bench_tables._as_fast(cell(100, 98, 103), cell(101, 99, 104)), "met")
    check("slower median, fastest repeat as fast as the other's median",
          bench_tables._as_fast(cell(103, 100, 105), cell(101, 99, 102)),
          "met: within the repeats' spread (the default's repeats 100 to 105 ns)")
    check("every repeat slower than the other's median, one outlier of it slower still",
          bench_tables._as_fast(cell(110, 108, 112), cell(100, 99, 115)), "missed: 1.10× slower")
    check("one repeat each, slower", bench_tables._as_fast(cell(101, 101, 101), cell(100, 100, 100)),
          "missed: 1.01× slower")

    # aggregate() records each cell's range of medians over its successful repeats.
    runs = [{"trace": "t", "allocator": "a", "status": "ok", "median_ns": m,
             "peak_reserved_bytes": 2, "peak_live_bytes": 1} for m in (120, 100, 140)]
    runs.append({"trace": "t", "allocator": "a", "status": "failed", "error": "x"})
    got = bench_tables.aggregate(runs, [{"name": "t"}], ["a"])["t"]["a"]
    if got["median_ns"] != 120 or got["median_ns_range"] != (100, 140):
        failures.append(f"aggregate: median {got['median_ns']}, range {got['median_ns_range']}")

    for f in failures:
        print("FAIL", f)
    print(f"{4 + 1 - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
